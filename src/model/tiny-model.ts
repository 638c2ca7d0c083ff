/**
 * Deterministic random-weight Llama-architecture GGUF models ("keel-tiny"): the demo / test model that Keel
 * ships without downloading anything. The text such a model produces is gibberish, but it exercises the whole
 * engine (tokenizer, chat template, KV cache, batching, sampling) exactly like a real model.
 *
 * Vocabulary: token ids 0..255 are the byte tokens (GPT-2 byte-unicode alphabet), then one token per BPE merge
 * trained on {@link TRAINING_CORPUS}, then three control tokens: `<|endoftext|>` (BOS), `<|im_start|>`,
 * `<|im_end|>` (EOS), then the optional user-defined tokens ({@link TinyModelOptions.userTokens}, e.g. `<think>`).
 * The 256 byte tokens make every byte sequence spellable, so any grammar over text is satisfiable.
 */
import {createHash} from "node:crypto";
import {CHATML_TEMPLATE} from "./chat-templates.js";
import {encodeTensorData, floatToHalfBits, GgmlTensorType, GgufValueType, GgufWriter} from "./gguf-writer.js";
import {extendBpeVocab, trainBpe, type BpeVocab} from "./bpe.js";
import {TRAINING_CORPUS} from "./corpus.js";

/**
 * Version of the generator. Part of the default model's cache key: bump it whenever a change here, in bpe.ts,
 * corpus.ts or gguf-writer.ts changes the bytes produced for the same options.
 */
export const TINY_MODEL_GENERATOR_VERSION = 1;

/** Crafted invalid models that make llama.cpp hit a GGML_ASSERT (process abort), for startup-validation tests. */
export type BrokenModelKind =
    /** `llama.block_count = 0`: aborts in `loadModel`. */
    | "zero-layers"
    /**
     * 3 KV heads for a head count that 3 does not divide: loads, aborts in `createContext` (graph reserve).
     * Unless `heads` / `hidden` are given, this kind uses 4 heads and hidden 256 (the defaults' 9 heads would make
     * 3 KV heads valid).
     */
    | "kv-heads-3"
    /** `llama.expert_used_count = 2` on a dense model: aborts in `loadModel`. */
    | "expert-used";

/** Options of {@link buildTinyModel}. Every field is optional; defaults are {@link TINY_MODEL_DEFAULTS}. */
export interface TinyModelOptions {
    /** Transformer blocks. */
    layers?: number;
    /** Embedding width (`llama.embedding_length`); must be divisible by `heads`. */
    hidden?: number;
    /** SwiGLU inner width (`llama.feed_forward_length`). */
    ff?: number;
    /** Query heads; head dim = hidden / heads. */
    heads?: number;
    /** KV heads (GQA); must divide `heads` (unless `broken: "kv-heads-3"`). */
    kvHeads?: number;
    /** Trained context length (`llama.context_length`), in tokens. */
    ctx?: number;
    /** Maximum number of BPE merges trained on the corpus (the corpus may yield fewer). */
    merges?: number;
    /**
     * Total vocabulary size (byte tokens + merges + control + user tokens), e.g. 151936 for a Qwen2.5-sized one.
     * The corpus merges are extended with generated word-like merges ({@link extendBpeVocab}) up to this size.
     * Default: no generated merges (the vocabulary is whatever the corpus merges give, ~1k).
     */
    vocab?: number;
    /** PRNG seed for all weights (uint32). */
    seed?: number;
    /** Store the matrices as F16 instead of F32 (norm vectors stay F32). */
    f16?: boolean;
    /** Jinja chat template stored as `tokenizer.chat_template`; default ChatML ({@link CHATML_TEMPLATE}). */
    chatTemplate?: string;
    /** Standard deviation of the output-head logits for a unit-RMS final hidden state. */
    logitScale?: number;
    /** Craft an invalid model instead (see {@link BrokenModelKind}). */
    broken?: BrokenModelKind;
    /**
     * Extra tokens of type USER_DEFINED appended after the control tokens (agent tags such as `<think>` or
     * `<tool_call>`, as Qwen3 models have them): llama.cpp tokenizes each occurrence of the text as that one token
     * and, unlike a control token, prints its text, so a parser sees the tag. Their output-head rows are random
     * like any text token. Default none; an empty list is the same as none (same bytes, same cache key).
     */
    userTokens?: readonly string[];
}

