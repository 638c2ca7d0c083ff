/**
 * Deterministic random-weight GGUF models WITH RECURRENT STATE, for testing how Keel treats sequences whose memory
 * cannot be partially evicted (docs/recurrent-model.md).
 *
 * Two architectures of the bundled llama.cpp (node-llama-cpp 3.21.1):
 * - `mamba`: pure Mamba-1 (every layer an SSM block; `llm_arch_is_recurrent`). The whole sequence memory is one
 *   recurrent cell per sequence: a conv state ((d_conv-1) x d_inner) and an SSM state (d_state x d_inner) per layer.
 * - `jamba`: hybrid (`llm_arch_is_hybrid`): Mamba-1 layers (with the dt/B/C RMS norms) plus attention layers (no
 *   RoPE) and a SwiGLU FFN after every layer. Memory = a KV cache for the attention layers + a recurrent cache
 *   for the Mamba layers (`llama_memory_hybrid`).
 *
 * Vocabulary, tokenizer, chat template and control tokens are exactly those of {@link buildTinyModel} (same
 * `merges` -> same token ids), so prompts tokenize identically on both kinds of model. The output-head rows of
 * the control tokens are zero, so greedy decoding practically never emits EOS.
 *
 * Shapes default to values that keep llama.cpp's CPU matmuls off the batch-shape-dependent tinyBLAS path (see
 * {@link isBatchInvariantRecurrentShape}), so a sequence decodes bit-identically alone or batched.
 */
import {GgmlTensorType, GgufValueType, GgufWriter} from "./gguf-writer.js";
import {
    CHATML_TEMPLATE, NormalRng, TINY_MODEL_SPECIAL_TOKENS, tinyModelSpecialIds, vocabFor, writeTokenizer, type TinyModelSpecialIds
} from "./tiny-model.js";

/**
 * Standard deviation of the token embeddings. Small on purpose: the residual stream then carries little of the
 * current token, so the (normalized) SSM / attention branches, i.e. the sequence history, dominate the logits.
 * With N(0, 1) embeddings and the Mamba skip term D = 1, a random Mamba model "forgets": a prompt decoded on top
 * of a stale state often gave the same 16 greedy tokens as a fresh run (7 of 20 prompt pairs), which would make
 * the clear-vs-reuse tests blind. With 0.1 and D = 0: 0 of 20 identical, 14 of 20 differ at the first token.
 */
const EMBED_STD = 0.1;

/** Version of this generator; bump when a change alters the bytes produced for the same options. */
export const TINY_RECURRENT_MODEL_GENERATOR_VERSION = 1;

/** Architectures {@link buildTinyRecurrentModel} can write (`general.architecture`). */
export type TinyRecurrentArch = "mamba" | "jamba";

/** Options of {@link buildTinyRecurrentModel}; every field is optional ({@link TINY_RECURRENT_MODEL_DEFAULTS}). */
export interface TinyRecurrentModelOptions {
    /** `mamba` (pure recurrent) or `jamba` (hybrid attention + Mamba). */
    arch?: TinyRecurrentArch;
    /** Blocks. */
    layers?: number;
    /** Embedding width d_model; the SSM inner size is always 2 x hidden (the only expansion llama.cpp accepts). */
    hidden?: number;
    /** SSM state size d_state (`ssm.state_size`). */
    stateSize?: number;
    /** Causal conv1d kernel width d_conv (`ssm.conv_kernel`), >= 2. */
    convKernel?: number;
    /** Rank of the dt projection (`ssm.time_step_rank`). */
    dtRank?: number;
    /** jamba: query heads of the attention layers; head dim = hidden / heads. */
    heads?: number;
    /** jamba: KV heads of the attention layers; must divide `heads`. */
    kvHeads?: number;
    /** jamba: SwiGLU FFN width. */
    ff?: number;
    /** jamba: indices of the attention layers (the others are Mamba layers); must be non-empty and not all layers. */
    attentionLayers?: readonly number[];
    /** Trained context length, in tokens. */
    ctx?: number;
    /** Maximum number of BPE merges (same vocabulary as the Llama tiny model for the same value). */
    merges?: number;
    /** PRNG seed for all weights (uint32). */
    seed?: number;
    /** Standard deviation of the output-head logits for a unit-RMS final hidden state. */
    logitScale?: number;
    /** Jinja chat template; default ChatML. */
    chatTemplate?: string;
}

