/**
 * Which engine serves a model (`--engine auto | llama.cpp | openvino`), what its start configuration gets from the
 * OpenVINO-only flags, which flags an engine refuses, and the command that runs it. One rule for `keel serve` flags
 * (cli/serve.ts) and `--config_path` entries (cli/serve-config.ts).
 *
 * auto: an OpenVINO IR directory (`openvino_model.xml`) → openvino; a GGUF → llama.cpp. `--engine openvino` serves a
 * GGUF too (OpenVINO GenAI loads llama/qwen2/qwen3 GGUFs); `--engine llama.cpp` cannot serve an IR directory.
 *
 * @module
 */
import path from "node:path";
import { DEFAULT_ENGINE_COMMAND } from "../gateway/supervision/engine-client.js";
import { ensureOpenvinoVenv, openvinoEngineCommand } from "../engine-openvino/venv.js";
import { modelCacheDir } from "../model/model-cache.js";
import { decodeOverlapSwitch, nativeSamplingSwitch } from "../native/loader.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";
import type { EngineFlag, EngineName } from "./flag-table.js";
import type { ServeOptions } from "./flags.js";

/** `--warmup`'s values → EngineConfig.warmup. */
const WARMUP_MODES = { auto: "auto", true: "on", false: "off" } as const;

/** The model as the choice sees it (a ServeModel): a GGUF file, or an IR directory (kind "openvino-ir", and a GGUF next to it or null). */
export interface ModelToServe {
  kind: string;
  path: string;
  gguf?: string | null;
}

/** The engine that serves a model, the path it loads, and why (for the start log). */
export interface EngineChoice {
  engine: EngineName;
  /** What the engine loads: a GGUF file or an IR directory. */
  modelPath: string;
  why: string;
}

/**
 * Pick the engine for `model` under `--engine flag`.
 * @throws Error (a bad flag combination, exit 2) when llama.cpp is asked to serve an IR directory without a GGUF
 */
export function chooseEngine(flag: EngineFlag, model: ModelToServe): EngineChoice {
  if (model.kind === "openvino-ir") {
    const ir = { path: model.path, gguf: model.gguf ?? null };
    if (flag !== "llama.cpp") return { engine: "openvino", modelPath: ir.path, why: flag === "auto" ? "an OpenVINO IR directory (--engine auto)" : "--engine openvino" };
    if (ir.gguf !== null) return { engine: "llama.cpp", modelPath: ir.gguf, why: `--engine llama.cpp: the GGUF next to the IR (${path.basename(ir.gguf)})` };
    throw new Error(`--engine llama.cpp cannot serve ${ir.path}: it is an OpenVINO IR directory (openvino_model.xml) and llama.cpp serves GGUF files only; use --engine openvino (or auto), or pass a GGUF file`);
  }
  if (flag === "openvino") return { engine: "openvino", modelPath: model.path, why: "--engine openvino (OpenVINO GenAI loads the GGUF)" };
  return { engine: "llama.cpp", modelPath: model.path, why: flag === "auto" ? "a GGUF file (--engine auto)" : "--engine llama.cpp" };
}

/**
 * `KEEL_DECODE_OVERLAP` (design.md, "Keel's native addon"), checked before any engine starts: a value that is not
 * on/off, or `on` where nothing can overlap (the OpenVINO engine; `--target_device CPU`), is refused by name rather
 * than failing at model load or being ignored.
 */
function overlapProblems(engine: EngineName, f: ServeOptions, env: NodeJS.ProcessEnv): string[] {
  const raw = env["KEEL_DECODE_OVERLAP"];
  const value = decodeOverlapSwitch(raw);
  if (value === "invalid") return [`KEEL_DECODE_OVERLAP=${JSON.stringify(raw)} is not on/off (1/0, true/false, yes/no)`];
  if (value === "off") return [];
  if (engine === "openvino") return ["KEEL_DECODE_OVERLAP=on applies to the llama.cpp engine on a GPU; the OpenVINO engine has no such overlap, so it is refused with --engine openvino"];
  if (f.target_device === "cpu") return ["KEEL_DECODE_OVERLAP=on overlaps host work with a GPU's decode; with --target_device CPU there is none (on the CPU it was measured slower), so it is refused: pass --target_device GPU or AUTO"];
  return [];
}

