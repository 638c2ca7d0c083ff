/**
 * The engine's start configuration: the engine-neutral {@link EngineConfig} of protocol/engine-config.ts (the gateway
 * builds it; any engine receives the same JSON), parsed and mapped onto this engine's llama.cpp adapter.
 */
import type { EngineConfig } from "../protocol/engine-config.js";
import type { LlamaAdapterOptions } from "./llama/adapter.js";

/**
 * The engine-neutral start configuration (protocol/engine-config.ts) mapped onto this engine's adapter: sequences =
 * maxNumSeqs, contextSize = maxModelLen, batchSize = maxNumBatchedTokens, gpu = device.
 */
export function toAdapterOptions(config: EngineConfig): LlamaAdapterOptions {
  return {
    modelPath: config.modelPath,
    sequences: config.maxNumSeqs,
    contextSize: config.maxModelLen,
    batchSize: config.maxNumBatchedTokens,
    threads: config.threads,
    flashAttention: config.flashAttention,
    kvCacheType: config.kvCacheType,
    gpu: config.device,
    kvUnified: config.kvUnified === true,
  };
}

/** Parse the engine's single JSON argument; @throws Error naming what is wrong. */
export function parseEngineConfig(arg: string | undefined): EngineConfig {
  if (arg === undefined) throw new Error("missing the EngineConfig JSON argument (docs/protocol.md, Starting an engine)");
  const c = JSON.parse(arg) as Partial<EngineConfig>;
  const need = (k: keyof EngineConfig, ok: (v: unknown) => boolean): void => {
    if (!ok(c[k])) throw new Error(`EngineConfig.${k} is missing or invalid: ${JSON.stringify(c[k])}`);
  };
  const posInt = (v: unknown): boolean => Number.isSafeInteger(v) && (v as number) > 0;
  need("mode", (v) => v === "serve" || v === "validate");
  need("modelPath", (v) => typeof v === "string" && v.length > 0);
  need("maxNumSeqs", posInt);
  need("maxNumBatchedTokens", posInt);
  need("maxModelLen", posInt);
  need("threads", posInt);
  need("prefixCaching", (v) => typeof v === "boolean");
  need("flashAttention", (v) => typeof v === "boolean");
  need("kvCacheType", (v) => v === "f16" || v === "f32" || v === "q8_0" || v === "q4_0");
  need("maxPromptLen", (v) => v === undefined || posInt(v));
  need("device", (v) => v === "cpu" || v === "auto" || v === "gpu");
  need("warmup", (v) => v === undefined || v === "auto" || v === "on" || v === "off");
  need("kvUnified", (v) => v === undefined || typeof v === "boolean");
  need("promptLookup", (v) => v === undefined || typeof v === "boolean");
  // Fields of another engine are refused, never ignored: llama.cpp has no KV block pool (its KV holds maxModelLen
  // tokens per sequence) and takes no raw OpenVINO properties (the CLI maps the plugin-config keys it understands).
  if (c.kvBlocks !== undefined) throw new Error(`EngineConfig.kvBlocks (--num_kv_blocks ${JSON.stringify(c.kvBlocks)}) is not supported by the llama.cpp engine: it has no shared KV block pool (size its KV with maxModelLen per sequence)`);
  if (c.pluginConfig !== undefined) throw new Error("EngineConfig.pluginConfig (raw OpenVINO properties) is not supported by the llama.cpp engine: the gateway maps the keys llama.cpp understands");
  return c as EngineConfig;
}

