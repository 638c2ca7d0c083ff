import {describe, expect, it} from "vitest";
import {GgufValueType, readGgufHeader} from "./gguf-writer.js";
import {buildTinyModel, CHATML_TEMPLATE, isBatchInvariantShape, resolveTinyModelOptions, TINY_MODEL_DEFAULTS, tinyModelSpecialIds} from "./tiny-model.js";

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