/**
 * Flags the chosen engine cannot honour (refused, exit 2; never accepted and ignored).
 * @param f the options (or a config entry's, its settings on top); `given` the flag names set explicitly
 */
export function engineFlagProblems(engine: EngineName, f: ServeOptions, given: ReadonlySet<string>, env: NodeJS.ProcessEnv = process.env): string[] {
  const problems: string[] = [...overlapProblems(engine, f, env)];
  // KEEL_MODEL_CHECK_CACHE (cli/model-check-cache.ts): on unless off, read as every on/off switch; anything else refused.
  const checkCache = env["KEEL_MODEL_CHECK_CACHE"];
  if (nativeSamplingSwitch(checkCache) === "invalid") problems.push(`KEEL_MODEL_CHECK_CACHE=${JSON.stringify(checkCache)} is not on/off (1/0, true/false, yes/no)`);
  if (engine === "llama.cpp") {
    if (f.num_kv_blocks !== undefined) {
      problems.push("--num_kv_blocks sets the OpenVINO engine's shared KV block pool; the llama.cpp engine has none (its KV is one partition per sequence: size it with --cache_size or --max_model_len), so it is refused with the llama.cpp engine (use --engine openvino)");
    }
    // The shared buffer is set through Keel's addon: a switch to node-llama-cpp's contradicts the flag.
    if (f.kv_unified && nativeSamplingSwitch(env["KEEL_NATIVE_SAMPLING"]) === "off") {
      problems.push(`--kv_unified true is set through Keel's native addon; KEEL_NATIVE_SAMPLING=${env["KEEL_NATIVE_SAMPLING"]} runs node-llama-cpp's own, which has no such option`);
    }
    if (f.kv_unified && f.deterministic) {
      problems.push("--deterministic true needs one KV stream per sequence on the llama.cpp engine (a shared buffer groups a sequence's attention sums differently); it contradicts --kv_unified true");
    }
    if (f.prompt_lookup && f.deterministic) {
      problems.push("--prompt_lookup true verifies draft tokens in multi-token batches whose numerics may differ from one-token steps; it contradicts --deterministic true");
    }
    if (f.pluginOpenvinoOnlyKv !== undefined) {
      problems.push(`--plugin_config KV_CACHE_PRECISION ${JSON.stringify(f.pluginOpenvinoOnlyKv)} is an OpenVINO precision; the llama.cpp engine takes "u8" or "f16" (q8_0 or f16 KV cache)`);
    }
    return problems;
  }
  // `false` is what the OpenVINO engine does (no warm-up decodes; it compiles its model at load), as `--prompt_lookup
  // false` is accepted; `true` asks for something it cannot do.
  if (given.has("warmup") && f.warmup === "true") {
    problems.push("--warmup true is a llama.cpp setting (it decodes every batch shape before ready); the OpenVINO engine compiles its model at load and runs no warm-up decodes, so it is refused with --engine openvino (false is accepted)");
  }
  // `true` is what the OpenVINO engine's KV is (one block pool shared by every sequence); `false` asks for streams it does not have.
  if (given.has("kv_unified") && !f.kv_unified) {
    problems.push("--kv_unified false is a llama.cpp setting (one KV stream per sequence); the OpenVINO engine's KV is one block pool shared by every sequence, so it is refused with --engine openvino (true is accepted)");
  }
  if (f.prompt_lookup) {
    problems.push("--prompt_lookup (or --plugin_config prompt_lookup) is applied by the llama.cpp engine only; the OpenVINO engine is started without prompt-lookup decoding, so it is refused with --engine openvino");
  }
  if (f.flash_attention && given.has("flash_attention")) {
    problems.push("--flash_attention is a llama.cpp setting; the OpenVINO engine chooses its attention kernels itself, so it is refused with --engine openvino");
  }
  const plugin = f.pluginConfig;
  const inexact = ["INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE"].filter((k) => plugin?.[k] !== undefined);
  if (f.deterministic && inexact.length > 0) {
    // The engine's exact numerics are those three keys' defaults: setting one would silently void --deterministic.
    problems.push(`--deterministic true needs the OpenVINO engine's exact numerics; --plugin_config ${inexact.join(", ")} contradicts it`);
  }
  for (const [key, value] of Object.entries(plugin ?? {})) {
    if (typeof value !== "string" && typeof value !== "number" && typeof value !== "boolean") {
      problems.push(`--plugin_config ${key}: the OpenVINO engine passes each key to OpenVINO as a string, number or boolean, got ${Array.isArray(value) ? "an array" : value === null ? "null" : "an object"}`);
    }
  }
  return problems;
}

