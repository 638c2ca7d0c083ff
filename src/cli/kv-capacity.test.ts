import { describe, expect, it } from "vitest";
import { kvCapacity } from "./kv-capacity.js";

const model = { trainContextSize: 32768, kvElementsPerToken: 12288 }; // 24 KB per token in f16

describe("kvCapacity: one rule for flags and config entries", () => {
  it("without a budget: the explicit length, else min(trained context, 4096); longer than trained is refused", () => {
    expect(kvCapacity(model, { cacheGb: 0, maxNumSeqs: 4, u8: false }).maxModelLen).toBe(4096);
    expect(kvCapacity(model, { maxModelLen: 1000, cacheGb: 0, maxNumSeqs: 4, u8: false }).maxModelLen).toBe(1000);
    expect(() => kvCapacity(model, { maxModelLen: 40000, cacheGb: 0, maxNumSeqs: 4, u8: false })).toThrow("max_model_len 40000 exceeds the model's trained context of 32768 tokens");
  });

  it("the budget decides the length (beyond the 4096 default), bounded by an explicit length and the trained context", () => {
    // 1 GB / 4 sequences / 24576 bytes per token = 10172 tokens.
    expect(kvCapacity(model, { cacheGb: 1, maxNumSeqs: 4, u8: false }).maxModelLen).toBe(10172);
    expect(kvCapacity(model, { cacheGb: 1, maxNumSeqs: 4, u8: true }).maxModelLen).toBe(Math.floor(1e9 / 4 / (12288 * 34 / 32)));
    expect(kvCapacity(model, { maxModelLen: 2000, cacheGb: 1, maxNumSeqs: 4, u8: false }).maxModelLen).toBe(2000);
    expect(kvCapacity(model, { cacheGb: 100, maxNumSeqs: 4, u8: false }).maxModelLen).toBe(32768);
  });

  it("a budget too small, or a model without its KV shape, is refused with the reason", () => {
    expect(() => kvCapacity(model, { cacheGb: 0.0001, maxNumSeqs: 8, u8: false })).toThrow(/cache_size 0.0001 GB gives 0 tokens per sequence for 8 sequences/);
    expect(() => kvCapacity({ ...model, kvElementsPerToken: null }, { cacheGb: 1, maxNumSeqs: 1, u8: false })).toThrow(/needs the model's KV shape/);
  });
});
