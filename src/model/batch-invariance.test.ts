// Regression guard for docs/batch-variance.md: with the default (batch-invariant) shapes, a greedy request's
// logits are bit-identical alone and inside a mixed batch; with the old 256/4/2/768 shapes they are not.
// Uses node-llama-cpp's internal native context (`_ctx`) the same way Keel's step engine does.
import {mkdtempSync, rmSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {afterAll, describe, expect, it} from "vitest";
import {getLlama, LlamaLogLevel, type LlamaContext, type LlamaModel} from "node-llama-cpp";
import {buildTinyModel, type TinyModelOptions} from "./tiny-model.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-bi-test-"));
afterAll(() => rmSync(tmp, {recursive: true, force: true}));

/* eslint-disable @typescript-eslint/no-explicit-any */
interface Req {prompt: number[]; start: number; pos: number; out: number[]; fp: number[][]; id: number; sampler: any}

/** Runs requests through a tiny step loop; request i joins at step `start`. Returns tokens and top-2 probs. */
async function run(ctx: LlamaContext, prompts: number[][], starts: number[], maxTokens: number, budget: number) {
    const native = (ctx as any)._ctx;
    const model = ctx.model as any;
    const reqs: Req[] = prompts.map((prompt, id) => ({prompt, start: starts[id]!, pos: 0, out: [], fp: [], id, sampler: null}));
    for (let step = 0; reqs.some((r) => r.out.length < maxTokens); step++) {
        const items: {r: Req; toks: number[]; logits: boolean; idx?: number}[] = [];
        let left = budget;
        for (const r of reqs) if (r.start <= step && r.pos >= r.prompt.length && r.out.length < maxTokens) { items.push({r, toks: [r.out.at(-1)!], logits: true}); left--; }
        for (const r of reqs) {
            if (r.start > step || r.pos >= r.prompt.length || left <= 0) continue;
            const n = Math.min(left, r.prompt.length - r.pos);
            items.push({r, toks: r.prompt.slice(r.pos, r.pos + n), logits: r.pos + n === r.prompt.length});
            left -= n;
        }
        if (!items.length) continue;
        native.initBatch(items.reduce((a, it) => a + it.toks.length, 0));
        for (const it of items) {
            it.idx = native.addToBatch(it.r.id, it.r.pos, Uint32Array.from(it.toks), it.logits ? Uint32Array.of(it.toks.length - 1) : new Uint32Array(0))[0];
        }
        await native.decodeBatch();
        for (const it of items) {
            it.r.pos += it.toks.length;
            if (!it.logits) continue;
            it.r.sampler ??= new model._llama._bindings.AddonSampler(model._model);
            it.r.sampler.applyConfig({temperature: 0});
            const [tok, probs] = await native.sampleToken(it.idx, it.r.sampler, true);
            it.r.out.push(tok);
            it.r.fp.push([probs[1], probs[3]]);
        }
    }
    for (const r of reqs) { r.sampler?.dispose(); native.disposeSequence(r.id); }
    return reqs.map((r) => ({tokens: r.out, fp: r.fp}));
}

async function compareSoloVsBatch(opts: TinyModelOptions): Promise<{tokensEqual: boolean; fpEqual: boolean}> {
    const file = path.join(tmp, `m-${Object.values(opts).join("-")}.gguf`);
    writeFileSync(file, buildTinyModel(opts));
    const llama = await getLlama({gpu: false, build: "never", maxThreads: 1, logLevel: LlamaLogLevel.error});
    const model: LlamaModel = await llama.loadModel({modelPath: file});
    try {
        const ctx = await model.createContext({contextSize: 256, sequences: 4, batchSize: 64, threads: 1, flashAttention: false});
        const texts = ["The server receives a request", "Once upon a time there was a fox who lived by the sea and " +
            "watched the ships", "{\"name\": \"Alice\", \"age\": 30}", "Why is the sky blue? Because"];
        const prompts = texts.map((t) => Array.from(model.tokenize(`<|im_start|>user\n${t}<|im_end|>\n<|im_start|>assistant\n`, true)));
        const [solo] = await run(ctx, [prompts[1]!], [0], 24, 64);
        const batch = await run(ctx, prompts, [3, 0, 1, 5], 24, 7); // small budget: chunked prefill mixed with decodes
        await ctx.dispose();
        return {tokensEqual: JSON.stringify(solo!.tokens) === JSON.stringify(batch[1]!.tokens),
            fpEqual: JSON.stringify(solo!.fp) === JSON.stringify(batch[1]!.fp)};
    } finally {
        await model.dispose();
        await llama.dispose();
    }
}

describe("batch invariance of the tiny model on the CPU backend", () => {
    it("default shapes: logits are bit-identical alone and in a mixed batch", async () => {
        expect(await compareSoloVsBatch({layers: 2})).toEqual({tokensEqual: true, fpEqual: true});
    }, 60_000);

    it("negative control: 256/4/2/768 shapes are not bit-identical", async () => {
        const r = await compareSoloVsBatch({layers: 2, hidden: 256, heads: 4, kvHeads: 2, ff: 768});
        expect(r.fpEqual).toBe(false);
    }, 60_000);
});