/** Fully resolved options (what the model was built with). */
export type ResolvedTinyModelOptions = Required<Omit<TinyModelOptions, "broken" | "userTokens" | "vocab">> & {
    broken?: BrokenModelKind;
    /** Present only when given, so that the models without generated merges keep their resolved options (and cache key). */
    vocab?: number;
    /** Present only when non-empty, so that the plain model's resolved options (and cache key) stay as they were. */
    userTokens?: readonly string[];
};

export {CHATML_TEMPLATE};

/**
 * Default options of the tiny model (and of Keel's embedded default model).
 *
 * The odd-looking shapes are deliberate: they make llama.cpp's CPU output bit-identical whatever the batch
 * composition (see {@link isBatchInvariantShape} and docs/batch-variance.md). 9 query heads x head dim 30 =
 * hidden 270, 3 KV heads (GQA 3:1), FFN 810: every matmul dimension is 2 mod 4.
 */
export const TINY_MODEL_DEFAULTS: Readonly<Required<Omit<TinyModelOptions, "broken" | "chatTemplate" | "userTokens" | "vocab">>> = Object.freeze({
    layers: 4,
    hidden: 270,
    ff: 810,
    heads: 9,
    kvHeads: 3,
    ctx: 2048,
    merges: 760,
    seed: 1234,
    f16: false,
    logitScale: 3
});

/**
 * True if the model's shapes keep llama.cpp's CPU backend on its batch-invariant matmul path.
 *
 * ggml's CPU `mul_mat` uses llamafile's tinyBLAS GEMM only when the batch has >= 2 columns, the inner dimension k
 * is a multiple of the SIMD width (4/8/16 floats) and the output rows m a multiple of 4; otherwise it computes
 * every output element with the same `vec_dot` whatever the batch size. A 1-token decode therefore sums in a
 * different order than a batched one (-> last-bit logit differences -> flipped greedy near-ties) unless tinyBLAS
 * can never be chosen. With hidden, FFN and head dim all = 2 (mod 4), every weight matmul (k = hidden or ff), the
 * K*Q product (k = head dim) and the V*softmax product (m = head dim) decline tinyBLAS on every SIMD flavour.
 */
export function isBatchInvariantShape(opts: TinyModelOptions = {}): boolean {
    const o = resolveTinyModelOptions(opts);
    const headDim = o.hidden / o.heads;
    return o.hidden % 4 === 2 && o.ff % 4 === 2 && headDim % 4 === 2;
}

/** The three control tokens, in id order after the merge tokens. */
export const TINY_MODEL_SPECIAL_TOKENS = Object.freeze(["<|endoftext|>", "<|im_start|>", "<|im_end|>"] as const);

/** Ids of the control tokens and the vocabulary size of a tiny model. */
export interface TinyModelSpecialIds {
    /** `<|endoftext|>`, also BOS and padding. */
    bos: number;
    /** `<|im_start|>`. */
    imStart: number;
    /** `<|im_end|>`, the EOS / end-of-turn token. */
    eos: number;
    /** Total number of tokens. */
    vocabSize: number;
    /** Id of each user-defined token ({@link TinyModelOptions.userTokens}); empty for the plain model. */
    userTokens: Readonly<Record<string, number>>;
}

const bpeCache = new Map<string, BpeVocab>();
/**
 * The byte-level BPE vocabulary trained on {@link TRAINING_CORPUS} with at most `merges` merges, then, if
 * `totalMerges` is given, extended with generated merges to exactly `totalMerges` (memoized).
 * @throws Error if `totalMerges` is below the number of corpus merges
 */
export function vocabFor(merges: number, totalMerges?: number): BpeVocab {
    const key = `${merges}:${totalMerges ?? ""}`;
    let v = bpeCache.get(key);
    if (!v) {
        const trained = totalMerges === undefined ? trainBpe(TRAINING_CORPUS, {maxMerges: merges}) : vocabFor(merges);
        if (totalMerges !== undefined && totalMerges < trained.merges.length) {
            throw new Error(`tiny model: vocab too small: the corpus alone gives ${256 + trained.merges.length} tokens before the control tokens`);
        }
        v = totalMerges === undefined ? trained : extendBpeVocab(trained, totalMerges - trained.merges.length);
        bpeCache.set(key, v);
    }
    return v;
}

