/**
 * `keel` command line: `keel serve [flags]` (OVMS-style flag names), `keel make-model`.
 *
 * An unknown flag or a bad value exits with code 2 and a clear message; `--help` lists every flag with its default.
 */
import fs from "node:fs";
import { parseArgs } from "node:util";
import { DEFAULT_ENGINE_COMMAND, spawnEngine } from "./gateway/engine-client.js";
import { startGateway } from "./gateway/server.js";
import { HOW_TO_PASS_A_MODEL, resolveServeModel, type ServeModel } from "./model/serve-model.js";
import type { EngineCommand, EngineConfig } from "./protocol/engine-config.js";
import type { ModelMetadata } from "./protocol/messages.js";
import { REASONING_PARSERS, TOOL_PARSERS, type ReasoningParserName, type ToolParserName } from "./gateway/tools.js";

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
  { name: "model_path", help: "GGUF model file, a model name from `keel fetch --list` (fetched and cached on first use), or keel-tiny / keel-tiny-qwen3 / keel-tiny-qwen3coder (generated random-weight models) (default: smollm2-135m-instruct; keel-tiny if it cannot be fetched)", default: undefined },
  { name: "model_name", help: "served model name (default: the model's own name, e.g. SmolLM2-135M-Instruct or keel-tiny, or the model file's base name)", default: undefined },
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
  { name: "tool_parser", help: "tool-call format to parse (and guide): hermes3, qwen3coder, llama3, or auto (from the model's chat template); unset = requests with tools are refused", default: undefined, parse: oneOf("tool_parser", [...TOOL_PARSERS, "auto"]) },
  { name: "reasoning_parser", help: "reasoning format to split into reasoning_content: qwen3 (<think>…</think>); unset = reasoning stays in content", default: undefined, parse: oneOf("reasoning_parser", [...REASONING_PARSERS]) },
  { name: "enable_tool_guided_generation", help: "constrain tool calls with a grammar under tool_choice auto too (required and a named function are always guided)", default: "false", parse: bool("enable_tool_guided_generation") },
  { name: "config_path", help: "OVMS JSON config listing several models, each served by its own engine (README, \"Several models\")", default: undefined },
  { name: "deterministic", help: "same request + seed → same text on every run: prefix reuse off, flash attention off, f16 KV (see README)", default: "false", parse: bool("deterministic") },
];

function usage(): string {
  const lines = ["Usage: keel serve [--flag value ...]", "", "Flags:"];
  for (const f of SERVE_FLAGS) lines.push(`  --${f.name.padEnd(24)} ${f.help}${f.default !== undefined ? ` (default: ${f.default})` : ""}`);
  lines.push("", "Other commands:", "  keel fetch NAME | --list               fetch, verify and cache a real model (see --help there)", "  keel make-model --out FILE [options]   write a tiny random-weight GGUF (see --help there)");
  return lines.join("\n");
}

