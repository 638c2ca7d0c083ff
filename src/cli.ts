/**
 * `keel` command line: `keel serve [flags]` (OVMS-style flag names), `keel make-model`.
 *
 * An unknown flag or a bad value exits with code 2 and a clear message; `--help` lists every flag with its default.
 */
import { spawn } from "node:child_process";
import { parseArgs } from "node:util";
import { ENGINE_MAIN } from "./gateway/engine-client.js";
import { startGateway } from "./gateway/server.js";
import { DEFAULT_MODEL_NAME, ensureDefaultModel } from "./model/default-model.js";
import type { EngineConfig } from "./engine/main.js";
import type { ModelMetadata } from "./protocol/messages.js";
import path from "node:path";

/** One `keel serve` flag. */
interface FlagSpec {
  name: string;
  help: string;
  default: string | undefined;
  /** Parse and check the value; throw Error with a message naming the flag. */
  parse?: (v: string) => unknown;
}

const int = (name: string, min: number, max = Number.MAX_SAFE_INTEGER) => (v: string): number => {
  const n = Number(v);
  if (!/^-?\d+$/.test(v.trim()) || !Number.isSafeInteger(n) || n < min || n > max) {
    throw new Error(`--${name} must be an integer between ${min} and ${max}, got "${v}"`);
  }
  return n;
};
const gb = (name: string) => (v: string): number => {
  const n = Number(v);
  if (v.trim() === "" || !Number.isFinite(n) || n < 0 || n > 1 << 20) throw new Error(`--${name} must be a number of GB >= 0, got "${v}"`);
  return n;
};
const oneOf = (name: string, values: string[]) => (v: string): string => {
  if (!values.includes(v)) throw new Error(`--${name} must be one of ${values.join(", ")}, got "${v}"`);
  return v;
};
const bool = (name: string) => (v: string): boolean => {
  if (v !== "true" && v !== "false") throw new Error(`--${name} must be true or false, got "${v}"`);
  return v === "true";
};

/** Every `keel serve` flag with its default. */
export const SERVE_FLAGS: FlagSpec[] = [
  { name: "rest_port", help: "HTTP port", default: "8000", parse: int("rest_port", 0, 65535) },
  { name: "rest_bind_address", help: "HTTP bind address", default: "0.0.0.0" },
  { name: "model_path", help: "GGUF model file (default: the embedded random-weight demo model)", default: undefined },
  { name: "model_name", help: "served model name (default: keel-tiny, or the model file's base name)", default: undefined },
  { name: "max_num_seqs", help: "sequences decoded together (KV slots)", default: "8", parse: int("max_num_seqs", 1, 256) },
  { name: "max_num_batched_tokens", help: "token budget of one engine step (>= max_num_seqs)", default: "256", parse: int("max_num_batched_tokens", 1, 65536) },
  { name: "max_model_len", help: "tokens per sequence (default: min(model's trained context, 4096))", default: undefined, parse: int("max_model_len", 2, 1 << 20) },
  { name: "engine_threads", help: "CPU threads of the engine (1 measured best on a 2-core machine; bench/threads.mjs)", default: "1", parse: int("engine_threads", 1, 512) },
  { name: "target_device", help: "CPU, or AUTO/GPU to let llama.cpp use a prebuilt GPU backend", default: "CPU", parse: oneOf("target_device", ["CPU", "AUTO", "GPU"]) },
  { name: "max_queued_requests", help: "requests allowed to wait for a sequence; beyond it 429 with Retry-After", default: "256", parse: int("max_queued_requests", 0, 1_000_000) },
  { name: "enable_prefix_caching", help: "keep finished requests' KV and reuse the longest common prefix", default: "true", parse: bool("enable_prefix_caching") },
  { name: "kv_cache_precision", help: "KV cache precision: f16, or u8 (q8_0 K and V, with flash attention)", default: "f16", parse: oneOf("kv_cache_precision", ["f16", "u8"]) },
  { name: "cache_size", help: "KV cache budget in GB (10^9 bytes) over all sequences (fractions allowed); 0 = max_model_len per sequence", default: "0", parse: gb("cache_size") },
  { name: "engine_stall_timeout", help: "seconds without engine progress while there is work before the engine is restarted", default: "30", parse: int("engine_stall_timeout", 1, 86_400) },
  { name: "shutdown_timeout", help: "seconds in-flight requests may take to finish after SIGTERM/SIGINT", default: "30", parse: int("shutdown_timeout", 0, 86_400) },
  { name: "log_level", help: "DEBUG, INFO, WARNING or ERROR", default: "INFO", parse: oneOf("log_level", ["DEBUG", "INFO", "WARNING", "ERROR"]) },
  { name: "request_timeout", help: "seconds a client may take to send its whole request (headers and body) before it is dropped", default: "30", parse: int("request_timeout", 1, 3600) },
  { name: "max_stream_buffer", help: "bytes of stream output a client may leave unread before it is treated as disconnected", default: String(1024 * 1024), parse: int("max_stream_buffer", 1024) },
  { name: "max_request_body", help: "request body limit in bytes", default: String(8 * 1024 * 1024), parse: int("max_request_body", 1024) },
  { name: "flash_attention", help: "flash attention in llama.cpp (off: the embedded model's greedy output does not depend on batching)", default: "false", parse: bool("flash_attention") },
];