/** The vocabulary of a model built with these (resolved) options: corpus merges, plus generated ones for `vocab`. */
function vocabOf(o: {merges: number; vocab?: number; userTokens?: readonly string[]}): BpeVocab {
    const extraTokens = TINY_MODEL_SPECIAL_TOKENS.length + (o.userTokens?.length ?? 0);
    return vocabFor(o.merges, o.vocab === undefined ? undefined : o.vocab - 256 - extraTokens);
}

/** Fills in defaults and validates. @throws Error on bad sizes, inconsistent heads, or an unknown / impossible `broken`. */
export function resolveTinyModelOptions(opts: TinyModelOptions = {}): ResolvedTinyModelOptions {
    const r: ResolvedTinyModelOptions = {
        ...TINY_MODEL_DEFAULTS,
        ...(opts.broken === "kv-heads-3" ? {heads: 4, hidden: 256} : {}),
        chatTemplate: CHATML_TEMPLATE,
        ...Object.fromEntries(Object.entries(opts).filter(([k, v]) => v !== undefined && !(k === "userTokens" && (v as unknown[]).length === 0)))
    };
    if (r.userTokens !== undefined) {
        r.userTokens = [...r.userTokens];
        for (const t of r.userTokens) {
            if (typeof t !== "string" || t.length === 0) throw new Error("tiny model: userTokens must be non-empty strings");
        }
        if (new Set(r.userTokens).size !== r.userTokens.length) throw new Error("tiny model: userTokens must be distinct");
    }
    for (const k of ["layers", "hidden", "ff", "heads", "kvHeads", "ctx"] as const) {
        if (!Number.isInteger(r[k]) || r[k] <= 0) throw new Error(`tiny model: ${k} must be a positive integer, got ${r[k]}`);
    }
    if (!Number.isInteger(r.merges) || r.merges < 0) throw new Error(`tiny model: merges must be >= 0, got ${r.merges}`);
    if (r.vocab !== undefined && (!Number.isInteger(r.vocab) || r.vocab <= 0 || r.vocab > 0xffffffff)) {
        throw new Error(`tiny model: vocab must be a positive integer, got ${r.vocab}`);
    }
    if (!Number.isInteger(r.seed) || r.seed < 0 || r.seed > 0xffffffff) throw new Error(`tiny model: seed must be a uint32`);
    if (!(r.logitScale > 0)) throw new Error(`tiny model: logitScale must be > 0`);
    if (r.hidden % r.heads !== 0) throw new Error(`tiny model: hidden (${r.hidden}) must be divisible by heads (${r.heads})`);
    if ((r.hidden / r.heads) % 2 !== 0) throw new Error(`tiny model: head dim must be even (RoPE)`);
    if (r.broken === undefined && r.heads % r.kvHeads !== 0) throw new Error(`tiny model: kvHeads must divide heads`);
    if (r.broken === "kv-heads-3" && r.heads % 3 === 0) {
        throw new Error(`tiny model: broken "kv-heads-3" needs a head count not divisible by 3, got ${r.heads}`);
    }
    if (r.broken !== undefined && !["zero-layers", "kv-heads-3", "expert-used"].includes(r.broken)) {
        throw new Error(`tiny model: unknown broken kind "${String(r.broken)}"`);
    }
    return r;
}

/** Returns the control-token ids and vocabulary size for the given options (only `merges`, `vocab` and `userTokens` matter). */
export function tinyModelSpecialIds(opts: TinyModelOptions = {}): TinyModelSpecialIds {
    const o = resolveTinyModelOptions(opts);
    const userTokens = o.userTokens ?? [];
    const base = 256 + vocabOf(o).merges.length;
    return {
        bos: base, imStart: base + 1, eos: base + 2, vocabSize: base + 3 + userTokens.length,
        userTokens: Object.fromEntries(userTokens.map((t, i) => [t, base + 3 + i]))
    };
}