/** Parse `keel serve` flags. @throws Error with a user-facing message (every unknown flag named at once). */
export function parseServeFlags(argv: string[]): Record<string, unknown> {
  const options = Object.fromEntries([...SERVE_FLAGS.map((f) => [f.name, { type: "string" as const }]), ["help", { type: "boolean" as const, short: "h" }]]);
  // Non-strict parsing with tokens, so that every unknown flag and every flag missing its value is reported in one
  // run instead of the first one only.
  const parsed = parseArgs({ args: argv, options, strict: false, allowPositionals: true, tokens: true });
  const known = new Set(Object.keys(options));
  const unknown: string[] = [];
  const valueless: string[] = [];
  for (const t of parsed.tokens ?? []) {
    if (t.kind !== "option") continue;
    if (!known.has(t.name)) unknown.push(t.rawName);
    // A value that is itself a flag (`--rest_port --max_num_seqs 4`) means the value was forgotten; that flag is
    // checked too (`--log_level --bogus` names both).
    else if (t.name !== "help" && (t.value === undefined || (!t.inlineValue && t.value.startsWith("--")))) {
      valueless.push(t.rawName);
      const swallowed = t.value?.slice(2).split("=")[0];
      if (swallowed !== undefined && !known.has(swallowed)) unknown.push(`--${swallowed}`);
    }
  }
  // Every problem of the command line in one message, not the first one per run.
  const problems: string[] = [];
  if (unknown.length > 0) problems.push(`unknown flag${unknown.length > 1 ? "s" : ""} ${[...new Set(unknown)].join(", ")}`);
  if (valueless.length > 0) problems.push(`flag${valueless.length > 1 ? "s" : ""} ${valueless.join(", ")} need${valueless.length > 1 ? "" : "s"} a value`);
  const values = parsed.values as Record<string, string | boolean | undefined>;
  const positionals = parsed.positionals;
  if (positionals.length > 0) problems.push(`unexpected argument "${positionals[0]}"`);
  if (values["help"] && problems.length === 0) return { help: true };
  const out: Record<string, unknown> = {};
  for (const f of SERVE_FLAGS) {
    if (valueless.includes(`--${f.name}`)) continue;
    const given = values[f.name];
    const raw = (typeof given === "string" ? given : undefined) ?? f.default;
    try {
      out[f.name] = raw === undefined ? undefined : f.parse ? f.parse(raw) : raw;
    } catch (err) {
      problems.push((err as Error).message);
    }
  }
  if (problems.length > 0) throw new Error(problems.join("; "));
  if ((out["max_num_batched_tokens"] as number) < (out["max_num_seqs"] as number)) {
    throw new Error(`--max_num_batched_tokens (${out["max_num_batched_tokens"]}) must be >= --max_num_seqs (${out["max_num_seqs"]})`);
  }
  if (out["deterministic"] === true) {
    // Deterministic mode turns off what changes the numerics between two runs of one request; an explicit request
    // for one of those contradicts it.
    if (values["enable_prefix_caching"] === "true") throw new Error("--deterministic true turns prefix reuse off; it contradicts --enable_prefix_caching true");
    if (values["flash_attention"] === "true") throw new Error("--deterministic true needs flash attention off; it contradicts --flash_attention true");
    if (out["kv_cache_precision"] === "u8") throw new Error("--deterministic true needs an f16 KV cache (u8 needs flash attention); it contradicts --kv_cache_precision u8");
    out["enable_prefix_caching"] = false;
    out["flash_attention"] = false;
  }
  return out;
}

/**
 * Check that `modelPath` names a readable GGUF file before an engine tries to load it.
 * @returns null when it looks like one, else a user-facing message.
 */
export function checkModelFile(modelPath: string): string | null {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(modelPath);
  } catch {
    return `the model file ${modelPath} does not exist`;
  }
  if (stat.isDirectory()) return `${modelPath} is a directory; --model_path needs a GGUF model file`;
  if (!stat.isFile()) return `${modelPath} is not a regular file; --model_path needs a GGUF model file`;
  const head = Buffer.alloc(4);
  let fd: number | null = null;
  try {
    fd = fs.openSync(modelPath, "r");
    const n = fs.readSync(fd, head, 0, 4, 0);
    if (n < 4 || head.toString("latin1") !== "GGUF") return `the model file ${modelPath} is not a GGUF file (it does not start with the GGUF magic)`;
  } catch (err) {
    return `the model file ${modelPath} cannot be read: ${(err as Error).message}`;
  } finally {
    if (fd !== null) fs.closeSync(fd);
  }
  return null;
}

/** Engine failures that are a JavaScript error inside the GGUF reader: the file ends early or is corrupt. */
const CORRUPT_GGUF = /Cannot read properties of undefined|out of range|Offset is outside the bounds|RangeError|Unexpected end|Maximum call stack/i;

/** Signals that mean the model check was killed from outside (an OOM killer, an operator), not that it failed. */
const KILL_SIGNALS = new Set(["SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"]);

/** One run of the model check in a throwaway engine process. */
async function runModelCheck(config: Omit<EngineConfig, "mode">, command: EngineCommand): Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }> {
  const child = spawnEngine(command, { ...config, mode: "validate" }, ["ignore", "pipe", "pipe"], false);
  let stdout = "";
  let stderr = "";
  child.stdout!.setEncoding("utf8").on("data", (d: string) => (stdout += d));
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => {
    child.on("error", () => resolve([127, null]));
    child.on("exit", (c, s) => resolve([c, s]));
  });
  return { code, signal, stdout, stderr };
}

/**
 * Load the model in a throwaway child: a model that makes llama.cpp abort (GGML_ASSERT) kills only that child.
 * A check killed from outside (e.g. SIGKILL by an OOM killer) is not the model's fault: it is retried once, and if
 * it is killed again that is what the error says.
 * @returns the model metadata. @throws Error with the child's last log line when it fails.
 */
