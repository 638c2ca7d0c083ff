/**
 * `keel` command line: `keel serve [flags]` (OVMS-style flag names), `keel make-model`.
 *
 * An unknown flag or a bad value exits with code 2 and a clear message; `--help` lists every flag with its default.
 */
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { DEFAULT_ENGINE_COMMAND, spawnEngine } from "./gateway/supervision/engine-client.js";
import { startGateway } from "./gateway/server.js";
import { metricFamilies } from "./gateway/metrics/metrics.js";
import { HubError } from "./model/hub-download.js";
import { logProgress, ttyProgress } from "./model/hub-progress.js";
import { HOW_TO_PASS_A_MODEL, modelSourceFlagProblem, resolveHubModel, resolveServeModel, type ServeModel } from "./model/serve-model.js";
import type { EngineCommand, EngineConfig } from "./protocol/engine-config.js";
import type { EngineBackend, ModelMetadata } from "./protocol/messages.js";
import { defaultLogFormat, logDestination, type LogFormat } from "./gateway/http/logging.js";
import { loadApiKey } from "./gateway/http/auth.js";
import { parseCsvFlag } from "./gateway/http/cors.js";
import { REASONING_PARSERS, TOOL_PARSERS, type ReasoningParserName, type ToolParserName } from "./gateway/tools.js";
import { kvCapacity } from "./cli/kv-capacity.js";
import { defaultEngineThreads, ENGINE_THREADS_RULE, hostCpus, type HostCpus } from "./cli/engine-threads.js";
import { parsePluginConfig } from "./cli/plugin-config.js";
import { chooseEngine, ENGINE_FLAG_VALUES, engineCommandFor, engineFlagProblems, engineBaseConfig, type EngineFlag, type EngineName } from "./cli/engine-choice.js";
import { kvBlockTokens, llamaKvCacheBytes, openvinoKvElementBytes } from "./model/kv-bytes.js";