function usage(): string {
  const lines = ["Usage: keel serve [--flag value ...]", "", "Flags:"];
  for (const f of SERVE_FLAGS) lines.push(`  --${f.name.padEnd(24)} ${f.help}${f.default !== undefined ? ` (default: ${f.default})` : ""}`);
  lines.push("", "Other commands:", "  keel make-model --out FILE [options]   write a tiny random-weight GGUF (see --help there)");
  return lines.join("\n");
}

/** Parse `keel serve` flags. @throws Error with a user-facing message. */
export function parseServeFlags(argv: string[]): Record<string, unknown> {
  const options = Object.fromEntries([...SERVE_FLAGS.map((f) => [f.name, { type: "string" as const }]), ["help", { type: "boolean" as const, short: "h" }]]);
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs({ args: argv, options, strict: true, allowPositionals: true });
  } catch (err) {
    const e = err as { code?: string; message: string };
    const flag = /'(-[^']+)'/.exec(e.message)?.[1];
    if (e.code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") throw new Error(`unknown flag ${flag ?? ""}`.trim());
    if (e.code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE") throw new Error(`flag ${flag ?? ""} needs a value`.replace("  ", " "));
    throw err;
  }
  const values = parsed.values as Record<string, string | boolean | undefined>;
  const positionals = parsed.positionals;
  if (positionals.length > 0) throw new Error(`unexpected argument "${positionals[0]}"`);
  if (values["help"]) return { help: true };
  const out: Record<string, unknown> = {};
  for (const f of SERVE_FLAGS) {
    const raw = (values[f.name] as string | undefined) ?? f.default;
    out[f.name] = raw === undefined ? undefined : f.parse ? f.parse(raw) : raw;
  }
  if ((out["max_num_batched_tokens"] as number) < (out["max_num_seqs"] as number)) {
    throw new Error(`--max_num_batched_tokens (${out["max_num_batched_tokens"]}) must be >= --max_num_seqs (${out["max_num_seqs"]})`);
  }
  return out;
}

/**
 * Load the model in a throwaway child: a model that makes llama.cpp abort (GGML_ASSERT) kills only that child.
 * @returns the model metadata. @throws Error with the child's last log line when it fails.
 */