/**
 * Deterministic normal PRNG: xoshiro128** seeded through splitmix32, Box-Muller for N(0,1). Each tensor gets its
 * own stream derived from (seed, tensor name), so changing e.g. the layer count does not change other tensors.
 */
export class NormalRng {
    private a = 0;
    private b = 0;
    private c = 0;
    private d = 0;
    private spare: number | null = null;

    constructor(seed: number, stream: string) {
        const h = createHash("sha256").update(`${seed >>> 0}:${stream}`).digest();
        let x = h.readUInt32LE(0);
        const state: number[] = [];
        for (let i = 0; i < 4; i++) {
            // splitmix32
            x = (x + 0x9e3779b9) >>> 0;
            let z = x;
            z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
            z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
            state.push((z ^ (z >>> 16)) >>> 0);
        }
        [this.a, this.b, this.c, this.d] = state as [number, number, number, number];
        if ((this.a | this.b | this.c | this.d) === 0) this.a = 1;
    }

    /** Uniform uint32 (xoshiro128**). */
    nextU32(): number {
        const result = Math.imul(rotl(Math.imul(this.b, 5) >>> 0, 7), 9) >>> 0;
        const t = (this.b << 9) >>> 0;
        this.c = (this.c ^ this.a) >>> 0;
        this.d = (this.d ^ this.b) >>> 0;
        this.b = (this.b ^ this.c) >>> 0;
        this.a = (this.a ^ this.d) >>> 0;
        this.c = (this.c ^ t) >>> 0;
        this.d = rotl(this.d, 11);
        return result;
    }

    /** Uniform in (0, 1). */
    uniform(): number {
        return (this.nextU32() + 0.5) / 4294967296;
    }

    /** Standard normal. */
    normal(): number {
        if (this.spare !== null) { const v = this.spare; this.spare = null; return v; }
        const r = Math.sqrt(-2 * Math.log(this.uniform()));
        const a = 2 * Math.PI * this.uniform();
        this.spare = r * Math.sin(a);
        return r * Math.cos(a);
    }
}

/**
 * Tensors with at least this many elements are filled by {@link fillFastNormal} instead of Box-Muller: at ~10 M
 * normals/s, a 0.5 B-parameter model would take a minute to generate. Every tensor of the tiny models stays below it
 * (so their bytes, and cache keys, are unchanged).
 */
export const FAST_FILL_MIN_ELEMENTS = 1 << 20;

/** Standard deviation of b0 + b1 - b2 - b3 for four independent uniform bytes: sqrt(4 * (256^2 - 1) / 12). */
const SUM4_STD = Math.sqrt((4 * (256 * 256 - 1)) / 12);

/**
 * Fills `n` values ~ N(0, std) (approximately: an Irwin-Hall sum of four uniform bytes, 1021 levels, bounded at
 * +-3.45 std) with one PRNG step and one table look-up per value, already encoded in `type`: ~10x faster than
 * {@link NormalRng.normal}, which is what makes a realistic-size model a matter of seconds.
 * @returns the encoded tensor bytes
 */
export function fillFastNormal(rng: NormalRng, n: number, std: number, type: GgmlTensorType): Buffer {
    const levels = Float32Array.from({length: 1021}, (_, k) => ((k - 510) * std) / SUM4_STD);
    const run = <A extends Float32Array | Uint16Array>(out: A, table: A): Buffer => {
        for (let i = 0; i < n; i++) {
            const u = rng.nextU32();
            // 1. four bytes of one draw; 2. their signed sum indexes the pre-encoded level
            out[i] = table[510 + (u & 0xff) + ((u >>> 8) & 0xff) - ((u >>> 16) & 0xff) - (u >>> 24)]!;
        }
        return Buffer.from(out.buffer, out.byteOffset, out.byteLength);
    };
    if (type === GgmlTensorType.F16) return run(new Uint16Array(n), Uint16Array.from(levels, (v) => floatToHalfBits(v)));
    return run(new Float32Array(n), levels);
}

