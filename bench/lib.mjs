// Shared by the benchmarks: command-line flags, the median, a child's output line by line, server processes and
// their ports (the side-by-side ones: compare, speculative, llm-serving-tests), and (for the engine-level
// ones: sample-many, slot-order, decode-floor) Keel's llama.cpp adapter opened as the engine opens it (1 thread, F16
// KV, flash attention off). Needs dist/ for the adapter.
import http from "node:http";
import net from "node:net";
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

/** Signal a process's whole group (servers are started `detached`: Keel's engine child goes too); gone is fine. */
export function killGroup(proc, sig) {
  try {
    process.kill(-proc.pid, sig);
  } catch {
    /* already gone */
  }
}

let serverSet = null;
/**
 * The set of server processes still running, each killed (its group, SIGKILL) when this script exits whatever
 * happens; SIGINT/SIGTERM exit with 130 so that runs. Add a process once it is spawned, delete it once stopped.
 */
export function serverGroups() {
  if (serverSet) return serverSet;
  const live = (serverSet = new Set());
  process.on("exit", () => {
    for (const p of live) killGroup(p, "SIGKILL");
  });
  for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(130));
  return live;
}

/** A TCP port free on 127.0.0.1 right now. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on("error", reject);
  });
}

/** GET a path on 127.0.0.1: { status, body } (status 0 when the server cannot be reached). */
export function httpGet(port, p) {
  return new Promise((resolve) => {
    http
      .get({ host: "127.0.0.1", port, path: p, agent: false }, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (d) => (body += d));
        res.on("end", () => resolve({ status: res.statusCode, body }));
      })
      .on("error", () => resolve({ status: 0, body: "" }));
  });
}

/**
 * Follow a spawned server until `isReady()` (polled every `everyMs`) says it is up: its last `keepLines` output lines
 * are kept for the error when it exits first or is not ready within 300 s.
 */
export async function waitReady(proc, name, isReady, { everyMs = 100, keepLines = 20 } = {}) {
  const tail = [];
  const keep = (l) => {
    tail.push(l);
    if (tail.length > keepLines) tail.shift();
  };
  lines(proc.stdout, keep);
  lines(proc.stderr, keep);
  let exited = false;
  proc.once("exit", () => (exited = true));
  for (const end = Date.now() + 300_000; Date.now() < end; await new Promise((r) => setTimeout(r, everyMs))) {
    if (exited) throw new Error(`${name} exited before ready:\n${tail.join("\n")}`);
    if (await isReady()) return;
  }
  throw new Error(`${name} not ready after 300 s:\n${tail.join("\n")}`);
}