export async function validateModel(config: Omit<EngineConfig, "mode">): Promise<ModelMetadata> {
  const child = spawn(process.execPath, [ENGINE_MAIN, JSON.stringify({ ...config, mode: "validate" })], { stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
  child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => child.on("exit", (c, s) => resolve([c, s])));
  if (code === 0) {
    const line = stdout.trim().split("\n").pop() ?? "";
    return (JSON.parse(line) as { metadata: ModelMetadata }).metadata;
  }
  const detail = stderr
    .trim()
    .split("\n")
    .map((l) => {
      try {
        return (JSON.parse(l) as { msg?: string }).msg ?? l;
      } catch {
        return l;
      }
    })
    .filter((l) => l.trim())
    .slice(-3)
    .join(" | ");
  throw new Error(`the model ${config.modelPath} cannot be loaded (engine ${signal ? `killed by ${signal}` : `exit code ${code}`}): ${detail || "no message"}`);
}

async function serve(argv: string[]): Promise<void> {
  let flags: Record<string, unknown>;
  try {
    flags = parseServeFlags(argv);
  } catch (err) {
    process.stderr.write(`keel serve: ${(err as Error).message}\n\n${usage()}\n`);
    process.exit(2);
  }
  if (flags["help"]) {
    process.stdout.write(usage() + "\n");
    return;
  }
  const demo = flags["model_path"] === undefined;
  const modelPath = demo ? await ensureDefaultModel() : path.resolve(flags["model_path"] as string);
  const maxNumSeqs = flags["max_num_seqs"] as number;
  const u8 = flags["kv_cache_precision"] === "u8";
  const base = {
    modelPath,
    sequences: maxNumSeqs,
    batchSize: flags["max_num_batched_tokens"] as number,
    threads: flags["engine_threads"] as number,
    // A quantized V cache needs flash attention in llama.cpp (docs/upstream.md).
    flashAttention: u8 ? true : (flags["flash_attention"] as boolean),
    kvCacheType: u8 ? ("q8_0" as const) : ("f16" as const),
    prefixCaching: flags["enable_prefix_caching"] as boolean,
    gpu: (flags["target_device"] === "CPU" ? "cpu" : "auto") as "cpu" | "auto",
    maxNumSeqs,
    maxNumBatchedTokens: flags["max_num_batched_tokens"] as number,
  };
  let meta: ModelMetadata;
  try {
    meta = await validateModel({ ...base, contextSize: 256, maxModelLen: 256 });
  } catch (err) {
    process.stderr.write(`keel serve: ${(err as Error).message}\n`);
    process.exit(1);
  }
  if ((flags["max_model_len"] as number | undefined) !== undefined && (flags["max_model_len"] as number) > meta.trainContextSize) {
    // As vLLM: a context longer than the model was trained for gives garbage and costs memory.
    process.stderr.write(`keel serve: --max_model_len ${flags["max_model_len"]} exceeds the model's trained context of ${meta.trainContextSize} tokens\n`);
    process.exit(2);
  }
  let maxModelLen = (flags["max_model_len"] as number | undefined) ?? Math.min(meta.trainContextSize, 4096);
  const cacheGb = flags["cache_size"] as number;
  let capacityNote = "max_model_len";
  if (cacheGb > 0) {
    // Split the KV budget evenly across sequences (node-llama-cpp gives each sequence its own KV partition).
    const bytesPerElement = u8 ? 34 / 32 : 2; // q8_0 blocks: 32 values in 34 bytes
    if (meta.kvElementsPerToken === null) {
      process.stderr.write("keel serve: --cache_size needs the model's KV shape, which its GGUF metadata does not give\n");
      process.exit(2);
    }
    const bytesPerToken = meta.kvElementsPerToken * bytesPerElement;
    const perSequence = Math.floor((cacheGb * 1e9) / maxNumSeqs / bytesPerToken);
    if (perSequence < 16) {
      process.stderr.write(`keel serve: --cache_size ${cacheGb} GB gives ${perSequence} tokens per sequence for ${maxNumSeqs} sequences (${bytesPerToken} bytes per token); raise it or lower --max_num_seqs\n`);
      process.exit(2);
    }
    if (perSequence < maxModelLen) {
      maxModelLen = perSequence;
      capacityNote = `cache_size ${cacheGb} GB / ${maxNumSeqs} sequences / ${bytesPerToken} bytes per token`;
    }
  }
  const logLevel = ({ DEBUG: "debug", INFO: "info", WARNING: "warn", ERROR: "error" } as const)[flags["log_level"] as "INFO"];
  const modelName = (flags["model_name"] as string | undefined) ?? (demo ? DEFAULT_MODEL_NAME : path.basename(modelPath).replace(/\.gguf$/i, ""));
  let gw: Awaited<ReturnType<typeof startGateway>>;
  try {
    gw = await startGateway({
    host: flags["rest_bind_address"] as string,
    port: flags["rest_port"] as number,
    modelName,
    engine: { ...base, contextSize: maxModelLen, maxModelLen },
    bodyLimit: flags["max_request_body"] as number,
    maxQueuedRequests: flags["max_queued_requests"] as number,
    requestTimeoutMs: (flags["request_timeout"] as number) * 1000,
    maxStreamBuffer: flags["max_stream_buffer"] as number,
    engineStallTimeoutMs: (flags["engine_stall_timeout"] as number) * 1000,
    logLevel,
  });
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const what = e.code === "EADDRINUSE" ? `port ${flags["rest_port"]} on ${flags["rest_bind_address"]} is already in use` : e.message;
    process.stderr.write(`keel serve: cannot listen: ${what}\n`);
    process.exit(1);
  }
  gw.log.info(
    { event: "capacity", tokensPerSequence: maxModelLen, sequences: maxNumSeqs, limitedBy: capacityNote, kvCachePrecision: flags["kv_cache_precision"], prefixCaching: base.prefixCaching },
    `KV capacity: ${maxModelLen} tokens per sequence x ${maxNumSeqs} sequences`,
  );
  if (demo) gw.log.warn({ event: "demo_model", model: modelPath }, "serving the embedded random-weight demo model: its output is gibberish by design");
  // Graceful drain on the first SIGTERM/SIGINT; a second one stops waiting for in-flight requests.
  let signals = 0;
  const shutdown = (sig: string): void => {
    signals += 1;
    gw.log.info({ event: "shutdown", signal: sig, count: signals }, "shutting down");
    if (signals === 1) {
      gw.drain((flags["shutdown_timeout"] as number) * 1000)
        .catch((err: unknown) => gw.log.error({ err: (err as Error)?.message }, "error during shutdown"))
        .finally(() => process.exit(0));
    } else {
      gw.hurryDrain(); // the drain already running stops waiting for in-flight requests
    }
  };
  process.on("SIGTERM", () => shutdown("SIGTERM"));
  process.on("SIGINT", () => shutdown("SIGINT"));
}

/** Entry point of the `keel` bin. */
export async function main(argv: string[]): Promise<void> {
  const [cmd, ...rest] = argv;
  if (cmd === "serve") return serve(rest);
  if (cmd === "make-model") {
    const { main: makeModel } = await import("./model/make-model.js");
    process.exitCode = makeModel(rest);
    return;
  }
  process.stderr.write(`${cmd && cmd !== "--help" && cmd !== "-h" ? `keel: unknown command "${cmd}"\n\n` : ""}${usage()}\n`);
  process.exit(cmd === "--help" || cmd === "-h" ? 0 : 2);
}