/** Fully resolved options. */
export type ResolvedTinyRecurrentModelOptions = Required<Omit<TinyRecurrentModelOptions, "attentionLayers">> & {
    attentionLayers: number[];
};

/**
 * Defaults. hidden 90 (d_inner 180), dt_rank 6, d_state 16 (x_db rows 6 + 2*16 = 38), jamba heads 3 x 30,
 * 1 KV head, FFN 270: every weight matmul has an inner dimension that is not a multiple of 8 and/or an output
 * row count that is not a multiple of 4, so tinyBLAS never runs (see {@link isBatchInvariantRecurrentShape}).
 */
export const TINY_RECURRENT_MODEL_DEFAULTS: Readonly<Omit<ResolvedTinyRecurrentModelOptions, "chatTemplate" | "attentionLayers"> & {
    attentionLayers: readonly number[];
}> = Object.freeze({
    arch: "mamba",
    layers: 3,
    hidden: 90,
    stateSize: 16,
    convKernel: 4,
    dtRank: 6,
    heads: 3,
    kvHeads: 1,
    ff: 270,
    attentionLayers: Object.freeze([1]),
    ctx: 2048,
    merges: 760,
    seed: 1234,
    logitScale: 3
} as const);

/** Fills in defaults and validates. @throws Error on bad sizes or an unknown arch. */
export function resolveTinyRecurrentModelOptions(opts: TinyRecurrentModelOptions = {}): ResolvedTinyRecurrentModelOptions {
    const given = Object.fromEntries(Object.entries(opts).filter(([, v]) => v !== undefined)) as TinyRecurrentModelOptions;
    const r: ResolvedTinyRecurrentModelOptions = {
        ...TINY_RECURRENT_MODEL_DEFAULTS,
        chatTemplate: CHATML_TEMPLATE,
        ...given,
        attentionLayers: [...(given.attentionLayers ?? TINY_RECURRENT_MODEL_DEFAULTS.attentionLayers)]
    };
    if (r.arch !== "mamba" && r.arch !== "jamba") throw new Error(`tiny recurrent model: unknown arch "${String(r.arch)}"`);
    for (const k of ["layers", "hidden", "stateSize", "convKernel", "dtRank", "heads", "kvHeads", "ff", "ctx"] as const) {
        if (!Number.isInteger(r[k]) || r[k] <= 0) throw new Error(`tiny recurrent model: ${k} must be a positive integer, got ${r[k]}`);
    }
    if (r.convKernel < 2) throw new Error("tiny recurrent model: convKernel must be >= 2");
    if (!Number.isInteger(r.merges) || r.merges < 0) throw new Error(`tiny recurrent model: merges must be >= 0, got ${r.merges}`);
    if (!Number.isInteger(r.seed) || r.seed < 0 || r.seed > 0xffffffff) throw new Error("tiny recurrent model: seed must be a uint32");
    if (!(r.logitScale > 0)) throw new Error("tiny recurrent model: logitScale must be > 0");
    if (r.arch === "jamba") {
        if (r.hidden % r.heads !== 0) throw new Error(`tiny recurrent model: hidden (${r.hidden}) must be divisible by heads (${r.heads})`);
        if (r.heads % r.kvHeads !== 0) throw new Error("tiny recurrent model: kvHeads must divide heads");
        const a = new Set(r.attentionLayers);
        if (a.size !== r.attentionLayers.length || r.attentionLayers.some((i) => !Number.isInteger(i) || i < 0 || i >= r.layers)) {
            throw new Error(`tiny recurrent model: attentionLayers must be distinct layer indices in [0, ${r.layers})`);
        }
        if (a.size === 0 || a.size === r.layers) {
            throw new Error("tiny recurrent model: a jamba model needs at least one attention and one Mamba layer");
        }
        r.attentionLayers.sort((x, y) => x - y);
    } else {
        r.attentionLayers = [];
    }
    return r;
}

/** Control-token ids and vocabulary size (identical to the Llama tiny model's for the same `merges`). */
export function tinyRecurrentModelSpecialIds(opts: TinyRecurrentModelOptions = {}): TinyModelSpecialIds {
    return tinyModelSpecialIds({merges: resolveTinyRecurrentModelOptions(opts).merges});
}