function rotl(x: number, k: number): number {
    return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/**
 * Write the byte-level GPT-2 BPE tokenizer and chat template KVs shared by every tiny model (llama.cpp reads
 * `tokenizer.ggml.*`; `add_bos_token` is false because the ChatML template carries its own markers).
 */
export function writeTokenizer(
    w: GgufWriter,
    t: {tokens: readonly string[]; tokenTypes: readonly number[]; merges: readonly string[]; bos: number; eos: number; chatTemplate: string},
): void {
    w.kv("tokenizer.ggml.model", GgufValueType.STRING, "gpt2")
        .kv("tokenizer.ggml.pre", GgufValueType.STRING, "gpt-2")
        .kvArray("tokenizer.ggml.tokens", GgufValueType.STRING, [...t.tokens])
        .kvArray("tokenizer.ggml.token_type", GgufValueType.INT32, [...t.tokenTypes])
        .kvArray("tokenizer.ggml.merges", GgufValueType.STRING, [...t.merges])
        .kv("tokenizer.ggml.bos_token_id", GgufValueType.UINT32, t.bos)
        .kv("tokenizer.ggml.eos_token_id", GgufValueType.UINT32, t.eos)
        .kv("tokenizer.ggml.padding_token_id", GgufValueType.UINT32, t.bos)
        .kv("tokenizer.ggml.add_bos_token", GgufValueType.BOOL, false)
        .kv("tokenizer.chat_template", GgufValueType.STRING, t.chatTemplate);
}

/**
 * Builds a tiny random-weight Llama GGUF in memory.
 *
 * Weights: every matrix ~ N(0, 1/sqrt(fan_in)) (token embeddings N(0, 1)); norm weights 1. The output head is
 * N(0, logitScale/sqrt(hidden)) with the rows of the three control tokens zeroed, so greedy decoding practically
 * never produces EOS (a zero logit against the max of ~1000 random logits).
 * The result is byte-identical for identical options (and generator version).
 * @returns the complete GGUF file
 * @throws Error on invalid options (see {@link resolveTinyModelOptions})
 */
export function buildTinyModel(opts: TinyModelOptions = {}): Buffer {
    return tinyModelWriter(opts).toBuffer();
}

/**
 * The model of {@link buildTinyModel} as a writer whose large tensors are generated lazily, while it is written:
 * stream it to disk with `writeGgufFile` (any size, one tensor in memory at a time).
 * @throws Error on invalid options (see {@link resolveTinyModelOptions})
 */
export function tinyModelWriter(opts: TinyModelOptions = {}): GgufWriter {
    const o = resolveTinyModelOptions(opts);
    const vocab = vocabOf(o);
    const userTokens = o.userTokens ?? [];
    const tokens = [...vocab.byteTokens, ...vocab.mergedTokens, ...TINY_MODEL_SPECIAL_TOKENS, ...userTokens];
    if (new Set(tokens).size !== tokens.length) throw new Error("tiny model: duplicate token strings");
    const ids = tinyModelSpecialIds(o);
    const V = ids.vocabSize;
    const TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4; // llama_token_type
    const firstUser = ids.eos + 1;
    const tokenTypes = tokens.map((_, i) => (i >= firstUser ? TOKEN_USER_DEFINED : i >= ids.bos ? TOKEN_CONTROL : TOKEN_NORMAL));

    const H = o.hidden, F = o.ff, NH = o.heads, HD = H / NH;
    const NKV = o.broken === "kv-heads-3" ? 3 : o.kvHeads;
    const mat = o.f16 ? GgmlTensorType.F16 : GgmlTensorType.F32;

    const w = new GgufWriter();
    w.kv("general.architecture", GgufValueType.STRING, "llama")
        .kv("general.name", GgufValueType.STRING, "keel-tiny-llama")
        .kv("general.description", GgufValueType.STRING, "random-weight demo model generated by Keel")
        .kv("general.file_type", GgufValueType.UINT32, o.f16 ? 1 : 0) // ALL_F32 / MOSTLY_F16
        .kv("llama.vocab_size", GgufValueType.UINT32, V)
        .kv("llama.context_length", GgufValueType.UINT32, o.ctx)
        .kv("llama.embedding_length", GgufValueType.UINT32, H)
        .kv("llama.block_count", GgufValueType.UINT32, o.broken === "zero-layers" ? 0 : o.layers)
        .kv("llama.feed_forward_length", GgufValueType.UINT32, F)
        .kv("llama.attention.head_count", GgufValueType.UINT32, NH)
        .kv("llama.attention.head_count_kv", GgufValueType.UINT32, NKV)
        .kv("llama.rope.dimension_count", GgufValueType.UINT32, HD) // must equal head dim for llama
        .kv("llama.rope.freq_base", GgufValueType.FLOAT32, 10000)
        .kv("llama.attention.layer_norm_rms_epsilon", GgufValueType.FLOAT32, 1e-5);
    if (o.broken === "expert-used") w.kv("llama.expert_used_count", GgufValueType.UINT32, 2);
    writeTokenizer(w, {tokens, tokenTypes, merges: vocab.merges, bos: ids.bos, eos: ids.eos, chatTemplate: o.chatTemplate});

    /** Encoded N(0, std) values of tensor `name` (its own PRNG stream; the fast fill for large tensors). */
    const gaussBytes = (name: string, n: number, std: number, type: GgmlTensorType): Buffer => {
        const rng = new NormalRng(o.seed, name);
        if (n >= FAST_FILL_MIN_ELEMENTS) return fillFastNormal(rng, n, std, type);
        const a = new Float32Array(n);
        for (let i = 0; i < n; i++) a[i] = rng.normal() * std;
        return encodeTensorData(a, type, name);
    };
    const ones = (n: number): Float32Array => new Float32Array(n).fill(1);
    // Linear(in -> out): ne = [in, out], std 1/sqrt(in)
    const linear = (name: string, fanIn: number, fanOut: number): void => {
        w.lazyTensor(name, [fanIn, fanOut], mat, () => gaussBytes(name, fanIn * fanOut, 1 / Math.sqrt(fanIn), mat));
    };

    w.lazyTensor("token_embd.weight", [H, V], mat, () => gaussBytes("token_embd.weight", H * V, 1, mat));
    for (let l = 0; l < o.layers; l++) {
        const p = `blk.${l}.`;
        w.tensor(p + "attn_norm.weight", [H], ones(H));
        linear(p + "attn_q.weight", H, NH * HD);
        linear(p + "attn_k.weight", H, NKV * HD);
        linear(p + "attn_v.weight", H, NKV * HD);
        linear(p + "attn_output.weight", NH * HD, H);
        w.tensor(p + "ffn_norm.weight", [H], ones(H));
        linear(p + "ffn_gate.weight", H, F);
        linear(p + "ffn_up.weight", H, F);
        linear(p + "ffn_down.weight", F, H);
    }
    w.tensor("output_norm.weight", [H], ones(H));
    w.lazyTensor("output.weight", [H, V], mat, () => {
        const head = gaussBytes("output.weight", H * V, o.logitScale / Math.sqrt(H), mat);
        // control-token rows zeroed (see above); the encoded zero is all-zero bytes in F32 and F16 alike
        const rowBytes = H * (mat === GgmlTensorType.F16 ? 2 : 4);
        for (const id of [ids.bos, ids.imStart, ids.eos]) head.fill(0, id * rowBytes, (id + 1) * rowBytes);
        return head;
    });
    return w;
}

/**
 * Named shapes for `keel make-model --shape` (sizes of public model configs; the weights stay random and the
 * architecture llama): realistic vocabulary and matrix sizes for measuring per-token and per-step costs.
 */
export const MODEL_SHAPES = Object.freeze({
    /** Qwen2.5-0.5B: 24 layers, hidden 896, 14 query / 2 KV heads, FFN 4864, vocabulary 151936. */
    "qwen2.5-0.5b": Object.freeze({layers: 24, hidden: 896, ff: 4864, heads: 14, kvHeads: 2, vocab: 151936, ctx: 32768}),
    /** Llama-3-8B: 32 layers, hidden 4096, 32 query / 8 KV heads, FFN 14336, vocabulary 128256. */
    "llama3-8b": Object.freeze({layers: 32, hidden: 4096, ff: 14336, heads: 32, kvHeads: 8, vocab: 128256, ctx: 8192})
} satisfies Record<string, Readonly<TinyModelOptions>>);

/** Name of one of the {@link MODEL_SHAPES}. */
export type ModelShapeName = keyof typeof MODEL_SHAPES;