export async function validateModel(config: Omit<EngineConfig, "mode">, command: EngineCommand = DEFAULT_ENGINE_COMMAND): Promise<ModelMetadata> {
  let run = await runModelCheck(config, command);
  if (run.signal && KILL_SIGNALS.has(run.signal)) run = await runModelCheck(config, command);
  const { code, signal, stdout, stderr } = run;
  if (code === 0) {
    const line = stdout.trim().split("\n").pop() ?? "";
    return (JSON.parse(line) as { metadata: ModelMetadata }).metadata;
  }
  if (signal && KILL_SIGNALS.has(signal)) {
    throw new Error(`the model check was killed (${signal}) twice while loading ${config.modelPath}; this is not a verdict on the model (out of memory? see the system log)`);
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
  if (CORRUPT_GGUF.test(detail)) throw new Error(`the model ${config.modelPath} cannot be loaded: the GGUF file is truncated or corrupt (its contents end early or do not parse)`);
  throw new Error(`the model ${config.modelPath} cannot be loaded (engine ${signal ? `killed by ${signal}` : `exit code ${code}`}): ${detail || "no message"}`);
}

/**
 * Counts shutdown signals. npm (`npm run serve`) forwards the terminal's Ctrl-C to Keel, which also receives it
 * from the terminal itself: two deliveries of one keystroke a few ms apart. A signal within `sameWithinMs` of the
 * previous one is the same signal; only a later one means "hurry".
 */
export class ShutdownSignals {
  /** Distinct signals seen. */
  count = 0;
  /** When the last distinct signal arrived (ms since epoch), or null. */
  private lastAt: number | null = null;

  constructor(private readonly sameWithinMs = 100) {}

  /** Record a signal delivered at `now`; returns "drain" for the first, "hurry" for a later distinct one, "same" for a duplicate. */
  receive(now = Date.now()): "drain" | "hurry" | "same" {
    if (this.lastAt !== null && now - this.lastAt < this.sameWithinMs) return "same";
    this.lastAt = now;
    this.count += 1;
    return this.count === 1 ? "drain" : "hurry";
  }
}

async function serve(argv: string[]): Promise<void> {
  let flags: Record<string, unknown>;
  try {
    flags = parseServeFlags(argv);
  } catch (err) {
    process.stderr.write(`keel serve: ${(err as Error).message}\nRun "keel serve --help" for the list of flags.\n`);
    process.exit(2);
  }
  if (flags["help"]) {
    process.stdout.write(usage() + "\n");
    return;
  }
  if (flags["config_path"] !== undefined) return (await import("./serve-config.js")).serveFromConfig(flags, engineCommandFromEnv());
  let model: ServeModel;
  try {
    model = await resolveServeModel(flags["model_path"] as string | undefined, { fetch: { log: (l) => process.stderr.write(`keel serve: ${l}\n`) } });
  } catch (err) {
    process.stderr.write(`keel serve: ${(err as Error).message}\n`);
    process.exit(1);
  }
  if (model.kind === "fallback") process.stderr.write(`keel serve: ${model.reason}\nkeel serve: serving the random-weight keel-tiny instead; ${HOW_TO_PASS_A_MODEL}\n`);
  const modelPath = model.path;
  const demo = model.kind === "tiny" || model.kind === "fallback";
  const notAModel = model.kind === "file" ? checkModelFile(modelPath) : null;
  if (notAModel) {
    process.stderr.write(`keel serve: ${notAModel}\n`);
    process.exit(1);
  }
  const maxNumSeqs = flags["max_num_seqs"] as number;
  const u8 = flags["kv_cache_precision"] === "u8";
  // The engine-neutral start configuration (protocol/engine-config.ts); maxModelLen is settled below.
  const base = {
    modelPath,
    maxNumSeqs,
    maxNumBatchedTokens: flags["max_num_batched_tokens"] as number,
    threads: flags["engine_threads"] as number,
    // A quantized V cache needs flash attention in llama.cpp (docs/upstream.md).
    flashAttention: u8 ? true : (flags["flash_attention"] as boolean),
    kvCacheType: u8 ? ("q8_0" as const) : ("f16" as const),
    prefixCaching: flags["enable_prefix_caching"] as boolean,
    device: (flags["target_device"] === "CPU" ? "cpu" : "auto") as "cpu" | "auto",
  };
  const engineCommand = engineCommandFromEnv();
  let meta: ModelMetadata;
  try {
    meta = await validateModel({ ...base, maxModelLen: 256 }, engineCommand);
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
  const modelName = (flags["model_name"] as string | undefined) ?? model.servedName;
  let gw: Awaited<ReturnType<typeof startGateway>>;
  try {
    gw = await startGateway({
    host: flags["rest_bind_address"] as string,
    port: flags["rest_port"] as number,
    modelName,
    engine: { ...base, maxModelLen },
    engineCommand,
    bodyLimit: flags["max_request_body"] as number,
    maxQueuedRequests: flags["max_queued_requests"] as number,
    requestTimeoutMs: (flags["request_timeout"] as number) * 1000,
    maxStreamBuffer: flags["max_stream_buffer"] as number,
    engineStallTimeoutMs: (flags["engine_stall_timeout"] as number) * 1000,
    agents: {
      toolParser: (flags["tool_parser"] as ToolParserName | "auto" | undefined) ?? null,
      reasoningParser: (flags["reasoning_parser"] as ReasoningParserName | undefined) ?? null,
      guideAuto: flags["enable_tool_guided_generation"] as boolean,
    },
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
  if (flags["deterministic"]) {
    gw.log.info({ event: "deterministic", prefixCaching: false, flashAttention: false, kvCachePrecision: "f16" }, "deterministic mode: the same request and seed give the same text on every run (prefix reuse off)");
  }
  gw.log.info({ event: "model", name: modelName, kind: model.kind, path: modelPath, source: model.source }, `serving ${modelName} (${model.source}) from ${modelPath}`);
  if (model.kind === "fallback") gw.log.warn({ event: "default_model_unavailable", reason: model.reason }, `${model.reason}; serving keel-tiny instead: ${HOW_TO_PASS_A_MODEL}`);
  if (demo) gw.log.warn({ event: "demo_model", model: modelPath }, "serving a generated random-weight model: its output is gibberish by design");
  // Graceful drain on the first SIGTERM/SIGINT; a second one (not the same one delivered twice) stops waiting for
  // in-flight requests.
  const signals = new ShutdownSignals();
  const shutdown = (sig: string): void => {
    const meaning = signals.receive();
    if (meaning === "same") {
      gw.log.info({ event: "shutdown_signal_repeated", signal: sig }, "the same shutdown signal delivered twice (e.g. by npm and the terminal); counted once");
      return;
    }
    gw.log.info({ event: "shutdown", signal: sig, count: signals.count }, "shutting down");
    if (meaning === "drain") {
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

/**
 * The engine command: KEEL_ENGINE_COMMAND (a JSON {@link EngineCommand}, e.g. `{"command":"python3","args":["worker.py"]}`)
 * or this package's llama.cpp engine.
 */
function engineCommandFromEnv(): EngineCommand {
  const raw = process.env["KEEL_ENGINE_COMMAND"];
  if (!raw) return DEFAULT_ENGINE_COMMAND;
  try {
    const c = JSON.parse(raw) as EngineCommand;
    if (typeof c.command === "string" && Array.isArray(c.args) && c.args.every((a) => typeof a === "string")) return c;
  } catch {
    /* reported below */
  }
  process.stderr.write('keel serve: KEEL_ENGINE_COMMAND must be JSON like {"command":"node","args":["dist/engine/main.js"]}\n');
  process.exit(2);
}

/** Entry point of the `keel` bin. */
export async function main(argv: string[]): Promise<void> {
  const [cmd, ...rest] = argv;
  if (cmd === "serve") return serve(rest);
  if (cmd === "fetch") {
    const { main: fetch } = await import("./model/fetch-command.js");
    process.exitCode = await fetch(rest);
    return;
  }
  if (cmd === "make-model") {
    const { main: makeModel } = await import("./model/make-model.js");
    process.exitCode = makeModel(rest);
    return;
  }
  process.stderr.write(`${cmd && cmd !== "--help" && cmd !== "-h" ? `keel: unknown command "${cmd}"\n\n` : ""}${usage()}\n`);
  process.exit(cmd === "--help" || cmd === "-h" ? 0 : 2);
}
