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

describe("kvCapacity on the OpenVINO engine: one pool shared by every sequence", () => {
  const ov = { cacheGb: 0, maxNumSeqs: 4, u8: false, engine: "openvino" as const, blockTokens: 32 };

  it("--num_kv_blocks: the pool is blocks x 32 tokens; max_model_len defaults to min(trained context, 4096, pool less one block)", () => {
    // The engine keeps one block of headroom for the next token: a sequence may hold 512 - 32 tokens.
    expect(kvCapacity(model, { ...ov, kvBlocks: 16 })).toMatchObject({ maxModelLen: 480, poolTokens: 512 });
    expect(kvCapacity(model, { ...ov, kvBlocks: 1000 })).toMatchObject({ maxModelLen: 4096, poolTokens: 32000 });
    expect(kvCapacity({ ...model, trainContextSize: 2048 }, { ...ov, kvBlocks: 1000 }).maxModelLen).toBe(2048);
    // 16 tokens per block on a GPU.
    expect(kvCapacity(model, { ...ov, kvBlocks: 16, blockTokens: 16 }).poolTokens).toBe(256);
    // The pool is not split per sequence (llama.cpp's rule would give each of 4 sequences a quarter).
    expect(kvCapacity(model, { ...ov, maxNumSeqs: 64, kvBlocks: 16 }).maxModelLen).toBe(480);
  });

  it("an explicit max_model_len longer than the pool less one block is refused (a sequence outgrowing the pool ends IGNORED)", () => {
    expect(kvCapacity(model, { ...ov, kvBlocks: 16, maxModelLen: 480 }).maxModelLen).toBe(480);
    expect(() => kvCapacity(model, { ...ov, kvBlocks: 16, maxModelLen: 481 })).toThrow("max_model_len 481 exceeds what one sequence may hold in the KV pool of 512 tokens (--num_kv_blocks 16 x 32 tokens) less one block of headroom: 480");
    expect(() => kvCapacity(model, { ...ov, kvBlocks: 16, maxModelLen: 40000 })).toThrow(/exceeds the model's trained context/);
  });

  it("--cache_size: the pool is the budget over the KV bytes per token (num_kv_blocks wins); no pool: as llama.cpp without a budget", () => {
    // 0.01 GB / 24576 bytes per token = 406 tokens: 12 whole blocks = 384, one of them headroom.
    expect(kvCapacity(model, { ...ov, cacheGb: 0.01 })).toMatchObject({ maxModelLen: 352, poolTokens: 384 });
    expect(kvCapacity(model, { ...ov, cacheGb: 0.01, kvBlocks: 16 }).poolTokens).toBe(512);
    // The engine's KV element size (f32 on CPU: 4 bytes) halves the tokens of the same budget.
    expect(kvCapacity(model, { ...ov, cacheGb: 0.01, kvElementBytes: 4 }).poolTokens).toBe(Math.floor(1e7 / (12288 * 4) / 32) * 32);
    expect(kvCapacity(model, ov)).toEqual({ maxModelLen: 4096, note: expect.stringContaining("min(trained context 32768, 4096)") });
    // The message starts with the flag (the CLI prints it as --cache_size …).
    expect(() => kvCapacity(model, { ...ov, cacheGb: 0.0001 })).toThrow(/^cache_size 0.0001 gives a KV pool of 0 tokens (.*), too small/);
  });
});
