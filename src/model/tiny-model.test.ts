import {describe, expect, it} from "vitest";
import {floatToHalfBits, GgufValueType} from "./gguf-writer.js";
import {readGgufHeader} from "./gguf-reader.js";
import {
    buildTinyModel, CHATML_TEMPLATE, FAST_FILL_MIN_ELEMENTS, isBatchInvariantShape, MODEL_SHAPES, NormalRng, resolveTinyModelOptions,
    TINY_MODEL_DEFAULTS, tinyModelSpecialIds, vocabFor
} from "./tiny-model.js";

const small = {layers: 2, hidden: 64, ff: 128, heads: 4, kvHeads: 2, merges: 100} as const;

describe("buildTinyModel", () => {
    it("is byte-identical across builds and sensitive to the seed", () => {
        const a = buildTinyModel();
        const b = buildTinyModel({...TINY_MODEL_DEFAULTS});
        expect(a.equals(b)).toBe(true);
        expect(buildTinyModel({...small, seed: 1}).equals(buildTinyModel({...small, seed: 2}))).toBe(false);
    });

    it("writes the expected metadata and tensors", () => {
        const h = readGgufHeader(buildTinyModel());
        const ids = tinyModelSpecialIds();
        expect(ids).toEqual({bos: 1016, imStart: 1017, eos: 1018, vocabSize: 1019, userTokens: {}});
        const kv = (k: string): unknown => h.kv.get(k)?.value;
        expect(kv("general.architecture")).toBe("llama");
        expect(kv("general.name")).toBe("keel-tiny-llama");
        expect(kv("llama.block_count")).toBe(4);
        expect(kv("llama.embedding_length")).toBe(270);
        expect(kv("llama.feed_forward_length")).toBe(810);
        expect(kv("llama.attention.head_count")).toBe(9);
        expect(kv("llama.attention.head_count_kv")).toBe(3);
        expect(kv("llama.rope.dimension_count")).toBe(30);
        expect(kv("llama.context_length")).toBe(2048);
        expect(kv("tokenizer.ggml.model")).toBe("gpt2");
        expect(kv("tokenizer.ggml.pre")).toBe("gpt-2");
        expect(kv("tokenizer.ggml.add_bos_token")).toBe(false);
        expect(kv("tokenizer.ggml.bos_token_id")).toBe(ids.bos);
        expect(kv("tokenizer.ggml.eos_token_id")).toBe(ids.eos);
        expect(kv("tokenizer.chat_template")).toBe(CHATML_TEMPLATE);
        const tokens = kv("tokenizer.ggml.tokens") as string[];
        expect(tokens).toHaveLength(ids.vocabSize);
        expect(tokens.slice(ids.bos)).toEqual(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
        expect((kv("tokenizer.ggml.merges") as string[]).length).toBe(760);
        expect((kv("tokenizer.ggml.token_type") as number[]).filter((t) => t === 3)).toHaveLength(3);
        expect(h.kv.get("tokenizer.ggml.token_type")?.elemType).toBe(GgufValueType.INT32);
        expect(h.tensors).toHaveLength(2 + 4 * 9 + 1);
        expect(h.tensors.find((t) => t.name === "output.weight")?.ne).toEqual([270, 1019]);
        expect(h.tensors.find((t) => t.name === "blk.0.attn_k.weight")?.ne).toEqual([270, 90]);
    });

    it("zeroes the output-head rows of the control tokens", () => {
        const buf = buildTinyModel(small);
        const h = readGgufHeader(buf);
        const ids = tinyModelSpecialIds(small);
        const out = h.tensors.find((t) => t.name === "output.weight")!;
        const row = (id: number): number[] =>
            Array.from({length: 64}, (_, i) => buf.readFloatLE(h.dataStart + out.offset + 4 * (id * 64 + i)));
        for (const id of [ids.bos, ids.imStart, ids.eos]) expect(row(id).every((x) => x === 0)).toBe(true);
        expect(row(ids.bos - 1).some((x) => x !== 0)).toBe(true);
    });

    it("supports f16, custom templates and crafted broken models", () => {
        const f16 = readGgufHeader(buildTinyModel({...small, f16: true}));
        expect(f16.tensors.find((t) => t.name === "blk.0.attn_q.weight")?.type).toBe(1);
        expect(f16.tensors.find((t) => t.name === "output_norm.weight")?.type).toBe(0);
        expect(readGgufHeader(buildTinyModel({...small, chatTemplate: "{{ x }}"})).kv.get("tokenizer.chat_template")?.value).toBe("{{ x }}");
        expect(readGgufHeader(buildTinyModel({...small, broken: "zero-layers"})).kv.get("llama.block_count")?.value).toBe(0);
        const kv3 = readGgufHeader(buildTinyModel({...small, broken: "kv-heads-3"}));
        expect(kv3.kv.get("llama.attention.head_count_kv")?.value).toBe(3);
        expect(kv3.tensors.find((t) => t.name === "blk.0.attn_k.weight")?.ne).toEqual([64, 48]);
        expect(readGgufHeader(buildTinyModel({...small, broken: "expert-used"})).kv.get("llama.expert_used_count")?.value).toBe(2);
        // with the default 9 heads, 3 KV heads would be valid: the kind switches to 4 heads unless told otherwise
        const kv3d = readGgufHeader(buildTinyModel({layers: 1, merges: 10, broken: "kv-heads-3"}));
        expect(kv3d.kv.get("llama.attention.head_count")?.value).toBe(4);
        expect(kv3d.kv.get("llama.attention.head_count_kv")?.value).toBe(3);
        expect(() => buildTinyModel({heads: 9, hidden: 270, broken: "kv-heads-3"})).toThrow(/not divisible by 3/);
    });

    it("defaults to batch-invariant shapes", () => {
        expect(isBatchInvariantShape()).toBe(true);
        expect(isBatchInvariantShape({hidden: 256, heads: 4, kvHeads: 2, ff: 768})).toBe(false);
        expect(isBatchInvariantShape({ff: 812})).toBe(false);
    });

    it("validates options", () => {
        expect(() => resolveTinyModelOptions({hidden: 100, heads: 3})).toThrow(/divisible/);
        expect(() => resolveTinyModelOptions({hidden: 256, heads: 4, kvHeads: 3})).toThrow(/kvHeads/);
        expect(() => resolveTinyModelOptions({layers: 0})).toThrow(/layers/);
        expect(() => resolveTinyModelOptions({broken: "nope" as never})).toThrow(/broken/);
    });
});

describe("buildTinyModel with a generated vocabulary (--vocab)", () => {
    it("has exactly `vocab` tokens: corpus merges, generated merges, control tokens, user tokens", () => {
        const opts = {...small, vocab: 5000, userTokens: ["<think>"]};
        const ids = tinyModelSpecialIds(opts);
        expect(ids.vocabSize).toBe(5000);
        expect(ids.userTokens["<think>"]).toBe(4999);
        expect([ids.bos, ids.imStart, ids.eos]).toEqual([4996, 4997, 4998]);
        const h = readGgufHeader(buildTinyModel(opts));
        const tokens = h.kv.get("tokenizer.ggml.tokens")?.value as string[];
        expect(tokens).toHaveLength(5000);
        expect(tokens.slice(ids.bos)).toEqual(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]);
        expect(tokens.slice(256, 356)).toEqual(vocabFor(100).mergedTokens); // the corpus merges come first
        expect((h.kv.get("tokenizer.ggml.merges")?.value as string[]).length).toBe(5000 - 256 - 4);
        expect(h.kv.get("llama.vocab_size")?.value).toBe(5000);
        expect(h.tensors.find((t) => t.name === "token_embd.weight")?.ne).toEqual([64, 5000]);
        expect(h.tensors.find((t) => t.name === "output.weight")?.ne).toEqual([64, 5000]);
    });

    it("refuses a vocabulary smaller than the corpus gives; models without --vocab resolve as before", () => {
        expect(() => tinyModelSpecialIds({merges: 100, vocab: 300})).toThrow(/vocab too small/);
        expect(() => resolveTinyModelOptions({vocab: 0})).toThrow(/vocab/);
        expect(Object.keys(resolveTinyModelOptions())).not.toContain("vocab");
        expect(MODEL_SHAPES["qwen2.5-0.5b"].vocab).toBeGreaterThanOrEqual(150_000);
    });
});

