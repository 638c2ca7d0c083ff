/**
 * Every `keel serve` flag: its name, help line, default (as written) and value schema, Keel's own first, then OVMS's
 * (accepted with their meaning, or refused). The typed options (`FlagValues`) are derived from this table, so a flag
 * added here is parsed, typed and listed by `--help` at once.
 *
 * @module
 */
import { metricFamilies } from "../gateway/metrics/metrics.js";
import { parseCsvFlag } from "../gateway/http/cors.js";
import { REASONING_PARSERS, TOOL_PARSERS } from "../gateway/tools.js";
import { CACHE_ROOT_RULE } from "../model/model-cache.js";
import { ENGINE_THREADS_RULE } from "./engine-threads.js";
import { bool, checked, gb, int, must, oneOf, parseTargetDevice, refused, text, type FlagValue } from "./flag-values.js";

/** The engines Keel runs. */
export const ENGINES = ["llama.cpp", "openvino"] as const;
/** One engine. */
export type EngineName = (typeof ENGINES)[number];
/** `--engine`'s values. */
export const ENGINE_FLAG_VALUES = ["auto", ...ENGINES] as const;
export type EngineFlag = (typeof ENGINE_FLAG_VALUES)[number];

/**
 * The metric families `--metrics_list` may name: every family /metrics exports (keel_*, vllm:*, ovms_*, process_*,
 * nodejs_*). Listed on first use: listing starts the process metrics' collectors, which a command that never serves
 * does not need.
 */
let families: readonly string[] | null = null;
export function metricFamilyNames(): readonly string[] {
  return (families ??= metricFamilies());
}

/** One `keel serve` flag. */
export interface FlagSpec<N extends string = string, T = unknown, D extends string | undefined = string | undefined> {
  name: N;
  help: string;
  /** The value when the flag is not given, as it would be written (`--help` shows it); undefined: unset. */
  default: D;
  /** Parse and check the written value; its problems name the flag. */
  value: FlagValue<T>;
  /** An OVMS switch that takes no value: `--pull` alone means true; `--pull=false` also works. */
  bare?: boolean;
  /** Key of the value in the options when not the flag's name (the camelCase fields other modules wire). */
  field?: string;
}

function flag<const N extends string, T, const D extends string | undefined>(name: N, help: string, def: D, value: FlagValue<T>): FlagSpec<N, T, D> {
  return { name, help, default: def, value };
}

/** A switch (`--pull`, `--pull=true|false`), unset unless given. */
function switchFlag<const N extends string, const F extends string>(name: N, help: string, field: F): FlagSpec<N, boolean, undefined> & { bare: true; field: F } {
  return { name, help, default: undefined, value: bool(name), bare: true, field };
}

const csv = (v: string): string[] => v.split(",").map((s) => s.trim()).filter((s) => s !== "");

