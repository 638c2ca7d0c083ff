import { describe, expect, it } from "vitest";
import { kvBlockTokens, kvBytesPerToken, llamaKvCacheBytes, llamaKvElementBytes, openvinoKvElementBytes } from "./kv-bytes.js";

describe("KV bytes per token: one rule for the capacity check, the start log and the engine-ready line", () => {
  it("llama.cpp: f16 2 bytes, f32 4, q8_0 34 per 32 values, q4_0 18 per 32", () => {
    expect([llamaKvElementBytes("f16"), llamaKvElementBytes("f32"), llamaKvElementBytes("q8_0"), llamaKvElementBytes("q4_0")]).toEqual([2, 4, 34 / 32, 18 / 32]);
    expect(kvBytesPerToken(12288, llamaKvElementBytes("f16"))).toBe(24576);
    expect(kvBytesPerToken(12288, llamaKvElementBytes("q8_0"))).toBe(13056);
  });

  it("the llama.cpp cache is a partition of max_model_len tokens per sequence; unknown without the model's KV shape", () => {
    expect(llamaKvCacheBytes(12288, "f16", 4096, 8)).toBe(24576 * 4096 * 8);
    expect(llamaKvCacheBytes(100, "q8_0", 3, 1)).toBe(Math.round(100 * (34 / 32) * 3));
    expect(llamaKvCacheBytes(null, "f16", 4096, 8)).toBeNull();
  });

  it("KV bytes per element as the OpenVINO engine sizes --cache_size: f32 on CPU, the KV type elsewhere, KV_CACHE_PRECISION of --plugin_config first", () => {
    expect(openvinoKvElementBytes("cpu", "f16")).toBe(4);
    expect(openvinoKvElementBytes("gpu", "f16")).toBe(2);
    expect(openvinoKvElementBytes("gpu", "q8_0")).toBe(1);
    expect(openvinoKvElementBytes("gpu", "q4_0")).toBe(0.5);
    expect(openvinoKvElementBytes("cpu", "f16", { KV_CACHE_PRECISION: "u8" })).toBe(1);
    expect(openvinoKvElementBytes("auto", "q8_0", { KV_CACHE_PRECISION: "F16" })).toBe(2);
    expect(openvinoKvElementBytes("gpu", "f16", { KV_CACHE_PRECISION: "bf16" })).toBe(2);
  });

  it("KV blocks are 32 tokens on CPU, 16 on GPU", () => {
    expect([kvBlockTokens("cpu"), kvBlockTokens("auto"), kvBlockTokens("gpu")]).toEqual([32, 32, 16]);
  });
});
