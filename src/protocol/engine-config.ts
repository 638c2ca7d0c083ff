/**
 * How the gateway starts an engine: the engine-neutral start configuration (passed to the engine executable as its
 * last argument, one JSON object) and the command that runs it. Any engine that speaks docs/protocol.md — the
 * llama.cpp engine in src/engine/, the OpenVINO GenAI worker of issue #11, a fake in tests — is started this way.
 */

/** Start configuration of one engine process. Fields an engine cannot honour make it exit with a `fatal`. */
export interface EngineConfig {
  /** `serve` runs the step loop on fd 3; `validate` only loads the model, prints `{ok, metadata}` and exits 0. */
  mode: "serve" | "validate";
  /** Model file (GGUF) or directory (an engine that serves directories, e.g. OpenVINO IR). */
  modelPath: string;
  /** Sequences decoded together (KV slots). */
  maxNumSeqs: number;
  /** Token budget of one step (decode + prefill). */
  maxNumBatchedTokens: number;
  /** Capacity of one sequence: prompt + generated tokens. */
  maxModelLen: number;
  /** Longest prompt admitted (tokens), optional: set when chunked prefill is off (a prompt must fit one step). */
  maxPromptLen?: number;
  /** Keep finished requests' KV for prefix reuse. */
  prefixCaching: boolean;
  /** CPU threads for the compute backend. */
  threads: number;
  /** Flash attention (off keeps greedy output independent of batching on llama.cpp). */
  flashAttention: boolean;
  /** KV cache element type for K and V. */
  kvCacheType: "f16" | "f32" | "q8_0" | "q4_0";
  /**
   * "cpu" never touches a GPU; "auto" lets the engine pick a GPU backend if one works (else CPU); "gpu" needs a GPU
   * backend: an engine that cannot load one exits with a message naming the device (never a silent CPU fallback).
   */
  device: "cpu" | "auto" | "gpu";
  /**
   * Warm-up before `ready` (`--warmup`; llama.cpp engine): decode one batch of every shape the scheduler produces
   * and clear it, so the first requests pay no GPU pipeline compilation. auto (absent) = on a GPU backend only.
   */
  warmup?: "auto" | "on" | "off";
  /**
   * One KV buffer shared by every sequence (`--kv_unified true`; llama.cpp engine), so a step's prompts of different
   * lengths decode as one graph. Absent = one stream per sequence. An engine that cannot apply it exits (fatal).
   */
  kvUnified?: boolean;
  /**
   * Prompt-lookup speculative decoding for every request that does not set `params.speculation` (`--prompt_lookup`),
   * with OVMS's defaults (5 draft tokens, n-grams up to 3). Absent = off. The OpenVINO engine refuses it.
   */
  promptLookup?: boolean;
  /** 1 for the first engine process of a gateway, then 2, 3, … after restarts (fault injection keys on it). */
  generation?: number;
  /**
   * Fixed KV pool in blocks (`--num_kv_blocks`, OpenVINO engine; a block is 32 tokens on CPU, 16 on GPU). Absent: the
   * pool is `cacheGb` when set, else maxModelLen × maxNumSeqs tokens. The llama.cpp engine refuses it (fatal).
   */
  kvBlocks?: number;
  /** `--cache_size` in GB (10^9 bytes) when given: the OpenVINO engine's fixed KV pool. */
  cacheGb?: number;
  /**
   * `--cache_interval_multiplier` (OpenVINO engine): on a hybrid (linear-attention) model with prefix caching, the
   * linear-attention state is checkpointed every KV block × this many tokens (OpenVINO GenAI's SchedulerConfig field
   * of that name). Absent: OpenVINO's default.
   */
  cacheIntervalMultiplier?: number;
  /**
   * OpenVINO device properties from `--plugin_config`, as given (the OpenVINO engine passes every key to
   * `compile_model`; the llama.cpp engine never receives it: the CLI maps the keys it understands).
   */
  pluginConfig?: Record<string, string | number | boolean>;
  /**
   * Exact numerics (`--deterministic`): the OpenVINO engine runs f32 inference, f32 KV and no dynamic quantisation,
   * so bystanders and resumed streams are token-identical (issue #11; openvino-engine.md §7).
   */
  deterministic?: boolean;
  /** Directory for engine-side caches (the OpenVINO engine's prepared GGUFs and saved IR); absent = ~/.cache/keel. */
  cacheDir?: string;
}

/** The executable that runs an engine: `command ...args <EngineConfig JSON>`, channel on fd 3. */
export interface EngineCommand {
  command: string;
  args: string[];
  /** Extra environment for the engine process (merged over the gateway's). */
  env?: Record<string, string>;
}