describe("weight generators", () => {
    const std = (a: ArrayLike<number>): {mean: number; sd: number} => {
        let s = 0, s2 = 0;
        for (let i = 0; i < a.length; i++) { s += a[i]!; s2 += a[i]! * a[i]!; }
        const mean = s / a.length;
        return {mean, sd: Math.sqrt(s2 / a.length - mean * mean)};
    };

    it("small tensors keep the exact Box-Muller stream (the tiny models' bytes do not change)", () => {
        const buf = buildTinyModel(small);
        const h = readGgufHeader(buf);
        const t = h.tensors.find((x) => x.name === "blk.1.ffn_down.weight")!;
        const rng = new NormalRng(TINY_MODEL_DEFAULTS.seed, "blk.1.ffn_down.weight");
        for (let i = 0; i < 128 * 64; i++) {
            const want = Math.fround(rng.normal() / Math.sqrt(128));
            if (buf.readFloatLE(h.dataStart + t.offset + 4 * i) !== want) throw new Error(`element ${i} differs`);
        }
        // every tensor of the default model is below the fast-fill size
        for (const x of readGgufHeader(buildTinyModel()).tensors) expect(x.ne.reduce((a, b) => a * b, 1)).toBeLessThan(FAST_FILL_MIN_ELEMENTS);
    });

    it("large tensors (fast fill) have the requested mean and std, zeroed control rows, and F16 = rounded F32", () => {
        const opts = {...small, vocab: 20_000}; // token_embd / output: 64 x 20000 = 1.28 M elements >= 2^20
        expect(64 * 20_000).toBeGreaterThanOrEqual(FAST_FILL_MIN_ELEMENTS);
        const f32 = buildTinyModel(opts), f16 = buildTinyModel({...opts, f16: true});
        const h32 = readGgufHeader(f32), h16 = readGgufHeader(f16);
        const ids = tinyModelSpecialIds(opts);
        for (const [name, wantSd] of [["token_embd.weight", 1], ["output.weight", TINY_MODEL_DEFAULTS.logitScale / 8]] as const) {
            const t32 = h32.tensors.find((x) => x.name === name)!, t16 = h16.tensors.find((x) => x.name === name)!;
            const n = 64 * 20_000;
            const v = new Float32Array(n);
            for (let i = 0; i < n; i++) v[i] = f32.readFloatLE(h32.dataStart + t32.offset + 4 * i);
            const textRows = name === "output.weight" ? v.subarray(0, 64 * ids.bos) : v;
            const {mean, sd} = std(textRows);
            expect(Math.abs(mean)).toBeLessThan(0.01 * wantSd);
            expect(sd / wantSd).toBeGreaterThan(0.99);
            expect(sd / wantSd).toBeLessThan(1.01);
            expect(new Set(textRows.subarray(0, 100_000)).size).toBeGreaterThan(500); // many levels, not a handful
            if (name === "output.weight") expect(v.subarray(64 * ids.bos, 64 * (ids.eos + 1)).every((x) => x === 0)).toBe(true);
            for (let i = 0; i < n; i += 97) {
                if (f16.readUInt16LE(h16.dataStart + t16.offset + 2 * i) !== floatToHalfBits(v[i]!)) throw new Error(`${name}[${i}]: F16 differs`);
            }
        }
    });
});