/**
 * The OpenVINO-only fields of the engine configuration (protocol/engine-config.ts) from the flags: `--num_kv_blocks`
 * → kvBlocks, `--cache_size` > 0 → cacheGb, `--cache_interval_multiplier` → cacheIntervalMultiplier, `--plugin_config` as given → pluginConfig, `--deterministic` →
 * deterministic, and the engine-side cache directory. None of them for llama.cpp (it refuses kvBlocks and never
 * receives the raw plugin config: the CLI maps the keys it understands).
 */
export function openvinoConfigFields(engine: EngineName, f: ServeOptions, env: NodeJS.ProcessEnv = process.env): Partial<EngineConfig> {
  if (engine !== "openvino") return {};
  const out: Partial<EngineConfig> = { deterministic: f.deterministic, cacheDir: path.dirname(modelCacheDir(env)) };
  if (f.num_kv_blocks !== undefined) out.kvBlocks = f.num_kv_blocks;
  if (f.cache_size > 0) out.cacheGb = f.cache_size;
  if (f.cache_interval_multiplier !== undefined) out.cacheIntervalMultiplier = f.cache_interval_multiplier;
  if (f.pluginConfig !== undefined) out.pluginConfig = f.pluginConfig as Record<string, string | number | boolean>;
  return out;
}

/**
 * The command that runs `engine`: `override` (KEEL_ENGINE_COMMAND, parsed by the caller) wins over everything; the
 * OpenVINO engine's venv is built first when missing (logged through `log`).
 * @throws OpenvinoVenvError when the venv cannot be built
 */
export async function engineCommandFor(engine: EngineName, override: EngineCommand | null, log: (line: string) => void): Promise<EngineCommand> {
  if (override !== null) return override;
  if (engine === "llama.cpp") return DEFAULT_ENGINE_COMMAND;
  return openvinoEngineCommand(await ensureOpenvinoVenv({ log }));
}

/**
 * The engine-neutral start configuration (protocol/engine-config.ts) from parsed `keel serve` flags, for one model
 * served by `engine` — the one place both the flags path (cli/serve.ts) and `--config_path` (cli/serve-config.ts) build it;
 * maxModelLen is settled by the caller (kvCapacity) once the model's metadata is known.
 */
export function engineBaseConfig(f: ServeOptions, modelPath: string, engine: EngineName): Omit<EngineConfig, "mode" | "maxModelLen"> {
  const u8 = f.kv_cache_precision === "u8";
  return {
    modelPath,
    maxNumSeqs: f.max_num_seqs,
    maxNumBatchedTokens: f.max_num_batched_tokens,
    threads: f.engine_threads,
    // A quantized V cache needs flash attention in llama.cpp (docs/upstream.md).
    flashAttention: u8 ? true : f.flash_attention,
    kvCacheType: u8 ? "q8_0" : "f16",
    // --deterministic turns prefix reuse off (parseServeFlags already does for the flags path).
    prefixCaching: f.deterministic ? false : f.enable_prefix_caching,
    // Split-fuse off (OVMS): a prompt must fit one step.
    ...(f.dynamic_split_fuse === false ? { maxPromptLen: f.max_num_batched_tokens } : {}),
    device: f.target_device,
    ...(engine === "llama.cpp" ? { warmup: WARMUP_MODES[f.warmup] } : {}),
    ...(engine === "llama.cpp" && f.kv_unified ? { kvUnified: true } : {}),
    ...(f.prompt_lookup && engine === "llama.cpp" ? { promptLookup: true } : {}),
    ...openvinoConfigFields(engine, f),
  };
}
