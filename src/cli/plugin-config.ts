/**
 * `--plugin_config` (OVMS: a JSON object of OpenVINO device properties) mapped onto Keel's engine settings.
 * Keys that map are applied; keys without a llama.cpp meaning are warned about (named, not silently dropped); a key
 * that another flag also sets is refused with OVMS's "Doubled … parameter in plugin config." message.
 */

/** What a plugin config sets, plus what the operator must be told. */
export interface PluginSettings {
  /** A KV_CACHE_PRECISION only the OpenVINO engine applies (e.g. bf16); the llama.cpp engine refuses it. */
  openvinoOnlyKv?: string;
  /** KV_CACHE_PRECISION → the KV cache precision flag's values. */
  kvCachePrecision?: "f16" | "u8";
  /** INFERENCE_NUM_THREADS → engine threads. */
  threads?: number;
  /** `prompt_lookup` (OVMS's LLM extra) → the --prompt_lookup switch. */
  promptLookup?: boolean;
  /** CACHE_DIR → the cache directory (as --cache_dir). */
  cacheDir?: string;
  /**
   * Lines to log at start (warn: a key not applied; info: what a key does here). `engine`: the line holds only when
   * that engine serves (the OpenVINO engine applies every key, so llama.cpp's "not applied" lines are not its).
   */
  notes: { level: "info" | "warn"; msg: string; engine?: "llama.cpp" | "openvino" }[];
  /** The object as given: the OpenVINO engine passes every key to OpenVINO (EngineConfig.pluginConfig). */
  raw?: Record<string, unknown>;
  /** Reasons to refuse the command line. */
  problems: string[];
}

/** Keys OVMS also sets from a flag (a key given both ways is "Doubled"), mapped to that flag's name. */
const FLAG_OF_KEY: Record<string, string> = {
  KV_CACHE_PRECISION: "kv_cache_precision",
  INFERENCE_NUM_THREADS: "engine_threads",
  CACHE_DIR: "cache_dir",
  MAX_PROMPT_LEN: "max_prompt_len",
  MODEL_DISTRIBUTION_POLICY: "model_distribution_policy",
  prompt_lookup: "prompt_lookup",
};

/** OpenVINO properties that only tune OpenVINO's own runtime: no llama.cpp meaning, warned. */
const OPENVINO_ONLY = new Set(["PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_PRECISION_HINT", "EXECUTION_MODE_HINT", "AFFINITY", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "KV_CACHE_GROUP_SIZE", "ENABLE_HYPER_THREADING", "SCHEDULING_CORE_TYPE", "MODEL_PRIORITY"]);

const asBool = (v: unknown): boolean | null => (v === true || v === "true" || v === "YES" ? true : v === false || v === "false" || v === "NO" ? false : null);

/**
 * Parse `--plugin_config`. @param flagsGiven flag names given on the command line (for the Doubled rule).
 */
export function parsePluginConfig(raw: string, flagsGiven: ReadonlySet<string>): PluginSettings {
  const out: PluginSettings = { notes: [], problems: [] };
  let obj: unknown;
  try {
    obj = JSON.parse(raw);
  } catch (err) {
    out.problems.push(`--plugin_config is not valid JSON: ${(err as Error).message}`);
    return out;
  }
  if (typeof obj !== "object" || obj === null || Array.isArray(obj)) {
    // Named by kind, not echoed: a deeply nested array would overflow JSON.stringify's stack.
    const kind = Array.isArray(obj) ? "an array" : obj === null ? "null" : `a ${typeof obj}`;
    out.problems.push(`--plugin_config must be a JSON object, got ${kind}`);
    return out;
  }
  out.raw = obj as Record<string, unknown>;
  out.notes.push({ level: "info", msg: `--plugin_config: every key is passed to OpenVINO as given (${Object.keys(out.raw).join(", ") || "none"})`, engine: "openvino" });
  // 1. Each key in turn: doubled, mapped, or warned.
  for (const [key, value] of Object.entries(obj as Record<string, unknown>)) {
    const flag = FLAG_OF_KEY[key];
    if (flag !== undefined && flagsGiven.has(flag)) {
      out.problems.push(`Doubled ${key} parameter in plugin config (--${flag} sets it too; give it once)`);
      continue;
    }
    switch (key) {
      case "KV_CACHE_PRECISION":
        if (value === "u8" || value === "f16") out.kvCachePrecision = value;
        // Another precision (bf16, f32, u4…) is OpenVINO's to apply: passed as is on that engine, refused with
        // llama.cpp once the engine is known (engine-choice.ts engineFlagProblems).
        else if (typeof value === "string" && value !== "") out.openvinoOnlyKv = value;
        else out.problems.push(`--plugin_config KV_CACHE_PRECISION must be a precision name such as "u8", "f16" or "bf16", got ${JSON.stringify(value)}`);
        break;
      case "INFERENCE_NUM_THREADS":
        if (Number.isSafeInteger(value) && (value as number) >= 1 && (value as number) <= 512) out.threads = value as number;
        else if (value === 0) out.notes.push({ level: "info", msg: "--plugin_config INFERENCE_NUM_THREADS 0 means the default (as OpenVINO): the engine threads rule of --help applies" });
        else out.problems.push(`--plugin_config INFERENCE_NUM_THREADS must be an integer between 0 and 512, got ${JSON.stringify(value)}`);
        break;
      case "ENABLE_CPU_PINNING": {
        const pin = asBool(value);
        if (pin === null) out.problems.push(`--plugin_config ENABLE_CPU_PINNING must be true or false, got ${JSON.stringify(value)}`);
        else if (pin) out.notes.push({ level: "warn", msg: "--plugin_config ENABLE_CPU_PINNING true is not applied: Keel does not pin llama.cpp's threads to cores (the OS schedules them; start Keel under taskset/numactl to pin)", engine: "llama.cpp" });
        else out.notes.push({ level: "info", msg: "--plugin_config ENABLE_CPU_PINNING false: as Keel always runs, llama.cpp's threads are not pinned to cores (the OS schedules them)", engine: "llama.cpp" });
        break;
      }
      case "prompt_lookup": {
        const on = asBool(value);
        if (on === null) out.problems.push(`--plugin_config prompt_lookup must be true or false, got ${JSON.stringify(value)}`);
        else out.promptLookup = on;
        break;
      }
      case "CACHE_DIR":
        if (typeof value === "string" && value !== "") out.cacheDir = value;
        else out.problems.push(`--plugin_config CACHE_DIR must be a directory path, got ${JSON.stringify(value)}`);
        break;
      case "MAX_PROMPT_LEN":
      case "MODEL_DISTRIBUTION_POLICY":
        out.problems.push(`--plugin_config ${key} is not supported: see --${flag} in --help`);
        break;
      default:
        out.notes.push({
          engine: "llama.cpp",
          level: "warn",
          msg: OPENVINO_ONLY.has(key)
            ? `--plugin_config ${key} is an OpenVINO runtime property with no llama.cpp equivalent; not applied`
            : `--plugin_config ${key} is not a property Keel knows; not applied (known: KV_CACHE_PRECISION, INFERENCE_NUM_THREADS, ENABLE_CPU_PINNING, CACHE_DIR, prompt_lookup)`,
        });
    }
  }
  return out;
}