/** One `keel serve` flag. */
interface FlagSpec {
  name: string;
  help: string;
  default: string | undefined;
  /** Parse and check the value; throw Error with a message naming the flag. */
  parse?: (v: string) => unknown;
  /** An OVMS switch that takes no value: `--pull` alone means true; `--pull=false` also works. */
  bare?: boolean;
  /** Key of the value in parseServeFlags' result when not the flag's name (the camelCase fields other modules wire). */
  field?: string;
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
const csv = (v: string): string[] => v.split(",").map((s) => s.trim()).filter((s) => s !== "");
/** A flag Keel refuses whatever its value: why, and what to use instead. */
const refuse = (name: string, why: string) => (): never => {
  throw new Error(`--${name} is not supported: ${why}`);
};

/** `--target_device` values → the engine's device: CPU never touches a GPU; GPU must get one; AUTO may. */
export function parseTargetDevice(v: string): "cpu" | "gpu" | "auto" {
  if (v === "CPU") return "cpu";
  if (v === "GPU" || v === "GPU.0") return "gpu";
  if (v === "AUTO" || v.startsWith("AUTO:")) return "auto";
  if (/^GPU\.\d+$/.test(v)) {
    throw new Error(`--target_device ${v}: Keel cannot pick a GPU by index; make that GPU the only visible one (CUDA_VISIBLE_DEVICES=${v.slice(4)} or GGML_VK_VISIBLE_DEVICES=${v.slice(4)}) and pass --target_device GPU`);
  }
  if (v === "NPU" || v.startsWith("HETERO") || v.startsWith("MULTI")) throw new Error(`--target_device ${v} is not supported: Keel runs llama.cpp on CPU or one GPU (CPU, GPU, GPU.0, AUTO)`);
  throw new Error(`--target_device must be one of CPU, GPU, GPU.0, AUTO, got "${v}"`);
}

/** The metric families `--metrics_list` may name: every family /metrics exports (keel_*, vllm:*, ovms_*). */
export const METRIC_FAMILIES: readonly string[] = metricFamilies();

/** Every `keel serve` flag with its default: Keel's own, then OVMS's (accepted with their meaning, or refused). */
export const SERVE_FLAGS: FlagSpec[] = [
  { name: "rest_port", help: "HTTP port", default: "8000", parse: int("rest_port", 0, 65535) },
  { name: "rest_bind_address", help: "HTTP bind address", default: "0.0.0.0" },
  { name: "model_path", help: "GGUF model file, a model directory holding one (--gguf_filename picks among several), a model name from `keel fetch --list` (fetched and cached on first use), or keel-tiny / keel-tiny-f16 / keel-tiny-qwen3 / keel-tiny-qwen3coder (generated random-weight models; keel-tiny-f16 loads in both engines) (default: smollm2-135m-instruct; keel-tiny if it cannot be fetched)", default: undefined },
  { name: "model_name", help: "served model name (default: the model's own name, e.g. SmolLM2-135M-Instruct or keel-tiny, or the model file's base name)", default: undefined },
  { name: "max_num_seqs", help: "sequences decoded together (KV slots)", default: "8", parse: int("max_num_seqs", 1, 256) },
  { name: "max_num_batched_tokens", help: "token budget of one engine step (>= max_num_seqs)", default: "256", parse: int("max_num_batched_tokens", 1, 65536) },
  { name: "max_model_len", help: "tokens per sequence (default: min(model's trained context, 4096); with --cache_size: what the budget holds, up to the trained context)", default: undefined, parse: int("max_model_len", 2, 1 << 20) },
  { name: "engine_threads", help: `CPU threads of the engine (default: ${ENGINE_THREADS_RULE})`, default: undefined, parse: int("engine_threads", 1, 512) },
  { name: "target_device", help: "CPU; GPU or GPU.0 (a llama.cpp GPU backend, CUDA or Vulkan; exits if none loads); AUTO (a GPU backend if one loads, else CPU; logged)", default: "CPU", parse: parseTargetDevice },
  { name: "max_queued_requests", help: "requests allowed to wait for a sequence; beyond it 429 with Retry-After", default: "256", parse: int("max_queued_requests", 0, 1_000_000) },
  { name: "enable_prefix_caching", help: "keep finished requests' KV and reuse the longest common prefix", default: "true", parse: bool("enable_prefix_caching") },
  { name: "kv_cache_precision", help: "KV cache precision: f16 (default), or u8 (q8_0 K and V, with flash attention)", default: undefined, parse: oneOf("kv_cache_precision", ["f16", "u8"]) },
  { name: "cache_size", help: "KV cache budget in GB (10^9 bytes) over all sequences (fractions allowed); 0 = max_model_len per sequence", default: "0", parse: gb("cache_size") },
  { name: "engine", help: "auto (an OpenVINO IR directory → openvino, a GGUF → llama.cpp), llama.cpp, or openvino (OpenVINO GenAI continuous batching in a Python worker; serves GGUF files and IR directories; its venv is built in Keel's cache on first use)", default: "auto", parse: oneOf("engine", [...ENGINE_FLAG_VALUES]) },
  { name: "num_kv_blocks", help: "OpenVINO engine: a fixed KV pool of N blocks shared by all sequences (32 tokens per block on CPU, 16 on GPU); refused with the llama.cpp engine", default: undefined, parse: int("num_kv_blocks", 1, 1 << 24) },
  { name: "engine_stall_timeout", help: "seconds without engine progress while there is work before the engine is restarted", default: "30", parse: int("engine_stall_timeout", 1, 86_400) },
  { name: "shutdown_timeout", help: "seconds in-flight requests may take to finish after SIGTERM/SIGINT", default: "30", parse: int("shutdown_timeout", 0, 86_400) },
  { name: "log_level", help: "DEBUG, INFO, WARNING or ERROR (TRACE = DEBUG)", default: "INFO", parse: (v) => oneOf("log_level", ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR"])(v) === "TRACE" ? "DEBUG" : v },
  { name: "log_format", help: "text (one readable line per event) or json (default: text when stdout is a terminal, else json)", default: undefined, parse: oneOf("log_format", ["text", "json"]) },
  { name: "log_path", help: "write the log to this file (appended) instead of stdout", default: undefined },
  { name: "request_timeout", help: "seconds a client may take to send its whole request (headers and body) before it is dropped", default: "30", parse: int("request_timeout", 1, 3600) },
  { name: "max_stream_buffer", help: "bytes of stream output a client may leave unread before it is treated as disconnected", default: String(1024 * 1024), parse: int("max_stream_buffer", 1024) },
  { name: "max_request_body", help: "request body limit in bytes", default: String(8 * 1024 * 1024), parse: int("max_request_body", 1024) },
  { name: "flash_attention", help: "flash attention in llama.cpp (off: the embedded model's greedy output does not depend on batching)", default: "false", parse: bool("flash_attention") },
  { name: "tool_parser", help: "tool-call format to parse (and guide): hermes3, qwen3coder, llama3, or auto (from the model's chat template); unset = requests with tools are refused", default: undefined, parse: oneOf("tool_parser", [...TOOL_PARSERS, "auto"]) },
  { name: "reasoning_parser", help: "reasoning format to split into reasoning_content: qwen3 (<think>…</think>); unset = reasoning stays in content", default: undefined, parse: oneOf("reasoning_parser", [...REASONING_PARSERS]) },
  { name: "enable_tool_guided_generation", help: "constrain tool calls with a grammar under tool_choice auto too (required and a named function are always guided)", default: "false", parse: bool("enable_tool_guided_generation") },
  { name: "deterministic", help: "same request + seed → same text on every run: prefix reuse off, flash attention off, f16 KV (see README)", default: "false", parse: bool("deterministic") },
  // OVMS flags with their OVMS meaning (ovms-compat.md §1).
  { name: "task", help: "text_generation (the only task Keel serves)", default: "text_generation", parse: (v) => {
    if (v === "text_generation") return v;
    throw new Error(`--task ${v} is not supported: Keel serves LLM text generation only (--task text_generation)`);
  } },
  { name: "pipeline_type", help: "LM, LM_CB or AUTO: all mean Keel's continuous batching (VLM pipelines are refused)", default: "AUTO", parse: (v) => {
    if (v === "LM" || v === "LM_CB" || v === "AUTO") return v;
    if (v === "VLM" || v === "VLM_CB") throw new Error(`--pipeline_type ${v} is not supported: Keel serves text-only models (LM, LM_CB or AUTO)`);
    throw new Error(`--pipeline_type must be one of LM, LM_CB, AUTO, got "${v}"`);
  } },
  { name: "plugin_config", help: "JSON: KV_CACHE_PRECISION (u8|f16), INFERENCE_NUM_THREADS (engine threads), ENABLE_CPU_PINNING (threads are not pinned: false is Keel's behaviour, true is warned), CACHE_DIR; other keys warned (llama.cpp); the OpenVINO engine passes every key to OpenVINO", default: undefined },
  { name: "cache_interval_multiplier", help: "OVMS: state-block interval of linear-attention models; accepted and logged: a no-op here (llama.cpp keeps full per-token KV for attention models)", default: undefined, parse: int("cache_interval_multiplier", 1) },
  { name: "dynamic_split_fuse", help: "true: long prompts are prefilled in chunks of max_num_batched_tokens; false (as OVMS): a prompt longer than max_num_batched_tokens is refused with 400", default: "true", parse: bool("dynamic_split_fuse") },
  { name: "rest_workers", help: "OVMS HTTP worker threads (2..10000); accepted and logged: Keel's one event loop has no worker pool (concurrency is bounded by --max_num_seqs and --max_queued_requests)", default: undefined, parse: int("rest_workers", 2, 10000) },
  { name: "cache_dir", help: "cache directory: Keel keeps downloaded models in <cache_dir>/models (default: $KEEL_CACHE_DIR, else ~/.cache/keel)", default: undefined },
  { name: "metrics_enable", help: "true: /metrics is served (Keel always serves it; false is refused)", default: "true", parse: (v) => {
    if (bool("metrics_enable")(v)) return true;
    throw new Error("--metrics_enable false is not supported: Keel always serves /metrics (gateways and probes scrape it)");
  } },
  { name: "metrics_list", help: `comma-separated metric families to export (${METRIC_FAMILIES.length} known; see /metrics)`, default: undefined, field: "metricsList", parse: (v) => {
    const names = csv(v);
    const unknown = names.filter((n) => !METRIC_FAMILIES.includes(n));
    if (unknown.length > 0) throw new Error(`--metrics_list names unknown metric famil${unknown.length > 1 ? "ies" : "y"} ${unknown.join(", ")} (known: ${METRIC_FAMILIES.join(", ")})`);
    return names;
  } },
  { name: "port", help: "OVMS gRPC port: only 0 (Keel serves REST only)", default: "0", parse: (v) => {
    if (int("port", 0, 65535)(v) === 0) return 0;
    throw new Error(`--port ${v} is not supported: Keel serves no gRPC (OVMS's OpenAI API is REST-only too); use --rest_port`);
  } },
  { name: "grpc_bind_address", help: "refused: no gRPC", default: undefined, parse: refuse("grpc_bind_address", "Keel serves no gRPC; use --rest_bind_address") },
  { name: "max_prompt_len", help: "refused: NPU-only in OVMS", default: undefined, parse: refuse("max_prompt_len", "it is NPU-only in OVMS and Keel has no NPU; a prompt is limited by --max_model_len") },
  { name: "model_distribution_policy", help: "refused: one engine on one device", default: undefined, parse: refuse("model_distribution_policy", "Keel runs each model in one engine process on one device (no tensor or pipeline parallelism)") },
  { name: "draft_source_model", help: "refused: no speculative decoding", default: undefined, parse: refuse("draft_source_model", "Keel has no speculative decoding; serve the main model alone") },
  { name: "allowed_local_media_path", help: "refused: no image input", default: undefined, parse: refuse("allowed_local_media_path", "Keel serves text-only models (no image input)") },
  { name: "allowed_media_domains", help: "refused: no image input", default: undefined, parse: refuse("allowed_media_domains", "Keel serves text-only models (no image input)") },
  { name: "weight-format", help: "refused: GGUF files carry their quantization", default: undefined, parse: refuse("weight-format", "Keel serves GGUF files whose quantization is fixed in the file; choose a quantized file (--gguf_filename)") },
  { name: "extra_quantization_params", help: "refused: GGUF files carry their quantization", default: undefined, parse: refuse("extra_quantization_params", "Keel does not quantize models; choose a quantized GGUF file (--gguf_filename)") },
  // OVMS flags whose values other modules serve (multi-model config, hub pull, auth, CORS), under camelCase fields.
  { name: "config_path", help: "OVMS JSON config listing several models, each served by its own engine (README, \"Several models\")", default: undefined, field: "configPath" },
  { name: "source_model", help: "Hugging Face hub repository ORG/NAME to pull a GGUF from (HF_ENDPOINT, HF_TOKEN honoured) into --model_repository_path/ORG/NAME; served as ORG/NAME unless --model_name", default: undefined, field: "sourceModel" },
  { name: "model_repository_path", help: "directory models are pulled into (default: $OVMS_MODEL_REPOSITORY_PATH)", default: undefined, field: "modelRepositoryPath" },
  { name: "pull", help: "download the --source_model and exit (without it: download if missing, then serve)", default: undefined, field: "pull", bare: true },
  { name: "gguf_filename", help: "the .gguf file to take from a --source_model repository or a --model_path directory holding several", default: undefined, field: "ggufFilename" },
  { name: "overwrite_models", help: "download the --source_model again even when it is already in the repository", default: undefined, field: "overwriteModels", bare: true },
  { name: "api_key_file", help: "file whose first line is the API key required as Authorization: Bearer on /v1/ and /v3/ routes (else env API_KEY; unset = no auth)", default: undefined, field: "apiKeyFile" },
  { name: "allowed_origins", help: "CORS: origins allowed to read responses, comma-separated", default: "*", field: "allowedOrigins", parse: (v) => parseCsvFlag("allowed_origins", v) },
  { name: "allowed_methods", help: "CORS: methods a preflight allows, comma-separated", default: "*", field: "allowedMethods", parse: (v) => parseCsvFlag("allowed_methods", v) },
  { name: "allowed_headers", help: "CORS: request headers a preflight allows, comma-separated", default: "*", field: "allowedHeaders", parse: (v) => parseCsvFlag("allowed_headers", v) },
  { name: "allow_credentials", help: "CORS: send Access-Control-Allow-Credentials: true", default: undefined, field: "allowCredentials", bare: true },
];


function usage(): string {
  const lines = ["Usage: keel serve [--flag value | --flag=value ...]", "", "Flags:"];
  for (const f of SERVE_FLAGS) {
    lines.push(`  --${f.name.padEnd(28)} ${f.help}${f.default !== undefined ? ` (default: ${f.default})` : ""}`);
  }
  lines.push("", "Other commands:", "  keel fetch NAME | --list               fetch, verify and cache a real model (see --help there)", "  keel make-model --out FILE [options]   write a tiny random-weight GGUF (see --help there)");
  return lines.join("\n");
}

/** A line to log at start about a flag (what it does here, or that part of it is not applied). */
export interface FlagNote {
  level: "info" | "warn";
  msg: string;
  /** Logged only when this engine serves (absent: always); the engine is known once the model is. */
  engine?: EngineName;
}

/**
 * Parse `keel serve` flags (`--flag value` and `--flag=value`). The result maps each flag name (or its `field`) to
 * its parsed value, plus `notes` (FlagNote[]) to log at start and `given` (the flag names on the command line).
 * @throws Error with a user-facing message naming every problem of the command line at once.
 */
export function parseServeFlags(argv: string[], host: HostCpus = hostCpus()): Record<string, unknown> {
  const options = Object.fromEntries([
    ...SERVE_FLAGS.map((f) => [f.name, { type: f.bare ? ("boolean" as const) : ("string" as const) }]),
    ["help", { type: "boolean" as const, short: "h" }],
  ]);
  const bare = new Set(SERVE_FLAGS.filter((f) => f.bare).map((f) => f.name));
  // Non-strict parsing with tokens, so that every unknown flag and every flag missing its value is reported in one
  // run instead of the first one only.
  const parsed = parseArgs({ args: argv, options, strict: false, allowPositionals: true, tokens: true });
  const known = new Set(Object.keys(options));
  const unknown: string[] = [];
  const valueless: string[] = [];
  /** The raw value of each flag given (the last one wins, as OVMS). */
  const values = new Map<string, string>();
  for (const t of parsed.tokens ?? []) {
    if (t.kind !== "option") continue;
    if (!known.has(t.name)) unknown.push(t.rawName);
    else if (bare.has(t.name)) values.set(t.name, t.value ?? "true");
    // A value that is itself a flag (`--rest_port --max_num_seqs 4`) means the value was forgotten; that flag is
    // checked too (`--log_level --bogus` names both).
    else if (t.name !== "help" && (t.value === undefined || (!t.inlineValue && t.value.startsWith("--")))) {
      valueless.push(t.rawName);
      const swallowed = t.value?.slice(2).split("=")[0];
      if (swallowed !== undefined && !known.has(swallowed)) unknown.push(`--${swallowed}`);
    } else if (t.name !== "help" && t.value !== undefined) values.set(t.name, t.value);
  }
  // Every problem of the command line in one message, not the first one per run.
  const problems: string[] = [];
  if (unknown.length > 0) problems.push(`unknown flag${unknown.length > 1 ? "s" : ""} ${[...new Set(unknown)].join(", ")}`);
  if (valueless.length > 0) problems.push(`flag${valueless.length > 1 ? "s" : ""} ${valueless.join(", ")} need${valueless.length > 1 ? "" : "s"} a value`);
  // A value after a switch (`--pull true`) is a positional to the parser: say what the switch takes instead.
  const tokens = parsed.tokens ?? [];
  const positionals: string[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!;
    if (t.kind !== "positional") continue;
    const prev = tokens[i - 1];
    if (prev?.kind === "option" && bare.has(prev.name) && prev.value === undefined) {
      problems.push(`${prev.rawName} takes no value (write ${prev.rawName} alone, or ${prev.rawName}=true|false)`);
    } else positionals.push(t.value);
  }
  if (positionals.length > 0) problems.push(`unexpected argument "${positionals[0]}"`);
  if (parsed.values["help"] && problems.length === 0) return { help: true };
  const out: Record<string, unknown> = {};
  const notes: FlagNote[] = [];
  for (const f of SERVE_FLAGS) {
    const raw = values.get(f.name) ?? f.default;
    try {
      if (f.bare && raw !== undefined) out[f.field ?? f.name] = bool(f.name)(raw);
      else out[f.field ?? f.name] = raw === undefined ? undefined : f.parse ? f.parse(raw) : raw;
    } catch (err) {
      problems.push((err as Error).message);
    }
  }
  // --plugin_config: its keys set other flags' values unless those flags are given too (OVMS's Doubled rule).
  const given = new Set(values.keys());
  if (values.has("plugin_config")) {
    const plugin = parsePluginConfig(values.get("plugin_config")!, given);
    problems.push(...plugin.problems);
    notes.push(...plugin.notes);
    if (plugin.kvCachePrecision !== undefined) out["kv_cache_precision"] = plugin.kvCachePrecision;
    if (plugin.threads !== undefined) out["engine_threads"] = plugin.threads;
    if (plugin.cacheDir !== undefined) out["cache_dir"] = plugin.cacheDir;
    // The object as given: the OpenVINO engine applies every key (cli/engine-choice.ts).
    if (plugin.raw !== undefined) out["pluginConfig"] = plugin.raw;
    if (plugin.openvinoOnlyKv !== undefined) out["pluginOpenvinoOnlyKv"] = plugin.openvinoOnlyKv;
  }
  if (problems.length > 0) throw new Error(problems.join("; "));
  out["kv_cache_precision"] ??= "f16";
  out["engine_threads"] ??= defaultEngineThreads(host);
  const threads = out["engine_threads"] as number;
  if (!given.has("engine_threads") && threads === defaultEngineThreads(host)) {
    notes.push({ level: "info", msg: `engine threads: ${threads} (${host.physicalCores} physical cores, ${host.logicalCpus} CPUs; rule: ${ENGINE_THREADS_RULE})` });
  } else if (threads > host.logicalCpus) {
    // More threads than CPUs oversubscribes the cores (bench/threads.mjs: 0.01–0.03× of the best on 2 shared cores).
    notes.push({ level: "warn", msg: `engine threads: ${threads}, more than this host's ${host.logicalCpus} CPUs: expect a large slowdown (rule for the default: ${ENGINE_THREADS_RULE})` });
  } else {
    notes.push({ level: "info", msg: `engine threads: ${threads} (set; ${host.physicalCores} physical cores, ${host.logicalCpus} CPUs)` });
  }
  if (given.has("cache_interval_multiplier")) {
    notes.push({ engine: "llama.cpp", level: "info", msg: `--cache_interval_multiplier ${out["cache_interval_multiplier"]} is a no-op here: it sets the state-block interval of linear-attention models in OpenVINO GenAI; llama.cpp keeps every token's KV for attention models and one state per sequence for recurrent ones` });
    notes.push({ engine: "openvino", level: "info", msg: `--cache_interval_multiplier ${out["cache_interval_multiplier"]} is a no-op here: OpenVINO GenAI uses it only for linear-attention (hybrid) models with prefix caching, and Keel runs hybrid models without prefix caching (the seed's preemption assert)` });
  }
  if (given.has("rest_workers")) {
    notes.push({ level: "info", msg: `--rest_workers ${out["rest_workers"]} is a no-op here: Keel's gateway is one event loop without a worker pool; concurrency is bounded by --max_num_seqs and --max_queued_requests` });
  }
  if (given.has("pipeline_type")) notes.push({ level: "info", msg: `--pipeline_type ${out["pipeline_type"]}: Keel runs continuous batching (LM_CB) for every text model` });
  if (given.has("dynamic_split_fuse")) {
    notes.push({
      level: "info",
      msg: out["dynamic_split_fuse"]
        ? "--dynamic_split_fuse true: long prompts are prefilled in chunks of --max_num_batched_tokens, interleaved with decoding"
        : `--dynamic_split_fuse false: prompts longer than --max_num_batched_tokens (${out["max_num_batched_tokens"]}) are refused with 400, as OVMS`,
    });
  }
  out["notes"] = notes;
  out["given"] = given;
  if ((out["max_num_batched_tokens"] as number) < (out["max_num_seqs"] as number)) {
    throw new Error(`--max_num_batched_tokens (${out["max_num_batched_tokens"]}) must be >= --max_num_seqs (${out["max_num_seqs"]})`);
  }
  if (out["deterministic"] === true) {
    // Deterministic mode turns off what changes the numerics between two runs of one request; an explicit request
    // for one of those contradicts it.
    if (values.get("enable_prefix_caching") === "true") throw new Error("--deterministic true turns prefix reuse off; it contradicts --enable_prefix_caching true");
    if (values.get("flash_attention") === "true") throw new Error("--deterministic true needs flash attention off; it contradicts --flash_attention true");
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

/** The model check found no GPU backend although --target_device asked for one. */
export class NoGpuError extends Error {}

/** The event of the engine's fatal line when a GPU was required and none loads (engine/main.ts). */
const NO_GPU_EVENT = "no_gpu_backend";

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
export async function validateModel(config: Omit<EngineConfig, "mode">, command: EngineCommand = DEFAULT_ENGINE_COMMAND): Promise<ModelMetadata & { backend?: EngineBackend }> {
  let run = await runModelCheck(config, command);
  if (run.signal && KILL_SIGNALS.has(run.signal)) run = await runModelCheck(config, command);
  const { code, signal, stdout, stderr } = run;
  if (code === 0) {
    const line = stdout.trim().split("\n").pop() ?? "";
    const result = JSON.parse(line) as { metadata: ModelMetadata; backend?: EngineBackend };
    return result.backend ? { ...result.metadata, backend: result.backend } : result.metadata;
  }
  if (stderr.includes(`"event":"${NO_GPU_EVENT}"`)) {
    // Asked for a GPU, none loads: say so plainly (no model verdict, no silent CPU fallback). The OpenVINO engine
    // names its own cause (its GPU plugin needs an Intel GPU and its OpenCL runtime).
    const line = stderr.split("\n").find((l) => l.includes(`"event":"${NO_GPU_EVENT}"`)) ?? "";
    const openvino = line.includes("OpenVINO");
    const why = openvino
      ? `OpenVINO's GPU plugin cannot run here (it needs an Intel GPU and its OpenCL driver: ${/lib[\w.]*\.so[.\d]*: cannot open shared object file/.exec(line)?.[0] ?? "see the engine log"})`
      : "no GPU backend loads on this machine (node-llama-cpp's prebuilt CUDA, Vulkan and Metal backends were tried)";
    throw new NoGpuError(`--target_device GPU: ${why}; run on the CPU with --target_device CPU, or use --target_device AUTO to take a GPU only when one loads`);
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
  // --cache_dir: where downloaded models are kept (model-cache.ts reads KEEL_CACHE_DIR).
  if (flags["cache_dir"] !== undefined) process.env["KEEL_CACHE_DIR"] = path.resolve(flags["cache_dir"] as string);
  const logFormat = (flags["log_format"] as LogFormat | undefined) ?? defaultLogFormat(process.stdout.isTTY === true);
  let logSink: ReturnType<typeof logDestination>;
  try {
    logSink = logDestination({ format: logFormat, path: flags["log_path"] as string | undefined });
    // With a log file nothing else is printed: say once, on stderr, where the log goes.
    if (flags["log_path"] !== undefined) process.stderr.write(`keel serve: logging to ${path.resolve(flags["log_path"] as string)} (${logFormat})\n`);
  } catch (err) {
    process.stderr.write(`keel serve: --log_path ${String(flags["log_path"])} cannot be opened: ${(err as Error).message}\n`);
    process.exit(2);
  }
  // The API key is read before the model loads: an unreadable key file is a startup error, not a late surprise.
  let apiKey: string | null;
  try {
    apiKey = loadApiKey(flags["apiKeyFile"] as string | undefined, process.env);
  } catch (err) {
    process.stderr.write(`keel serve: ${(err as Error).message}\n`);
    process.exit(2);
  }
  const cors = { origins: flags["allowedOrigins"] as string[], methods: flags["allowedMethods"] as string[], headers: flags["allowedHeaders"] as string[], credentials: (flags["allowCredentials"] as boolean | undefined) ?? false };
  // Several models from an OVMS config file: each gets its own engine (cli/serve-config.ts).
  if (flags["configPath"] !== undefined) return (await import("./cli/serve-config.js")).serveFromConfig(flags, engineCommandOverride(), { logDestination: logSink, apiKey, cors, ...(flags["metricsList"] !== undefined ? { metricsList: flags["metricsList"] as string[] } : {}) });
  const sourceFlags = {
    modelPath: flags["model_path"] as string | undefined,
    sourceModel: flags["sourceModel"] as string | undefined,
    modelRepositoryPath: (flags["modelRepositoryPath"] as string | undefined) ?? (process.env["OVMS_MODEL_REPOSITORY_PATH"] || undefined),
    ggufFilename: flags["ggufFilename"] as string | undefined,
    pull: (flags["pull"] as boolean | undefined) ?? false,
    overwriteModels: (flags["overwriteModels"] as boolean | undefined) ?? false,
  };
  const sourceProblem = modelSourceFlagProblem(sourceFlags);
  if (sourceProblem) {
    process.stderr.write(`keel serve: ${sourceProblem}\n`);
    process.exit(2);
  }
  const say = (l: string): void => void process.stderr.write(`keel serve: ${l}\n`);
  let model: ServeModel;
  try {
    model = sourceFlags.sourceModel !== undefined
      ? await resolveHubModel(
          { sourceModel: sourceFlags.sourceModel, repositoryPath: sourceFlags.modelRepositoryPath!, ggufFilename: sourceFlags.ggufFilename, overwrite: sourceFlags.overwriteModels },
          // A bar redrawn in place on a terminal; one line per 10% in a log.
          { log: say, progress: (label) => (process.stderr.isTTY ? ttyProgress((s) => process.stderr.write(s), label) : logProgress(say, label)) },
        )
      : await resolveServeModel(sourceFlags.modelPath, { fetch: { log: say }, ggufFilename: sourceFlags.ggufFilename });
  } catch (err) {
    say((err as Error).message);
    // A malformed --source_model/--gguf_filename is a bad flag value (2); anything else is the model's or the hub's (1).
    process.exit(err instanceof HubError && err.failure === "bad-request" ? 2 : 1);
  }
  if (sourceFlags.pull) {
    // OVMS's --pull: download and exit; the file is only checked to be a GGUF (loading it is serving's job).
    const notGguf = checkModelFile(model.path);
    if (notGguf) {
      say(notGguf);
      process.exit(1);
    }
    say(`${model.kind === "hub" && model.downloaded ? "pulled" : "already pulled"} ${sourceFlags.sourceModel} to ${model.path}`);
    return;
  }
  if (model.kind === "fallback") process.stderr.write(`keel serve: ${model.reason}\nkeel serve: serving the random-weight keel-tiny instead; ${HOW_TO_PASS_A_MODEL}\n`);
  // The engine that serves the model (--engine; cli/engine-choice.ts), and the flags that engine cannot honour.
  let choice: ReturnType<typeof chooseEngine>;
  try {
    choice = chooseEngine(flags["engine"] as EngineFlag, model);
  } catch (err) {
    say((err as Error).message);
    process.exit(2);
  }
  const engineProblems = engineFlagProblems(choice.engine, flags, flags["given"] as Set<string>);
  if (engineProblems.length > 0) {
    say(engineProblems.join("; "));
    process.exit(2);
  }
  const modelPath = choice.modelPath;
  const demo = model.kind === "tiny" || model.kind === "fallback";
  // A GGUF named by the operator gets the cheap magic check; an IR directory is the OpenVINO engine's to check.
  const namedGguf = model.kind === "file" || model.kind === "directory" || model.kind === "hub" || (model.kind === "openvino-ir" && choice.engine === "llama.cpp");
  const notAModel = namedGguf ? checkModelFile(modelPath) : null;
  if (notAModel) {
    process.stderr.write(`keel serve: ${notAModel}\n`);
    process.exit(1);
  }
  const maxNumSeqs = flags["max_num_seqs"] as number;
  const u8 = flags["kv_cache_precision"] === "u8";
  // The engine-neutral start configuration; maxModelLen is settled below.
  const base = engineBaseConfig(flags, modelPath, choice.engine);
  let engineCommand: EngineCommand;
  try {
    engineCommand = await engineCommandFor(choice.engine, engineCommandOverride(), say);
  } catch (err) {
    say((err as Error).message);
    process.exit(1);
  }
  let meta: ModelMetadata & { backend?: EngineBackend };
  try {
    meta = await validateModel({ ...base, maxModelLen: 256 }, engineCommand);
  } catch (err) {
    process.stderr.write(`keel serve: ${(err as Error).message}\n`);
    process.exit(1);
  }
  let maxModelLen: number;
  let capacityNote: string;
  /** The OpenVINO engine's shared KV pool in tokens, when fixed (--num_kv_blocks or --cache_size). */
  let poolTokens: number | undefined;
  try {
    ({ maxModelLen, note: capacityNote, poolTokens } = kvCapacity(meta, { maxModelLen: flags["max_model_len"] as number | undefined, cacheGb: flags["cache_size"] as number, maxNumSeqs, u8, engine: choice.engine, kvBlocks: flags["num_kv_blocks"] as number | undefined, blockTokens: kvBlockTokens(base.device), kvElementBytes: openvinoKvElementBytes(base.device, base.kvCacheType, base.pluginConfig) }));
  } catch (err) {
    process.stderr.write(`keel serve: --${(err as Error).message}\n`);
    process.exit(2);
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
    logDestination: logSink,
    apiKey,
    cors,
    ...(flags["metricsList"] !== undefined ? { metricsList: flags["metricsList"] as string[] } : {}),
  });
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const what = e.code === "EADDRINUSE" ? `port ${flags["rest_port"]} on ${flags["rest_bind_address"]} is already in use` : e.message;
    process.stderr.write(`keel serve: cannot listen: ${what}\n`);
    process.exit(1);
  }
  // llama.cpp: a partition per sequence; OpenVINO: one pool shared by all, in the engine's own KV precision.
  const kvBytes = choice.engine === "openvino" ? null : llamaKvCacheBytes(meta.kvElementsPerToken, base.kvCacheType, maxModelLen, maxNumSeqs);
  gw.log.info(
    { event: "capacity", tokensPerSequence: maxModelLen, sequences: maxNumSeqs, kvBytes, limitedBy: capacityNote, kvCachePrecision: flags["kv_cache_precision"], prefixCaching: base.prefixCaching, ...(choice.engine === "openvino" ? { poolTokens: poolTokens ?? null } : {}) },
    choice.engine === "openvino"
      ? `KV capacity: up to ${maxModelLen} tokens per sequence, ${maxNumSeqs} sequences sharing ${poolTokens !== undefined ? `a pool of ${poolTokens} tokens` : `a pool of ${maxModelLen * maxNumSeqs} tokens (max_model_len x max_num_seqs)`}, limited by ${capacityNote}`
      : `KV capacity: ${maxModelLen} tokens per sequence x ${maxNumSeqs} sequences${kvBytes !== null ? ` = ${(kvBytes / 1e9).toFixed(2)} GB` : ""}, limited by ${capacityNote}`,
  );
  gw.log.info({ event: "engine", engine: choice.engine, why: choice.why, command: engineCommand.command }, `engine ${choice.engine}: ${choice.why}`);
  gw.log.info({ event: "device", targetDevice: base.device, backend: meta.backend ?? null }, `target device ${base.device}: ${choice.engine} runs on ${meta.backend ? (meta.backend.gpu === false ? "cpu" : `${meta.backend.gpu} (${meta.backend.devices.join(", ")})`) : "unknown"}`);
  for (const note of flags["notes"] as FlagNote[]) if (note.engine === undefined || note.engine === choice.engine) gw.log[note.level]({ event: "flag" }, note.msg);
  if (flags["deterministic"]) {
    if (choice.engine === "openvino") gw.log.info({ event: "deterministic", prefixCaching: false }, "deterministic mode: prefix reuse off; the OpenVINO engine's numerics are exact by default on CPU (f32 inference and KV, no dynamic quantisation) unless --plugin_config overrides them");
    else gw.log.info({ event: "deterministic", prefixCaching: false, flashAttention: false, kvCachePrecision: "f16" }, "deterministic mode: the same request and seed give the same text on every run (prefix reuse off)");
  }
  gw.log.info({ event: "security", apiKeyRequired: apiKey !== null, corsOrigins: cors.origins, allowCredentials: cors.credentials }, apiKey !== null ? "API key required on /v1/ and /v3/ routes" : "no API key: every route is open");
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
 * KEEL_ENGINE_COMMAND (a JSON {@link EngineCommand}, e.g. `{"command":"python3","args":["worker.py"]}`): it overrides
 * whichever engine `--engine` chose (tests run fakes this way); null when unset.
 */
function engineCommandOverride(): EngineCommand | null {
  const raw = process.env["KEEL_ENGINE_COMMAND"];
  if (!raw) return null;
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