/** Every `keel serve` flag with its default, in `--help` order. */
export const SERVE_FLAGS = [
  flag("rest_port", "HTTP port", "8000", int("rest_port", 0, 65535)),
  flag("rest_bind_address", "HTTP bind address", "0.0.0.0", text),
  flag("model_path", "GGUF model file, a model directory holding one (--gguf_filename picks among several), a model name from `keel fetch --list` (fetched and cached on first use), or keel-tiny / keel-tiny-f16 / keel-tiny-qwen3 / keel-tiny-qwen3coder (generated random-weight models; keel-tiny-f16 loads in both engines) (default: qwen2.5-coder-0.5b-instruct, 491 MB on first use; keel-tiny if it cannot be fetched)", undefined, text),
  flag("model_name", "served model name (default: the model's own name, e.g. Qwen2.5-Coder-0.5B-Instruct or keel-tiny, or the model file's base name)", undefined, text),
  flag("max_num_seqs", "sequences decoded together (KV slots)", "8", int("max_num_seqs", 1, 256)),
  flag("max_num_batched_tokens", "token budget of one engine step (>= max_num_seqs)", "256", int("max_num_batched_tokens", 1, 65536)),
  flag("max_model_len", "tokens per sequence (default: min(model's trained context, 4096); with --cache_size: what the budget holds, up to the trained context)", undefined, int("max_model_len", 2, 1 << 20)),
  flag("engine_threads", `CPU threads of the engine (default: ${ENGINE_THREADS_RULE})`, undefined, int("engine_threads", 1, 512)),
  flag("target_device", "CPU; GPU or GPU.0 (a llama.cpp GPU backend, CUDA or Vulkan; exits if none loads); AUTO (a GPU backend if one loads, else CPU; logged)", "CPU", checked(parseTargetDevice)),
  flag("max_queued_requests", "requests allowed to wait for a sequence; beyond it 429 with Retry-After", "256", int("max_queued_requests", 0, 1_000_000)),
  flag("enable_prefix_caching", "keep finished requests' KV and reuse the longest common prefix", "true", bool("enable_prefix_caching")),
  flag("kv_cache_precision", "KV cache precision: f16 (default), or u8 (q8_0 K and V, with flash attention)", undefined, oneOf("kv_cache_precision", ["f16", "u8"])),
  flag("cache_size", "KV cache budget in GB (10^9 bytes) over all sequences (fractions allowed); 0 = max_model_len per sequence", "0", gb("cache_size")),
  flag("engine", "auto (an OpenVINO IR directory → openvino, a GGUF → llama.cpp), llama.cpp, or openvino (OpenVINO GenAI continuous batching in a Python worker; serves GGUF files and IR directories; its venv is built in Keel's cache on first use)", "auto", oneOf("engine", ENGINE_FLAG_VALUES)),
  flag("num_kv_blocks", "OpenVINO engine: a fixed KV pool of N blocks shared by all sequences (32 tokens per block on CPU, 16 on GPU); refused with the llama.cpp engine", undefined, int("num_kv_blocks", 1, 1 << 24)),
  flag("engine_stall_timeout", "seconds without engine progress while there is work before the engine is restarted", "30", int("engine_stall_timeout", 1, 86_400)),
  flag("shutdown_timeout", "seconds in-flight requests may take to finish after SIGTERM/SIGINT", "30", int("shutdown_timeout", 0, 86_400)),
  flag("log_level", "TRACE, DEBUG, INFO, WARNING or ERROR; INFO: one line per request and, while busy, an engine line every 5 s; DEBUG: each request's lifecycle too; TRACE: also one line per engine step (its batch, admissions, first tokens, phase times)", "INFO", oneOf("log_level", ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR"])),
  flag("log_format", "text (one readable line per event) or json (default: text when stdout is a terminal, else json)", undefined, oneOf("log_format", ["text", "json"])),
  flag("log_path", "write the log to this file (appended) instead of stdout", undefined, text),
  flag("request_timeout", "seconds a client may take to send its whole request (headers and body) before it is dropped", "30", int("request_timeout", 1, 3600)),
  flag("max_stream_buffer", "bytes of stream output a client may leave unread before it is treated as disconnected", String(1024 * 1024), int("max_stream_buffer", 1024)),
  flag("max_request_body", "request body limit in bytes", String(8 * 1024 * 1024), int("max_request_body", 1024)),
  flag("flash_attention", "flash attention in llama.cpp (off: the embedded model's greedy output does not depend on batching)", "false", bool("flash_attention")),
  flag("kv_unified", "llama.cpp engine: one KV buffer shared by every sequence (llama-server's --kv-unified), so a step that prefills several prompts of different lengths decodes as one graph, not one per run of equal-length sequences; each token then attends over the buffer's used extent (docs/flags.md)", "false", bool("kv_unified")),
  flag("warmup", "llama.cpp engine: decode one batch of every shape the scheduler produces before ready, so the first requests pay no GPU pipeline compilation: auto (on a GPU backend), true (on CPU too), false", "auto", oneOf("warmup", ["auto", "true", "false"] as const)),
  flag("tool_parser", "tool-call format to parse (and guide): hermes3, qwen3coder, llama3, or auto (from the model's chat template); unset = requests with tools are refused", undefined, oneOf("tool_parser", [...TOOL_PARSERS, "auto"] as const)),
  flag("reasoning_parser", "reasoning format to split into reasoning_content: qwen3 (<think>…</think>); unset = reasoning stays in content", undefined, oneOf("reasoning_parser", REASONING_PARSERS)),
  flag("enable_tool_guided_generation", "constrain tool calls with a grammar under tool_choice auto too (required and a named function are always guided)", "false", bool("enable_tool_guided_generation")),
  flag("prompt_lookup", "prompt-lookup (n-gram) speculative decoding for every request (llama.cpp engine): up to 5 draft tokens copied from the request's own history are verified per step; the tokens plain decoding samples from the same logits (a quantized model's near-tie can flip: docs/speculative.md). Per request: num_assistant_tokens, max_ngram_size", "false", bool("prompt_lookup")),
  flag("deterministic", "same request + seed → same text on every run: prefix reuse off, flash attention off, f16 KV, one KV stream per sequence (see docs/api.md)", "false", bool("deterministic")),
  // OVMS flags with their OVMS meaning (ovms-compat.md §1).
  flag("task", "text_generation (the only task Keel serves)", "text_generation", checked((v) => {
    if (v === "text_generation") return v;
    throw new Error(`--task ${v} is not supported: Keel serves LLM text generation only (--task text_generation)`);
  })),
  flag("pipeline_type", "LM, LM_CB or AUTO: all mean Keel's continuous batching (VLM pipelines are refused)", "AUTO", checked((v) => {
    if (v === "LM" || v === "LM_CB" || v === "AUTO") return v;
    if (v === "VLM" || v === "VLM_CB") throw new Error(`--pipeline_type ${v} is not supported: Keel serves text-only models (LM, LM_CB or AUTO)`);
    throw new Error(`--pipeline_type must be one of LM, LM_CB, AUTO, got "${v}"`);
  })),
  flag("plugin_config", "JSON: KV_CACHE_PRECISION (u8|f16), INFERENCE_NUM_THREADS (engine threads), ENABLE_CPU_PINNING (threads are not pinned: false is Keel's behaviour, true is warned), CACHE_DIR; other keys warned (llama.cpp); the OpenVINO engine passes every key to OpenVINO", undefined, text),
  flag("cache_interval_multiplier", "OVMS: state-block interval of linear-attention models (OpenVINO engine: applied, the checkpoint interval of hybrid models with prefix caching; llama.cpp: a logged no-op)", undefined, int("cache_interval_multiplier", 1)),
  flag("dynamic_split_fuse", "true: long prompts are prefilled in chunks of max_num_batched_tokens; false (as OVMS): a prompt longer than max_num_batched_tokens is refused with 400", "true", bool("dynamic_split_fuse")),
  flag("rest_workers", "OVMS HTTP worker threads (2..10000); accepted and logged: Keel's one event loop has no worker pool (concurrency is bounded by --max_num_seqs and --max_queued_requests)", undefined, int("rest_workers", 2, 10000)),
  flag("cache_dir", `cache directory: Keel keeps downloaded models in <cache_dir>/models (default: ${CACHE_ROOT_RULE})`, undefined, text),
  flag("metrics_enable", "true: /metrics is served (Keel always serves it; false is refused)", "true", checked((v) => {
    if (must(bool("metrics_enable"), v)) return true;
    throw new Error("--metrics_enable false is not supported: Keel always serves /metrics (gateways and probes scrape it)");
  })),
  { ...flag("metrics_list", "comma-separated metric families to export (any family /metrics shows; an unknown name is refused)", undefined, checked((v) => {
    // Each family once: a family exported twice is a second TYPE line, which Prometheus refuses for the whole scrape.
    const names = [...new Set(csv(v))];
    if (names.length === 0) throw new Error("--metrics_list names no metric family: leave it out to export every family (see /metrics)");
    const known = metricFamilyNames();
    const unknown = names.filter((n) => !known.includes(n));
    if (unknown.length > 0) throw new Error(`--metrics_list names unknown metric famil${unknown.length > 1 ? "ies" : "y"} ${unknown.join(", ")} (known: ${known.join(", ")})`);
    return names;
  })), field: "metricsList" },
  flag("port", "OVMS gRPC port: only 0 (Keel serves REST only)", "0", checked((v) => {
    if (must(int("port", 0, 65535), v) === 0) return 0;
    throw new Error(`--port ${v} is not supported: Keel serves no gRPC (OVMS's OpenAI API is REST-only too); use --rest_port`);
  })),
  flag("grpc_bind_address", "refused: no gRPC", undefined, refused("grpc_bind_address", "Keel serves no gRPC; use --rest_bind_address")),
  flag("max_prompt_len", "refused: NPU-only in OVMS", undefined, refused("max_prompt_len", "it is NPU-only in OVMS and Keel has no NPU; a prompt is limited by --max_model_len")),
  flag("model_distribution_policy", "refused: one engine on one device", undefined, refused("model_distribution_policy", "Keel runs each model in one engine process on one device (no tensor or pipeline parallelism)")),
  flag("draft_source_model", "refused: no draft-model speculation (prompt lookup is: --prompt_lookup)", undefined, refused("draft_source_model", "Keel has no draft-model speculative decoding; its speculation is prompt lookup (--prompt_lookup, docs/speculative.md)")),
  flag("allowed_local_media_path", "refused: no image input", undefined, refused("allowed_local_media_path", "Keel serves text-only models (no image input)")),
  flag("allowed_media_domains", "refused: no image input", undefined, refused("allowed_media_domains", "Keel serves text-only models (no image input)")),
  flag("weight-format", "refused: GGUF files carry their quantization", undefined, refused("weight-format", "Keel serves GGUF files whose quantization is fixed in the file; choose a quantized file (--gguf_filename)")),
  flag("extra_quantization_params", "refused: GGUF files carry their quantization", undefined, refused("extra_quantization_params", "Keel does not quantize models; choose a quantized GGUF file (--gguf_filename)")),
  // OVMS flags whose values other modules serve (multi-model config, hub pull, auth, CORS), under camelCase fields.
  { ...flag("config_path", "OVMS JSON config listing several models, each served by its own engine (docs/models.md, \"Several models\")", undefined, text), field: "configPath" },
  { ...flag("source_model", "Hugging Face hub repository ORG/NAME to pull a GGUF from (HF_ENDPOINT, HF_TOKEN honoured) into --model_repository_path/ORG/NAME; served as ORG/NAME unless --model_name", undefined, text), field: "sourceModel" },
  { ...flag("model_repository_path", "directory models are pulled into (default: $OVMS_MODEL_REPOSITORY_PATH)", undefined, text), field: "modelRepositoryPath" },
  switchFlag("pull", "download the --source_model and exit (without it: download if missing, then serve)", "pull"),
  { ...flag("gguf_filename", "the .gguf file to take from a --source_model repository or a --model_path directory holding several", undefined, text), field: "ggufFilename" },
  switchFlag("overwrite_models", "download the --source_model again even when it is already in the repository", "overwriteModels"),
  { ...flag("api_key_file", "file whose first line is the API key required as Authorization: Bearer on /v1/ and /v3/ routes (else env API_KEY; unset = no auth)", undefined, text), field: "apiKeyFile" },
  { ...flag("allowed_origins", "CORS: origins allowed to read responses, comma-separated", "*", checked((v) => parseCsvFlag("allowed_origins", v))), field: "allowedOrigins" },
  { ...flag("allowed_methods", "CORS: methods a preflight allows, comma-separated", "*", checked((v) => parseCsvFlag("allowed_methods", v))), field: "allowedMethods" },
  { ...flag("allowed_headers", "CORS: request headers a preflight allows, comma-separated", "*", checked((v) => parseCsvFlag("allowed_headers", v))), field: "allowedHeaders" },
  switchFlag("allow_credentials", "CORS: send Access-Control-Allow-Credentials: true", "allowCredentials"),
] as const;

type Spec = (typeof SERVE_FLAGS)[number];
type KeyOf<S> = S extends { field: infer F extends string } ? F : S extends { name: infer N extends string } ? N : never;
type ValueOf<S> = S extends FlagSpec<string, infer T, infer D> ? (D extends string ? T : T | undefined) : never;

/** Each flag's parsed value under its name (or `field`): unset flags without a default are undefined. */
export type FlagValues = { -readonly [S in Spec as KeyOf<S>]: ValueOf<S> };

/** The `--help` text: every flag with its default. */
export function usage(): string {
  const lines = ["Usage: keel serve [--flag value | --flag=value ...]", "", "Flags:"];
  for (const f of SERVE_FLAGS as readonly FlagSpec[]) {
    lines.push(`  --${f.name.padEnd(28)} ${f.help}${f.default !== undefined ? ` (default: ${f.default})` : ""}`);
  }
  lines.push("", "Other commands:", "  keel fetch NAME | --list               fetch, verify and cache a real model (see --help there)", "  keel make-model --out FILE [options]   write a tiny random-weight GGUF (see --help there)");
  return lines.join("\n");
}
