/**
 * What one token's KV cache costs in bytes, for each engine: the one place the start-up capacity rule
 * (cli/kv-capacity.ts), the start log's "KV capacity … GB" and the engine-ready line (gateway/supervision/ready-line.ts)
 * turn a model's KV elements per token into bytes.
 *
 * llama.cpp stores the cache in its KV cache type (a quantized type packs blocks of 32 values with a scale); the
 * OpenVINO engine in an OpenVINO precision, chosen per device (src/engine-openvino/worker.py compile_properties).
 *
 * @module
 */
import type { EngineConfig } from "../protocol/engine-config.js";

/** llama.cpp's KV cache types (q8_0: blocks of 32 values in 34 bytes; q4_0: 32 in 18). */
export const LLAMA_KV_ELEMENT_BYTES = { f16: 2, f32: 4, q8_0: 34 / 32, q4_0: 18 / 32 } as const satisfies Record<EngineConfig["kvCacheType"], number>;

/** OpenVINO's KV precisions. */
export const OPENVINO_KV_ELEMENT_BYTES: Readonly<Record<string, number>> = { f32: 4, f16: 2, bf16: 2, u8: 1, u4: 0.5 };

/** Bytes per token of a model with `kvElementsPerToken` KV elements per token (all layers, K and V), stored at `elementBytes`. */
export function kvBytesPerToken(kvElementsPerToken: number, elementBytes: number): number {
  return kvElementsPerToken * elementBytes;
}

/** Bytes per KV element of the llama.cpp engine for a KV cache type. */
export function llamaKvElementBytes(kvCacheType: EngineConfig["kvCacheType"]): number {
  return LLAMA_KV_ELEMENT_BYTES[kvCacheType];
}

/**
 * Bytes per KV element the OpenVINO engine will use, to turn `--cache_size` GB into pool tokens the way the engine
 * does (src/engine-openvino/worker.py compile_properties): on CPU f32 (its exact numerics), elsewhere the KV cache
 * type; a `KV_CACHE_PRECISION` in `--plugin_config` wins.
 */
export function openvinoKvElementBytes(device: EngineConfig["device"], kvCacheType: EngineConfig["kvCacheType"], pluginConfig?: Record<string, unknown>): number {
  const fromType = { f16: "f16", f32: "f32", q8_0: "u8", q4_0: "u4" }[kvCacheType];
  const fromPlugin = pluginConfig?.["KV_CACHE_PRECISION"];
  // CPU: f32 unless --kv_cache_precision u8 (the worker's exact default; compile_properties in worker.py).
  const kv = typeof fromPlugin === "string" ? fromPlugin.toLowerCase() : device === "cpu" && fromType !== "u8" ? "f32" : fromType;
  return OPENVINO_KV_ELEMENT_BYTES[kv] ?? 2;
}

/** Tokens in one KV block of OpenVINO GenAI: 32 on CPU, 16 on GPU (openvino-engine.md §1). */
export function kvBlockTokens(device: EngineConfig["device"]): number {
  return device === "gpu" ? 16 : 32;
}

/**
 * The llama.cpp engine's whole KV cache in bytes: one partition of `maxModelLen` tokens per sequence; null when the
 * model does not give its KV shape.
 */
export function llamaKvCacheBytes(kvElementsPerToken: number | null, kvCacheType: EngineConfig["kvCacheType"], maxModelLen: number, maxNumSeqs: number): number | null {
  if (kvElementsPerToken === null) return null;
  return Math.round(kvBytesPerToken(kvElementsPerToken, llamaKvElementBytes(kvCacheType)) * maxModelLen * maxNumSeqs);
}