/**
 * True if no weight matmul of the model can take ggml-cpu's tinyBLAS path (which needs inner dim k % SIMD width
 * == 0 AND output rows m % 4 == 0, SIMD width 4 on NEON, 8 on AVX2, 16 on AVX-512): with it, a sequence's logits
 * would depend on how many of its tokens share a ubatch. Checked per matmul, for the smallest SIMD width (4):
 * ssm_in (k hidden), ssm_x (k 2*hidden, m dtRank + 2*stateSize), ssm_dt (k dtRank), ssm_out (k 2*hidden, m hidden),
 * output (k hidden); jamba also Q/K/V/O (k hidden), KQ (k head dim), KQV (m head dim), FFN (k hidden / ff).
 */
export function isBatchInvariantRecurrentShape(opts: TinyRecurrentModelOptions = {}): boolean {
    const o = resolveTinyRecurrentModelOptions(opts);
    const ok = (k: number, m: number): boolean => k % 4 !== 0 || m % 4 !== 0;
    const H = o.hidden, DI = 2 * H;
    let good = ok(H, 2 * DI) && ok(DI, o.dtRank + 2 * o.stateSize) && ok(o.dtRank, DI) && ok(DI, H);
    if (o.arch === "jamba") {
        const HD = H / o.heads;
        // KQ has k = head dim and KQV m = head dim, the other side being the (variable) number of KV cells
        good &&= ok(H, H) && ok(H, o.kvHeads * HD) && HD % 4 !== 0 && ok(H, o.ff) && ok(o.ff, H);
    }
    // the output head: m = vocab size, which we do not control; k = hidden must do it
    return good && H % 4 !== 0;
}

/**
 * Builds a tiny random-weight `mamba` or `jamba` GGUF in memory (byte-identical for identical options).
 *
 * Weights (Mamba reference init where it matters for a stable recurrence): matrices ~ N(0, 1/sqrt(fan_in)),
 * token embeddings N(0, 0.1) (see {@link EMBED_STD}), norms 1, `ssm_a` = -[1..d_state] per channel (S4D-real,
 * stored as A = -exp(A_log) the way convert_hf_to_gguf.py stores it), `ssm_d` = 0 (no skip: the output of a
 * Mamba block is all state), the dt bias = softplus^-1(dt) with dt log-uniform in [0.001, 0.1], conv bias
 * N(0, 0.1). Output head N(0, logitScale/sqrt(hidden)) with the control-token rows zeroed.
 * @returns the complete GGUF file
 * @throws Error on invalid options (see {@link resolveTinyRecurrentModelOptions})
 */
