// The tiny recurrent-state models (mamba, jamba hybrid) under the bundled llama.cpp, through node-llama-cpp's
// internal native context (`_ctx`) exactly as Keel's step engine drives it. Measurements (a)-(e) of
// docs/recurrent-model.md.
import {mkdtempSync, rmSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {afterAll, afterEach, beforeAll, describe, expect, it} from "vitest";
import {getLlama, LlamaLogLevel, type Llama, type LlamaContext, type LlamaModel, type Token} from "node-llama-cpp";
import {readGgufHeader} from "./gguf-reader.js";
import {buildTinyModel, tinyModelSpecialIds} from "./tiny-model.js";
import {
    buildTinyRecurrentModel, isBatchInvariantRecurrentShape, resolveTinyRecurrentModelOptions,
    tinyRecurrentModelSpecialIds, TINY_RECURRENT_MODEL_DEFAULTS, type TinyRecurrentArch, type TinyRecurrentModelOptions
} from "./tiny-recurrent-model.js";

/* eslint-disable @typescript-eslint/no-explicit-any */
interface Native {
    initBatch(n: number): void;
    addToBatch(seq: number, pos: number, tokens: Uint32Array, logitIdx: Uint32Array): Uint32Array;
    decodeBatch(): Promise<void>;
    sampleToken(idx: number, sampler: unknown, probabilities: true): Promise<[number, number[] | undefined, unknown]>;
    disposeSequence(seq: number): void;
    removeTokenCellsFromSequence(seq: number, start: number, end: number): boolean;
    getSequenceKvCacheMinPosition(seq: number): number;
    getSequenceKvCacheMaxPosition(seq: number): number;
}

const tmp = mkdtempSync(path.join(tmpdir(), "keel-rec-test-"));
let llama: Llama;
/** llama.cpp's error-level log lines (the refused decode in (c) logs one). */
const logs: string[] = [];
beforeAll(async () => {
    llama = await getLlama({gpu: false, build: "never", maxThreads: 1, logLevel: LlamaLogLevel.error,
        logger: (_level, message) => { logs.push(message); }});
});
afterAll(async () => {
    await llama?.dispose();
    rmSync(tmp, {recursive: true, force: true});
});

const chat = (t: string): string => `<|im_start|>user\n${t}<|im_end|>\n<|im_start|>assistant\n`;

describe("buildTinyRecurrentModel (no llama.cpp)", () => {
    it("is deterministic and writes the llama.cpp keys and tensor shapes", () => {
        for (const arch of ["mamba", "jamba"] as const) {
            const a = buildTinyRecurrentModel({arch});
            expect(a.equals(buildTinyRecurrentModel({arch}))).toBe(true);
            const h = readGgufHeader(a);
            expect(h.impliedSize).toBe(a.length);
            expect(h.kv.get("general.architecture")?.value).toBe(arch);
            const o = resolveTinyRecurrentModelOptions({arch});
            const DI = 2 * o.hidden;
            expect(h.kv.get(`${arch}.ssm.inner_size`)?.value).toBe(DI);
            expect(h.kv.get(`${arch}.ssm.state_size`)?.value).toBe(o.stateSize);
            const ne = (n: string): number[] | undefined => h.tensors.find((t) => t.name === n)?.ne;
            const mambaLayer = 0; // jamba default: layer 1 is attention, 0 and 2 are Mamba
            expect(ne(`blk.${mambaLayer}.ssm_in.weight`)).toEqual([o.hidden, 2 * DI]);
            expect(ne(`blk.${mambaLayer}.ssm_conv1d.weight`)).toEqual([o.convKernel, DI]);
            expect(ne(`blk.${mambaLayer}.ssm_x.weight`)).toEqual([DI, o.dtRank + 2 * o.stateSize]);
            expect(ne(`blk.${mambaLayer}.ssm_a`)).toEqual([o.stateSize, DI]);
            if (arch === "jamba") {
                expect(h.kv.get("jamba.attention.head_count_kv")?.value).toEqual([0, 1, 0]);
                expect(ne("blk.1.attn_q.weight")).toEqual([o.hidden, o.hidden]);
                expect(ne("blk.1.ssm_in.weight")).toBeUndefined();
            }
        }
    });

    it("shares the Llama tiny model's vocabulary and control tokens, and the default shapes are batch-invariant", () => {
        expect(tinyRecurrentModelSpecialIds()).toEqual(tinyModelSpecialIds());
        const a = readGgufHeader(buildTinyRecurrentModel()).kv.get("tokenizer.ggml.tokens")?.value;
        const b = readGgufHeader(buildTinyModel({layers: 1})).kv.get("tokenizer.ggml.tokens")?.value;
        expect(a).toEqual(b);
        expect(isBatchInvariantRecurrentShape({arch: "mamba"})).toBe(true);
        expect(isBatchInvariantRecurrentShape({arch: "jamba"})).toBe(true);
        expect(isBatchInvariantRecurrentShape({hidden: 64})).toBe(false);
        expect(TINY_RECURRENT_MODEL_DEFAULTS.arch).toBe("mamba");
    });

    it("rejects bad options", () => {
        expect(() => buildTinyRecurrentModel({arch: "rwkv" as TinyRecurrentArch})).toThrow(/unknown arch/);
        expect(() => buildTinyRecurrentModel({arch: "jamba", attentionLayers: [0, 1, 2]})).toThrow(/at least one/);
        expect(() => buildTinyRecurrentModel({arch: "jamba", attentionLayers: [3]})).toThrow(/layer indices/);
        expect(() => buildTinyRecurrentModel({convKernel: 1})).toThrow(/convKernel/);
    });
});

/** A model + 2-sequence context driven through node-llama-cpp's native context, as Keel's step engine does. */
interface Harness {
    model: LlamaModel;
    native: Native;
    tok(text: string): number[];
    /** Greedy: prefill `tokens` on `seq` from `pos` (one batch), then decode `n` tokens. Tokens and top-1 probs. */
    greedy(seq: number, tokens: number[], pos: number, n: number): Promise<{tokens: number[]; probs: number[]}>;
    /** Requests through a step loop (budget 5: chunked prefill mixed with decodes); request i (= sequence i) joins at starts[i]. */
    stepLoop(prompts: number[][], starts: number[], n: number): Promise<{tokens: number[]; probs: number[]}[]>;
    dispose(): Promise<void>;
}

async function openHarness(opts: TinyRecurrentModelOptions): Promise<Harness> {
    const file = path.join(tmp, `${Object.values(opts).join("-")}.gguf`);
    writeFileSync(file, buildTinyRecurrentModel(opts));
    const model = await llama.loadModel({modelPath: file});
    const ctx: LlamaContext = await model.createContext({contextSize: 256, sequences: 2, batchSize: 64, threads: 1, flashAttention: false});
    const native = (ctx as any)._ctx as Native;
    const samplers: any[] = [];
    const newSampler = (): unknown => {
        const s = new (llama as any)._bindings.AddonSampler((model as any)._model);
        s.applyConfig({temperature: 0});
        samplers.push(s);
        return s;
    };

    async function greedy(seq: number, tokens: number[], pos: number, n: number): Promise<{tokens: number[]; probs: number[]}> {
        const sampler = newSampler();
        native.initBatch(tokens.length);
        let idx = native.addToBatch(seq, pos, Uint32Array.from(tokens), Uint32Array.of(tokens.length - 1))[0]!;
        await native.decodeBatch();
        pos += tokens.length;
        const out: number[] = [], probs: number[] = [];
        for (;;) {
            const [t, p] = await native.sampleToken(idx, sampler, true);
            out.push(t);
            probs.push(p![1]!);
            if (out.length === n) break;
            native.initBatch(1);
            idx = native.addToBatch(seq, pos++, Uint32Array.of(t), Uint32Array.of(0))[0]!;
            await native.decodeBatch();
        }
        return {tokens: out, probs};
    }

    async function stepLoop(prompts: number[][], starts: number[], n: number): Promise<{tokens: number[]; probs: number[]}[]> {
        const reqs = prompts.map((prompt, seq) => ({prompt, seq, start: starts[seq]!, pos: 0, out: [] as number[], probs: [] as number[],
            sampler: newSampler()}));
        for (let step = 0; reqs.some((r) => r.out.length < n); step++) {
            const items: {r: (typeof reqs)[number]; toks: number[]; logits: boolean; idx?: number}[] = [];
            let left = 5;
            for (const r of reqs) if (r.start <= step && r.pos >= r.prompt.length && r.out.length < n) { items.push({r, toks: [r.out.at(-1)!], logits: true}); left--; }
            for (const r of reqs) {
                if (r.start > step || r.pos >= r.prompt.length || left <= 0) continue;
                const k = Math.min(left, r.prompt.length - r.pos);
                items.push({r, toks: r.prompt.slice(r.pos, r.pos + k), logits: r.pos + k === r.prompt.length});
                left -= k;
            }
            if (!items.length) continue;
            native.initBatch(items.reduce((a, it) => a + it.toks.length, 0));
            for (const it of items) {
                it.idx = native.addToBatch(it.r.seq, it.r.pos, Uint32Array.from(it.toks), it.logits ? Uint32Array.of(it.toks.length - 1) : new Uint32Array(0))[0];
            }
            await native.decodeBatch();
            for (const it of items) {
                it.r.pos += it.toks.length;
                if (!it.logits) continue;
                const [t, p] = await native.sampleToken(it.idx!, it.r.sampler, true);
                it.r.out.push(t);
                it.r.probs.push(p![1]!);
            }
        }
        for (const r of reqs) native.disposeSequence(r.seq);
        return reqs.map((r) => ({tokens: r.out, probs: r.probs}));
    }

    return {
        model, native, greedy, stepLoop,
        tok: (t) => Array.from(model.tokenize(chat(t), true)),
        dispose: async () => {
            for (const s of samplers) s.dispose();
            await ctx.dispose();
            await model.dispose();
        }
    };
}

const BATCH_PROMPTS = ["Once upon a time there was a fox who lived by the sea and watched the ships", "{\"name\": \"Alice\", \"age\": 30}"];

/** Solo runs of both prompts vs. both together in one step loop (sequence 1 joining at step 3). */
async function soloVsBatched(h: Harness): Promise<{solo: {tokens: number[]; probs: number[]}[]; batched: {tokens: number[]; probs: number[]}[]}> {
    const [p0, p1] = BATCH_PROMPTS.map((t) => h.tok(t)) as [number[], number[]];
    const solo0 = (await h.stepLoop([p0], [0], 20))[0]!;
    const solo1 = await h.greedy(1, p1, 0, 20);
    h.native.disposeSequence(1);
    return {solo: [solo0, solo1], batched: await h.stepLoop([p0, p1], [0, 3], 20)};
}

describe.each(["mamba", "jamba"] as const)("tiny %s model under llama.cpp", (arch) => {
    let h: Harness;
    let model: LlamaModel;
    let native: Native;
    let tok: Harness["tok"], greedy: Harness["greedy"];
    beforeAll(async () => {
        h = await openHarness({arch});
        ({model, native, tok, greedy} = h);
    });
    afterAll(async () => h?.dispose());
    afterEach(() => { native.disposeSequence(0); native.disposeSequence(1); }); // each check starts from empty sequences

    it("(a) loads and generates deterministic greedy tokens (no EOS)", async () => {
        const p = tok("The weather this week has been strange.");
        const a = await greedy(0, p, 0, 24);
        native.disposeSequence(0);
        const b = await greedy(0, p, 0, 24);
        native.disposeSequence(0);
        expect(b).toEqual(a);
        expect(new Set(a.tokens).size).toBeGreaterThan(5);
        // node-llama-cpp's public classification (llm_arch_is_recurrent / llm_arch_is_hybrid of the bundled llama.cpp)
        expect(model.fileInsights.isRecurrent).toBe(arch === "mamba");
        expect(model.fileInsights.isHybrid).toBe(arch === "jamba");
        expect(a.tokens.some((t) => model.isSpecialToken(t as unknown as Token))).toBe(false);
    });

    it("(b) two sequences batched together give the same tokens (and probabilities) as each alone", async () => {
        const {solo, batched} = await soloVsBatched(h);
        expect(batched.map((r) => r.tokens)).toEqual(solo.map((r) => r.tokens));
        expect(batched.map((r) => r.probs)).toEqual(solo.map((r) => r.probs)); // bit-identical: no tinyBLAS, sequential scan
    });

    it("(c) seq_rm: a partial trim is refused, a no-op tail trim and a full clear succeed", async () => {
        const p = tok("Questions and answers. Where is the station?");
        const g = await greedy(0, p, 0, 8); // cache holds p + 7 generated tokens: positions 0..len-1
        const len = p.length + 7;
        // recurrent memory: one cell per sequence at the last position (min == max)
        expect(native.getSequenceKvCacheMaxPosition(0)).toBe(len - 1);
        expect(native.getSequenceKvCacheMinPosition(0)).toBe(len - 1);
        expect(native.removeTokenCellsFromSequence(0, 5, -1)).toBe(false);
        expect(native.removeTokenCellsFromSequence(0, len - 1, -1)).toBe(false); // even dropping only the last token
        expect(native.removeTokenCellsFromSequence(0, 1, len)).toBe(false);
        expect(native.getSequenceKvCacheMaxPosition(0)).toBe(len - 1); // refused trims change nothing
        // the state is intact: continuing gives the uninterrupted run's next tokens
        const cont = await greedy(0, [g.tokens[7]!], len, 4);
        const ref = await (async () => { native.disposeSequence(0); return greedy(0, p, 0, 12); })();
        expect(cont.tokens).toEqual(ref.tokens.slice(8, 12));
        // decoding at a non-consecutive position (as if the refused trim had worked) is rejected by llama_decode
        native.initBatch(1);
        native.addToBatch(0, 5, Uint32Array.of(g.tokens[0]!), Uint32Array.of(0));
        logs.length = 0;
        await expect(native.decodeBatch()).rejects.toThrow(/Eval has failed/);
        // llama.cpp's log lines reach JS asynchronously
        for (let i = 0; i < 100 && !logs.join("").includes("inconsistent"); i++) await new Promise((r) => setTimeout(r, 10));
        expect(logs.join("\n")).toMatch(/inconsistent sequence positions[\s\S]*X = \d+[\s\S]*Y = 5/);
        // trimming from past the end removes nothing and succeeds; full clears succeed
        const end = native.getSequenceKvCacheMaxPosition(0) + 1;
        expect(native.removeTokenCellsFromSequence(0, end, -1)).toBe(true);
        expect(native.removeTokenCellsFromSequence(0, 0, -1)).toBe(true);
        expect(native.getSequenceKvCacheMaxPosition(0)).toBe(-1);
        await greedy(0, p, 0, 2);
        expect(native.removeTokenCellsFromSequence(0, -1, -1)).toBe(true);
        expect(native.getSequenceKvCacheMaxPosition(0)).toBe(-1);
        native.disposeSequence(0); // seq_rm(-1, -1) on an empty sequence: fine
    });

    it("(c2) a head trim seq_rm(seq, 0, p1) returns true but leaves the recurrent state as it was", async () => {
        // llama_memory_recurrent::seq_rm only refuses ranges with 0 < p0 <= last pos; with p0 == 0 it erases the
        // cell only if the range covers the last position, so this "succeeds" without removing anything. On the
        // hybrid, the attention KV cache then does drop positions 0..4: the two halves of the memory disagree.
        const p = tok("Questions and answers. Where is the station?");
        const ref = await greedy(1, p, 0, 16);
        const g = await greedy(0, p, 0, 8);
        const len = p.length + 7;
        expect(native.removeTokenCellsFromSequence(0, 0, 5)).toBe(true);
        expect(native.getSequenceKvCacheMaxPosition(0)).toBe(len - 1);
        const cont = await greedy(0, [g.tokens[7]!], len, 8);
        if (arch === "mamba") expect(cont.tokens).toEqual(ref.tokens.slice(8)); // nothing was removed
        else expect(cont.tokens).not.toEqual(ref.tokens.slice(8)); // attention lost tokens 0..4, the SSM state did not
    });

    it("(d) after a full clear, a new prompt on the same sequence matches a fresh run", async () => {
        const a = tok("Numbers and units: 0, 1, 2, 3");
        const b = tok("Why is the sky blue? Because");
        const fresh = await greedy(1, b, 0, 16); // sequence 1 never held anything
        native.disposeSequence(1);
        await greedy(0, a, 0, 10);
        // control: the same prompt on top of the stale state (as if the sequence had not been cleared) differs
        const stale = await greedy(0, b, a.length + 9, 16);
        expect(stale.tokens).not.toEqual(fresh.tokens);
        expect(native.removeTokenCellsFromSequence(0, 0, -1)).toBe(true);
        const reused = await greedy(0, b, 0, 16);
        native.disposeSequence(0);
        expect(reused).toEqual(fresh);
    });

    it("(e) continuing a sequence whose cache is a full prefix of the new prompt equals a full prefill", async () => {
        // turn 1: prompt + generated reply; the cache holds the prompt and all reply tokens but the last sampled one
        const p1 = tok("What time is it now?");
        const g = await greedy(0, p1, 0, 10);
        const cached = [...p1, ...g.tokens.slice(0, 9)];
        expect(native.getSequenceKvCacheMaxPosition(0)).toBe(cached.length - 1);
        // turn 2's prompt extends the cached tokens
        const next = [...cached, g.tokens[9]!, ...tok("And tomorrow?")];
        expect(native.removeTokenCellsFromSequence(0, cached.length, -1)).toBe(true); // no-op trim of the tail
        const reused = await greedy(0, next.slice(cached.length), cached.length, 16);
        native.disposeSequence(0);
        const scratch = await greedy(1, next, 0, 16);
        native.disposeSequence(1);
        expect(reused.tokens).toEqual(scratch.tokens);
        expect(reused.probs).toEqual(scratch.probs);
    });
});

describe("batch invariance needs the default shapes", () => {
    it("negative control: mamba with hidden 64 (tinyBLAS-eligible) is not bit-identical solo vs batched", async () => {
        const h = await openHarness({arch: "mamba", hidden: 64, dtRank: 4});
        try {
            expect(isBatchInvariantRecurrentShape({hidden: 64, dtRank: 4})).toBe(false);
            const {solo, batched} = await soloVsBatched(h);
            expect(batched.map((r) => r.probs)).not.toEqual(solo.map((r) => r.probs));
        } finally {
            await h.dispose();
        }
    });
});
