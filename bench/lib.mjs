// Shared by the benchmarks: command-line flags, the median, a child's output line by line, and (for the engine-level
// ones: sample-many, slot-order, decode-floor) Keel's llama.cpp adapter opened as the engine opens it (1 thread, F16
// KV, flash attention off). Needs dist/ for the adapter.
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root. */
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/** The value after `--name` on the command line, or `def`. */
export function arg(name, def) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1] : def;
}

/** Median of a list of numbers (the upper one of an even count). */
export function median(values) {
  return [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
}

/** `--model PATH`, else the embedded default model (built once). */
export async function benchModel() {
  const { ensureDefaultModel } = await import(path.join(ROOT, "dist/model/default-model.js"));
  return arg("model", null) ?? (await ensureDefaultModel());
}

/** A LlamaAdapter on `modelPath` with `sequences` slots of `contextSize` tokens each (`threads`: ggml's and sampleMany's). */
export async function openAdapter(modelPath, { sequences, contextSize, batchSize = 256, gpu = "cpu", threads = 1 }) {
  const { LlamaAdapter } = await import(path.join(ROOT, "dist/engine/llama/adapter.js"));
  return LlamaAdapter.open({ modelPath, sequences, contextSize, batchSize, threads, flashAttention: false, kvCacheType: "f16", gpu });
}

/** Call `onLine` with every complete line `stream` emits (a child process's stdout or stderr). */
export function lines(stream, onLine) {
  let buf = "";
  stream.setEncoding("utf8");
  stream.on("data", (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      onLine(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
  });
}

/**
 * n OpenAI function tools of 5 parameters each (the first is get_weather), as a chat request sends them: the tool set
 * of the guided-generation benchmarks (guided.mjs over HTTP, vocab.mjs straight into buildGuide).
 */
export function benchTools(n) {
  return Array.from({ length: n }, (_, i) => ({
    type: "function",
    function: {
      name: i === 0 ? "get_weather" : `tool_${i}`,
      description: i === 0 ? "Current weather for a city" : `Utility number ${i}`,
      parameters: {
        type: "object",
        properties: {
          city: { type: "string" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
          days: { type: "integer", minimum: 1, maximum: 14 },
          detailed: { type: "boolean" },
          note: { type: "string", maxLength: 40 },
        },
        required: ["city"],
      },
    },
  }));
}