export function buildTinyRecurrentModel(opts: TinyRecurrentModelOptions = {}): Buffer {
    const o = resolveTinyRecurrentModelOptions(opts);
    const vocab = vocabFor(o.merges);
    const tokens = [...vocab.byteTokens, ...vocab.mergedTokens, ...TINY_MODEL_SPECIAL_TOKENS];
    const ids = tinyModelSpecialIds({merges: o.merges});
    const V = ids.vocabSize;
    const TOKEN_NORMAL = 1, TOKEN_CONTROL = 3;
    const tokenTypes = tokens.map((_, i) => (i >= ids.bos ? TOKEN_CONTROL : TOKEN_NORMAL));

    const A = o.arch;
    const H = o.hidden, DI = 2 * H, N = o.stateSize, K = o.convKernel, R = o.dtRank;
    const isAttn = (l: number): boolean => o.attentionLayers.includes(l);

    const w = new GgufWriter();
    w.kv("general.architecture", GgufValueType.STRING, A)
        .kv("general.name", GgufValueType.STRING, `keel-tiny-${A}`)
        .kv("general.description", GgufValueType.STRING, "random-weight recurrent-state test model generated by Keel")
        .kv("general.file_type", GgufValueType.UINT32, 0) // ALL_F32
        .kv(`${A}.vocab_size`, GgufValueType.UINT32, V)
        .kv(`${A}.context_length`, GgufValueType.UINT32, o.ctx)
        .kv(`${A}.embedding_length`, GgufValueType.UINT32, H)
        .kv(`${A}.block_count`, GgufValueType.UINT32, o.layers);
    if (A === "mamba") {
        // what convert_hf_to_gguf.py writes for Mamba-1: no FFN, no attention heads
        w.kv(`${A}.feed_forward_length`, GgufValueType.UINT32, 0)
            .kv(`${A}.attention.head_count`, GgufValueType.UINT32, 0);
    } else {
        w.kv(`${A}.feed_forward_length`, GgufValueType.UINT32, o.ff)
            .kv(`${A}.attention.head_count`, GgufValueType.UINT32, o.heads)
            // per layer: 0 marks a Mamba (recurrent) layer (llama_model_jamba::load_arch_hparams)
            .kvArray(`${A}.attention.head_count_kv`, GgufValueType.UINT32,
                Array.from({length: o.layers}, (_, l) => (isAttn(l) ? o.kvHeads : 0)));
    }
    w.kv(`${A}.ssm.conv_kernel`, GgufValueType.UINT32, K)
        .kv(`${A}.ssm.inner_size`, GgufValueType.UINT32, DI)
        .kv(`${A}.ssm.state_size`, GgufValueType.UINT32, N)
        .kv(`${A}.ssm.time_step_rank`, GgufValueType.UINT32, R)
        .kv(`${A}.attention.layer_norm_rms_epsilon`, GgufValueType.FLOAT32, 1e-5);
    writeTokenizer(w, {tokens, tokenTypes, merges: vocab.merges, bos: ids.bos, eos: ids.eos, chatTemplate: o.chatTemplate});

    const gauss = (name: string, n: number, std: number): Float32Array => {
        const rng = new NormalRng(o.seed, `${A}:${name}`);
        const a = new Float32Array(n);
        for (let i = 0; i < n; i++) a[i] = rng.normal() * std;
        return a;
    };
    const ones = (n: number): Float32Array => new Float32Array(n).fill(1);
    const linear = (name: string, fanIn: number, fanOut: number): void => {
        w.tensor(name, [fanIn, fanOut], gauss(name, fanIn * fanOut, 1 / Math.sqrt(fanIn)));
    };

    w.tensor("token_embd.weight", [H, V], gauss("token_embd.weight", H * V, EMBED_STD));
    for (let l = 0; l < o.layers; l++) {
        const p = `blk.${l}.`;
        w.tensor(p + "attn_norm.weight", [H], ones(H));
        if (isAttn(l)) {
            const HD = H / o.heads;
            linear(p + "attn_q.weight", H, H);
            linear(p + "attn_k.weight", H, o.kvHeads * HD);
            linear(p + "attn_v.weight", H, o.kvHeads * HD);
            linear(p + "attn_output.weight", H, H);
        } else {
            linear(p + "ssm_in.weight", H, 2 * DI); // x and z halves
            linear(p + "ssm_conv1d.weight", K, DI); // ne [d_conv, d_inner]
            w.tensor(p + "ssm_conv1d.bias", [DI], gauss(p + "ssm_conv1d.bias", DI, 0.1));
            linear(p + "ssm_x.weight", DI, R + 2 * N); // -> [dt | B | C]
            if (A === "jamba") w.tensor(p + "ssm_dt_norm.weight", [R], ones(R));
            linear(p + "ssm_dt.weight", R, DI);
            const rng = new NormalRng(o.seed, `${A}:${p}ssm_dt.bias`);
            const dtBias = new Float32Array(DI);
            for (let i = 0; i < DI; i++) {
                const dt = Math.exp(Math.log(1e-3) + rng.uniform() * (Math.log(1e-1) - Math.log(1e-3)));
                dtBias[i] = dt + Math.log(-Math.expm1(-dt)); // inverse softplus
            }
            w.tensor(p + "ssm_dt.bias", [DI], dtBias);
            if (A === "jamba") {
                w.tensor(p + "ssm_b_norm.weight", [N], ones(N));
                w.tensor(p + "ssm_c_norm.weight", [N], ones(N));
            }
            const a = new Float32Array(N * DI);
            for (let d = 0; d < DI; d++) for (let s = 0; s < N; s++) a[d * N + s] = -(s + 1);
            w.tensor(p + "ssm_a", [N, DI], a); // no ".weight" suffix (llama.cpp's naming)
            w.tensor(p + "ssm_d", [DI], new Float32Array(DI) /* D = 0: no skip path */);
            linear(p + "ssm_out.weight", DI, H);
        }
        if (A === "jamba") {
            w.tensor(p + "ffn_norm.weight", [H], ones(H));
            linear(p + "ffn_gate.weight", H, o.ff);
            linear(p + "ffn_up.weight", H, o.ff);
            linear(p + "ffn_down.weight", o.ff, H);
        }
    }
    w.tensor("output_norm.weight", [H], ones(H));
    const head = gauss("output.weight", H * V, o.logitScale / Math.sqrt(H));
    for (const id of [ids.bos, ids.imStart, ids.eos]) head.fill(0, id * H, (id + 1) * H);
    w.tensor("output.weight", [H, V], head);
    return w.toBuffer();
}
