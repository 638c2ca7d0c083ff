/**
 * The ONLY module that touches node-llama-cpp internals (pinned: node-llama-cpp 3.21.1).
 *
 * Why internals: the public multi-sequence `evaluate()` path samples sequences in parallel on libuv threads while
 * llama.cpp's lazy `output_reorder()` is not thread-safe, so a sequence can receive a token sampled from another
 * sequence's logits (docs/upstream.md). It also batches N−1 of N sequences, cannot cancel a queued
 * prefill, and blocks slot reuse until the whole batch loop drains. This adapter exposes the native context's batch
 * primitives (`initBatch` / `addToBatch` / `decodeBatch` / `sampleToken` / `disposeSequence`) so the engine loop can
 * build exactly one batch per step and sample sequentially.
 *
 * Contract (checked by src/engine/llama-adapter.contract.test.ts, which must be re-run on any upgrade):
 * - one native call at a time: the caller never calls into the context while `decode()` is pending;
 * - `clearSequence()` frees a slot's KV at once (only between decodes);
 * - a failed decode is rolled back by llama.cpp and the next decode works;
 * - sampling never changes the context's logits (AddonSampler copies them into its own candidate array), so the
 *   raw-distribution log probabilities of a position can be read with extra samplers before or after the request's
 *   own sampler; a top-k + greedy-confidence pair of calls equals the full softmax;
 * - a native repetition-penalty sampler accepts every token it samples (acceptToken), and applyConfig keeps its
 *   state when given the same history (else rebuilds it from the given tokens): the adapter mirrors that history.
 */
import { getLlama, LlamaLogLevel, type Llama, type LlamaContext, type LlamaModel } from "node-llama-cpp";
import type { EngineBackend, ModelMetadata } from "../protocol/messages.js";
import { loadWithKeelAddon, type NativeAddonChoice } from "../native/loader.js";

/**
 * The order to add a batch's items to llama.cpp's batch: by slot (sequence id), stable. With one KV stream per
 * sequence, llama.cpp splits a batch into micro-batches of consecutive increasing sequence ids only
 * (`split_equal(..., sequential = true)`), one graph run each: a batch in admission order — slots permuted by reuse —
 * ran as many micro-batches as it had descents, doubling the step time at 64 streams on the H200.
 */
export function slotOrder(items: readonly { slot: number }[]): number[] {
  return items.map((_, i) => i).sort((a, b) => items[a]!.slot - items[b]!.slot || a - b);
}

/** Options of {@link LlamaAdapter.open}. */
/** A GPU was required (device "gpu") and no GPU backend of node-llama-cpp (CUDA, Vulkan, Metal) loads here. */
export class NoGpuBackendError extends Error {
  constructor() {
    super("no GPU backend loads on this machine (node-llama-cpp's prebuilt CUDA, Vulkan and Metal backends were tried)");
    this.name = "NoGpuBackendError";
  }
}

export interface LlamaAdapterOptions {
  modelPath: string;
  /** KV slots (llama.cpp sequences). */
  sequences: number;
  /** Capacity of one slot (tokens). */
  contextSize: number;
  /** Largest batch one decode may hold (tokens); must be ≥ sequences. */
  batchSize: number;
  /** CPU threads for ggml; set explicitly (node-llama-cpp's default oversubscribes small machines; docs/upstream.md). */
  threads: number;
  /** Flash attention; off by default because it adds batch-shape-dependent numerics (docs/batch-variance.md). */
  flashAttention: boolean;
  /** KV cache element type for K and V ("f16", "f32", "q8_0", …). A quantized V needs flash attention. */
  kvCacheType: "f16" | "f32" | "q8_0" | "q4_0";
  /** "cpu" never touches a GPU; "auto" lets node-llama-cpp pick a prebuilt GPU backend if one works. */
  gpu: "cpu" | "auto" | "gpu";
  /** Receives llama.cpp's log lines at warn level and above. */
  log?: (level: string, message: string) => void;
  /** Receives the model's load progress (0..1) while llama.cpp loads its tensors. */
  onLoadProgress?: (progress: number) => void;
}

/**
 * Sampling configuration of one sequence. The native chain applies, in this order (llama/addon/AddonSampler.cpp
 * `rebuildChainIfNeeded`): `bias` (additive) → repetition penalty → then greedy argmax when temperature is 0, else
 * top-k → top-p → min-p → temperature → seeded draw. Greedy skips top-k/top-p/min-p (they cannot change the argmax).
 */
export interface SamplerConfig {
  temperature: number;
  topP: number;
  topK: number;
  /** Min-p cut relative to the most likely token (0 = off). */
  minP: number;
  /** Seed for the next token; the engine reseeds per position. */
  seed: number;
  /**
   * Additive logit bias per token id (-Infinity bans: EOG tokens under ignore_eos, EOG and stop tokens before
   * min_tokens, logit_bias, presence/frequency penalties). Compared by identity: pass the same map while unchanged.
   */
  bias: ReadonlyMap<number, number>;
  /**
   * Multiplicative repetition penalty (1 = off): a logit l of a token that occurs in the penalty history becomes
   * l / r when l > 0, else l · r. The history is what `createSampler` was given plus every token sampled with it.
   */
  repetitionPenalty: number;
  /**
   * Grammar state to constrain the next sample with (a rule phase of a guided request), or null/absent for none.
   * Every configure passes it while constrained: node-llama-cpp's applyConfig drops the grammar when the key is
   * missing (AddonSampler.cpp), so the adapter, not the caller, always forwards it.
   */
  grammar?: GrammarState | null;
}

/** A GBNF grammar compiled with one root (opaque; {@link LlamaAdapter.compileGrammar} caches them by text). */
export interface CompiledGrammar {
  /** Cache key: root rule, literal prefix and grammar text. */
  readonly key: string;
}

/**
 * One grammar evaluation state (opaque): the position of one request inside its rule. `dead` is set once anything
 * failed on it (a rejected accept, a sampler error, a sample that found every token masked): llama.cpp's state is then
 * possibly emptied, and touching it again aborts the process (GGML_ASSERT), so the adapter refuses to, in JS.
 */
export interface GrammarState {
  readonly grammar: CompiledGrammar;
  dead: boolean;
}

/** A sample under a grammar found nothing the grammar allows (the state is dead; sample again unconstrained). */
export class GrammarMaskedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "GrammarMaskedError";
  }
}

/** Compiled grammars kept (LRU): a gateway sends the same tool grammar with every request of a conversation. */
const GRAMMAR_CACHE_SIZE = 32;
/** Total GBNF text the cache keeps (bytes, approximately: UTF-16 length); a guide may carry up to 4 MiB. */
const GRAMMAR_CACHE_BYTES = 16 * 1024 * 1024;

/** Root rule name of a compiled trigger/close variant: `literal prefix` then the phase's rule (reserved name). */
export const PREFIXED_ROOT_RULE = "keel-prefixed-root";

/** GBNF string literal of `text` (escapes quote, backslash and control characters; other characters verbatim). */
export function gbnfLiteral(text: string): string {
  let out = '"';
  for (const ch of text) {
    const c = ch.codePointAt(0)!;
    if (ch === '"' || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || c === 0x7f) out += "\\x" + c.toString(16).padStart(2, "0");
    else out += ch;
  }
  return out + '"';
}

/** Log probabilities at one position from the raw model distribution (see {@link LlamaAdapter.logprobs}). */
export interface RawLogprobs {
  token: number;
  logprob: number;
  top: { token: number; logprob: number }[];
}

/** Tokens whose log probabilities one top-k call returns: the sampled token is usually among them. */
const LOGPROB_WINDOW = 20;

/** Floor for a probability that underflows float32 (log 0): OpenAI's value for an impossible token. */
export const MIN_LOGPROB = -9999;

/** One item of {@link LlamaAdapter.sampleMany}: a sequence's batch logit index and its sampler. */
export interface SampleRequest {
  batchLogitIndex: number;
  sampler: SamplerHandle;
}

/** Opaque per-sequence sampler. */
export interface SamplerHandle {
  configure(cfg: SamplerConfig): void;
  dispose(): void;
}

/** A native sampler and the mirror of its penalty history. */
interface SamplerState {
  native: NativeSampler;
  /** Record a token the native sampler accepted. */
  accept(token: number): void;
  /** Grammar state attached by the last configure (the sampler feeds each sampled non-EOG token into it). */
  grammar: GrammarState | null;
}

/** One entry of a native batch. */
export interface DecodeItem {
  slot: number;
  pos: number;
  tokens: number[];
  wantsLogits: boolean;
}

/* Shapes of the internals we use (node-llama-cpp 3.21.1 dist/bindings/AddonTypes.d.ts). */
interface NativeContext {
  initBatch(size: number): void;
  addToBatch(sequenceId: number, firstTokenSequenceIndex: number, tokens: Uint32Array, logitIndexes: Uint32Array): Uint32Array;
  decodeBatch(): Promise<void>;
  sampleToken(batchLogitIndex: number, sampler: NativeSampler): Promise<number>;
  sampleToken(
    batchLogitIndex: number,
    sampler: NativeSampler,
    probabilities: boolean,
    confidence?: boolean,
  ): Promise<[token: number, probabilities: number[] | undefined, confidence: number | undefined]>;
  disposeSequence(sequenceId: number): void;
  removeTokenCellsFromSequence(sequenceId: number, startPos: number, endPos: number): boolean;
  setThreads(threads: number): void;
}
interface NativeSampler {
  applyConfig(config: Record<string, unknown>): void;
  dispose(): void;
}
/** Opaque native grammar (AddonGrammar) and evaluation state (AddonGrammarEvaluationState). */
type NativeGrammar = object;
type NativeGrammarState = object;
interface NativeGrammarBindings {
  Grammar: new (text: string, options: { addonExports: unknown; rootRuleName: string }) => NativeGrammar;
  State: { new (model: unknown, grammar: NativeGrammar): NativeGrammarState; new (existing: NativeGrammarState): NativeGrammarState };
  accept(state: NativeGrammarState, token: number): void;
  canBeNext(state: NativeGrammarState, token: number): boolean;
}
interface NativeModel {
  getTokenString(token: number): string | undefined;
  getTokenAttributes(token: number): number;
  getVocabularyType(): number;
  isEogToken(token: number): boolean;
}
/**
 * Keel's synchronous step sampler (src/native/keel-sampling.cpp), present only when Keel's addon is loaded: fills
 * `out[i]` with the token of item i (-1: nothing selected; -2: failed, its message at index i of the returned array).
 */
type NativeSampleTokens = (context: NativeContext, logitIndices: Int32Array, samplers: NativeSampler[], out: Int32Array) => (string | undefined)[] | undefined;
/** Keel's synchronous decode of the batch built with initBatch/addToBatch (throws decodeBatch's messages). */
type NativeDecodeSync = (context: NativeContext) => void;
interface Internals {
  ctx: NativeContext;
  /** Keel's one-call sampler of a whole step, or null when node-llama-cpp's own addon runs. */
  sampleTokens: NativeSampleTokens | null;
  /** Keel's decode on the calling thread (no worker hop), or null when node-llama-cpp's own addon runs. */
  decodeSync: NativeDecodeSync | null;
  model: NativeModel;
  SamplerClass: new (model: unknown) => NativeSampler;
  grammar: NativeGrammarBindings;
  disposeGuard: { createPreventDisposalHandle(): { dispose(): void } };
}

function internalsOf(llama: Llama, model: LlamaModel, context: LlamaContext): Internals {
  const c = context as unknown as { _ctx?: NativeContext; _backendContextDisposeGuard?: Internals["disposeGuard"] };
  const m = model as unknown as { _model?: NativeModel };
  type SamplerStatics = Internals["SamplerClass"] & {
    acceptGrammarEvaluationStateToken?: (state: NativeGrammarState, token: number) => void;
    canBeNextTokenForGrammarEvaluationState?: (state: NativeGrammarState, token: number) => boolean;
  };
  const l = llama as unknown as {
    _bindings?: { AddonSampler?: SamplerStatics; AddonGrammar?: NativeGrammarBindings["Grammar"]; AddonGrammarEvaluationState?: NativeGrammarBindings["State"]; keelSampleTokens?: NativeSampleTokens; keelDecodeBatch?: NativeDecodeSync };
  };
  const b = l._bindings;
  const S = b?.AddonSampler;
  if (!c._ctx || !c._backendContextDisposeGuard || !m._model || !S || !b?.AddonGrammar || !b.AddonGrammarEvaluationState) {
    throw new Error("node-llama-cpp internals changed: _ctx/_model/_bindings.AddonSampler/AddonGrammar not found (pinned 3.21.1 expected)");
  }
  if (!S.acceptGrammarEvaluationStateToken || !S.canBeNextTokenForGrammarEvaluationState) {
    throw new Error("node-llama-cpp internals changed: AddonSampler grammar helpers not found (pinned 3.21.1 expected)");
  }
  const grammar: NativeGrammarBindings = {
    Grammar: b.AddonGrammar,
    State: b.AddonGrammarEvaluationState,
    accept: S.acceptGrammarEvaluationStateToken.bind(S),
    canBeNext: S.canBeNextTokenForGrammarEvaluationState.bind(S),
  };
  const sampleTokens = typeof b.keelSampleTokens === "function" ? b.keelSampleTokens : null;
  const decodeSync = typeof b.keelDecodeBatch === "function" ? b.keelDecodeBatch : null;
  return { ctx: c._ctx, sampleTokens, decodeSync, model: m._model, SamplerClass: S, grammar, disposeGuard: c._backendContextDisposeGuard };
}

/**
 * GGUF architectures whose memory includes recurrent state (llama.cpp `llm_arch_is_recurrent` / `_is_hybrid`):
 * such state cannot be partially removed (`llama_memory_seq_rm` fails for a partial range).
 */
const RECURRENT_ARCHITECTURES = new Set([
  "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "jamba", "falcon-h1", "granitehybrid", "plamo2",
  "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen3next", "qwen35", "qwen35moe", "kimi-linear", "minimax-01",
]);

/** KV elements per token (K + V over all layers) from GGUF hyperparameters; null when they are missing. */
function kvElementsPerToken(meta: Record<string, Record<string, unknown> | undefined>): number | null {
  const arch = String(meta["general"]?.["architecture"] ?? "");
  const h = meta[arch] as Record<string, unknown> | undefined;
  const att = (h?.["attention"] ?? {}) as Record<string, unknown>;
  const num = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const layers = num(h?.["block_count"]);
  const heads = num(att["head_count"]);
  const kvHeads = num(att["head_count_kv"]) ?? heads;
  const embd = num(h?.["embedding_length"]);
  if (layers === null || heads === null || kvHeads === null || embd === null || heads === 0) return null;
  const keyLen = num(att["key_length"]) ?? embd / heads;
  const valueLen = num(att["value_length"]) ?? embd / heads;
  return layers * kvHeads * (keyLen + valueLen);
}

/** llama.cpp vocabulary types (llama.h `enum llama_vocab_type`). */
const VOCAB_SPM = 1;
const VOCAB_BPE = 2;

/** GPT-2's byte ↔ printable-character map, inverted: vocab character → byte. */
function gpt2UnicodeToByte(): Map<string, number> {
  const bytes: number[] = [];
  for (let b = 33; b <= 126; b++) bytes.push(b);
  for (let b = 161; b <= 172; b++) bytes.push(b);
  for (let b = 174; b <= 255; b++) bytes.push(b);
  const chars = bytes.map((b) => b);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    if (!bytes.includes(b)) {
      bytes.push(b);
      chars.push(256 + extra++);
    }
  }
  const map = new Map<string, number>();
  bytes.forEach((b, i) => map.set(String.fromCodePoint(chars[i]!), b));
  return map;
}

export class LlamaAdapter {
  /** Raw bytes each token contributes to the output text; control tokens contribute none. */
  private readonly tokenBytes: Uint8Array[];
  /** End-of-generation token ids. */
  readonly eogTokens: number[];
  /** True while a decode is in flight (guards the one-native-call contract). */
  private decoding = false;
  /** Matches the text of any control token (ChatML markers, BOS/EOS), or null if the model has none. */
  private readonly controlPattern: RegExp | null;
  /** Longest byte length of a normal token's text. */
  private readonly maxTokenBytes: number;
  /** End-of-generation tokens as a set (checked per sampled token without a native call). */
  private readonly eogSet: Set<number>;
  /** Native sampler behind each handle. */
  private readonly samplers = new WeakMap<SamplerHandle, SamplerState>();
  /** Compiled grammars by {@link CompiledGrammar.key}, least recently used first (Map order). */
  private readonly grammarCache = new Map<string, { handle: CompiledGrammar; native: NativeGrammar }>();
  /** Sum of the cache keys' lengths (the GBNF texts dominate). */
  private grammarCacheBytes = 0;
  /** Native grammar behind each compiled handle (a handle evicted from the cache stays usable). */
  private readonly nativeGrammars = new WeakMap<CompiledGrammar, NativeGrammar>();
  /** Native evaluation state behind each grammar state handle. */
  private readonly nativeStates = new WeakMap<GrammarState, NativeGrammarState>();
  /**
   * Tokens llama.cpp's grammar can never accept and does not reject on accept either: their piece starts with a
   * NUL byte (byte-level vocabularies have one), so accept feeds nothing and returns. A sample under a grammar that
   * returns one means every token was masked (measured: greedy then picks candidate 0).
   */
  private readonly grammarInert: Set<number>;
  /** Control and user-defined tokens that are not end-of-generation, with their text (banned in rule phases). */
  private readonly specials: { token: number; text: string }[];
  /** Sampler used only to probe whether a grammar can continue (see {@link grammarCanContinue}). */
  private probeSampler: NativeSampler | null = null;

  private constructor(
    private readonly llama: Llama,
    private readonly model: LlamaModel,
    private readonly context: LlamaContext,
    private readonly native: Internals,
    readonly options: LlamaAdapterOptions,
    /** The native addon node-llama-cpp runs on: Keel's build (with {@link sampleMany}) or its own. */
    readonly nativeAddon: NativeAddonChoice,
  ) {
    const sampleTokens = native.sampleTokens;
    if (sampleTokens) this.sampleMany = (batch) => this.sampleManyNative(sampleTokens, batch);
    const n = this.vocabSize;
    this.tokenBytes = new Array<Uint8Array>(n);
    this.eogTokens = [];
    const vocabType = native.model.getVocabularyType();
    const gpt2 = vocabType === VOCAB_BPE ? gpt2UnicodeToByte() : null;
    const enc = new TextEncoder();
    const controls: string[] = [];
    let maxBytes = 1;
    this.grammarInert = new Set();
    this.specials = [];
    const CONTROL = 1 << 3; // llama.h LLAMA_TOKEN_ATTR_CONTROL
    const USER_DEFINED = 1 << 4; // llama.h LLAMA_TOKEN_ATTR_USER_DEFINED
    for (let t = 0; t < n; t++) {
      const eog = native.model.isEogToken(t);
      if (eog) this.eogTokens.push(t);
      if (!eog && native.model.getTokenAttributes(t) & (CONTROL | USER_DEFINED)) this.specials.push({ token: t, text: native.model.getTokenString(t) ?? "" });
      this.tokenBytes[t] = this.computeTokenBytes(t, vocabType, gpt2, enc);
      if (this.tokenBytes[t]!.length > 0 && this.tokenBytes[t]![0] === 0) this.grammarInert.add(t);
      if (this.tokenBytes[t]!.length === 0) {
        const text = native.model.getTokenString(t);
        if (text) controls.push(text);
      } else maxBytes = Math.max(maxBytes, this.tokenBytes[t]!.length);
    }
    this.maxTokenBytes = maxBytes;
    this.eogSet = new Set(this.eogTokens);
    const escaped = controls.sort((a, b) => b.length - a.length).map((c) => c.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    this.controlPattern = escaped.length > 0 ? new RegExp(escaped.join("|"), "g") : null;
  }

  /** Load a model and create its context. @throws Error when the model or context cannot be created. */
  static async open(opts: LlamaAdapterOptions): Promise<LlamaAdapter> {
    // Keel's addon (one synchronous call samples a step) replaces node-llama-cpp's for the directory it loads from,
    // when one was built for it (scripts/build-native.mjs); else node-llama-cpp's own addon runs (src/native/loader.ts).
    const { value: llama, addon } = await loadWithKeelAddon(() =>
      getLlama({
        gpu: opts.gpu === "cpu" ? false : "auto",
        build: "never", // no internet here: use the prebuilt binaries only
        maxThreads: opts.threads,
        logLevel: LlamaLogLevel.warn,
        logger: (level, message) => opts.log?.(String(level), message),
      }),
    );
    // "gpu" asks for a GPU: node-llama-cpp's "auto" falls back to CPU silently when no GPU backend loads, so that
    // case is an error here, before the model is read.
    if (opts.gpu === "gpu" && llama.gpu === false) throw new NoGpuBackendError();
    const model = await llama.loadModel({ modelPath: opts.modelPath, ...(opts.onLoadProgress ? { onLoadProgress: opts.onLoadProgress } : {}) });
    const kv = opts.kvCacheType.toUpperCase() as "F16";
    const context = await model.createContext({
      contextSize: opts.contextSize,
      sequences: opts.sequences,
      batchSize: opts.batchSize,
      threads: opts.threads,
      flashAttention: opts.flashAttention,
      experimentalKvCacheKeyType: kv,
      experimentalKvCacheValueType: kv,
    });
    const native = internalsOf(llama, model, context);
    native.ctx.setThreads(opts.threads);
    const nativeAddon: NativeAddonChoice =
      addon.kind === "keel" && !native.sampleTokens ? { kind: "node-llama-cpp", reason: `${addon.path} has no keelSampleTokens` } : addon;
    return new LlamaAdapter(llama, model, context, native, opts, nativeAddon);
  }

  /** The backend llama.cpp runs on and its devices, for `ready` and the startup log. */
  async backend(): Promise<EngineBackend> {
    const gpu = this.llama.gpu;
    return { gpu, devices: gpu === false ? [] : await this.llama.getGpuDeviceNames(), addon: this.nativeAddon.kind };
  }

  /** Metadata sent to the gateway in `ready`. */
  metadata(): ModelMetadata {
    const meta = this.model.fileInfo.metadata as unknown as Record<string, Record<string, unknown> | undefined>;
    const general = meta["general"] ?? {};
    const tokenizer = (meta["tokenizer"] ?? {}) as Record<string, unknown>;
    const template = (tokenizer["chat_template"] as string | undefined) ?? null;
    const bos = this.model.tokens.bos;
    const eos = this.model.tokens.eos;
    return {
      path: this.options.modelPath,
      name: (general["name"] as string | undefined) ?? null,
      architecture: String(general["architecture"] ?? "unknown"),
      trainContextSize: this.model.trainContextSize,
      vocabSize: this.vocabSize,
      chatTemplate: template,
      kvElementsPerToken: kvElementsPerToken(meta),
      bosToken: bos == null ? "" : (this.native.model.getTokenString(bos) ?? ""),
      eosToken: eos == null ? "" : (this.native.model.getTokenString(eos) ?? ""),
    };
  }

  /** Vocabulary size (tokens). */
  get vocabSize(): number {
    if (this.cachedVocabSize === undefined) {
      const meta = this.model.fileInfo.metadata as unknown as { tokenizer?: { ggml?: { tokens?: unknown[] } } };
      this.cachedVocabSize = meta.tokenizer?.ggml?.tokens?.length ?? 0;
    }
    return this.cachedVocabSize;
  }
  /** Vocabulary size, read once from the GGUF metadata (it is used per sampled token). */
  private cachedVocabSize: number | undefined;

  /** Capacity of one slot as created (tokens). */
  get contextSize(): number {
    return this.context.contextSize;
  }

  /** The BOS token id the tokenizer prepends, or null when the model adds none (for `tokenize` without specials). */
  get bosToken(): number | null {
    return this.model.tokens.bos != null && this.model.tokens.shouldPrependBosToken ? this.model.tokens.bos : null;
  }

  /** Tokenize prompt text, parsing special tokens (as llama.cpp's server does for chat prompts). */
  tokenize(text: string): number[] {
    const tokens = this.model.tokenize(text, true) as number[];
    const bos = this.model.tokens.bos;
    if (bos != null && this.model.tokens.shouldPrependBosToken && tokens[0] !== bos) tokens.unshift(bos);
    return tokens;
  }

  /**
   * Lower bound on the token count of `text` (see ModelBackend.tokenLowerBound): every control-token marker is one
   * token, and every other token covers at most `maxTokenBytes` bytes of the remaining text.
   */
  tokenLowerBound(text: string): number {
    let markers = 0;
    let markerBytes = 0;
    if (this.controlPattern) {
      for (const m of text.matchAll(this.controlPattern)) {
        markers += 1;
        markerBytes += Buffer.byteLength(m[0]);
      }
    }
    const rest = Buffer.byteLength(text) - markerBytes;
    return markers + Math.ceil(rest / Math.max(1, this.maxTokenBytes));
  }

  /** Raw bytes of a token's text (empty for control tokens and ids outside the vocabulary). */
  bytesOf(token: number): Uint8Array {
    return this.tokenBytes[token] ?? new Uint8Array(0);
  }

  /** True for an end-of-generation token. */
  isEndOfGeneration(token: number): boolean {
    return this.eogSet.has(token);
  }

  /**
   * Create a sampler for one sequence. `history` is the penalty window at creation (prompt + resumed tokens); the
   * native penalty sampler then accepts every token sampled with this handle (AddonSampler::acceptToken), and the
   * handle mirrors that history so a reconfiguration passes exactly the tokens the native state holds (applyConfig
   * keeps the state when they match, and rebuilds it from them otherwise). No penalty: no history is kept.
   */
  createSampler(cfg: SamplerConfig, history: readonly number[] = []): SamplerHandle {
    const sampler = new this.native.SamplerClass(this.native.model);
    let bias: ReadonlyMap<number, number> | null = null;
    let biasKeys = new Uint32Array(0);
    let biasValues = new Float32Array(0);
    /** Penalty history (prompt + resumed + sampled), grown by doubling; only while a repetition penalty is on. */
    let penaltyTokens: Uint32Array | null = null;
    let penaltyLength = 0;
    const state: SamplerState = {
      native: sampler,
      grammar: null,
      accept: (token) => {
        if (!penaltyTokens) return;
        if (penaltyLength === penaltyTokens.length) {
          const grown = new Uint32Array(penaltyTokens.length * 2 + 16);
          grown.set(penaltyTokens);
          penaltyTokens = grown;
        }
        penaltyTokens[penaltyLength++] = token;
      },
    };
    const handle: SamplerHandle = {
      configure: (c) => {
        // Sampling with a temperature reconfigures per token (seed per position): rebuild the bias arrays only
        // when the map changed.
        if (c.bias !== bias) {
          bias = c.bias;
          biasKeys = Uint32Array.from(bias.keys());
          biasValues = Float32Array.from(bias.values());
        }
        if (c.repetitionPenalty !== 1 && penaltyTokens === null) {
          penaltyTokens = Uint32Array.from(history);
          penaltyLength = history.length;
        }
        // The grammar key on EVERY applyConfig while constrained: without it the native sampler drops the grammar.
        const grammar = c.grammar && !c.grammar.dead ? c.grammar : null;
        const nativeGrammar = grammar ? this.nativeStates.get(grammar) : undefined;
        if (grammar && !nativeGrammar) throw new Error("grammar state not created by this adapter");
        state.grammar = grammar;
        sampler.applyConfig({
          ...(nativeGrammar ? { grammarEvaluationState: nativeGrammar } : {}),
          temperature: c.temperature,
          topK: c.topK > 0 ? c.topK : 0,
          topP: c.topP,
          minP: c.minP,
          seed: c.seed,
          tokenBiasKeys: biasKeys,
          tokenBiasValues: biasValues,
          ...(c.repetitionPenalty !== 1 && penaltyTokens
            ? {
                repeatPenalty: c.repetitionPenalty,
                // The window must hold every token of the sequence: it never slides (docs/protocol.md §6.4).
                repeatPenaltyMaxTokens: Math.max(this.options.contextSize, penaltyLength + 1),
                repeatPenaltyPresencePenalty: 0,
                repeatPenaltyFrequencyPenalty: 0,
                repeatPenaltyTokens: penaltyTokens.subarray(0, penaltyLength),
              }
            : {}),
        });
      },
      dispose: () => sampler.dispose(),
    };
    this.samplers.set(handle, state);
    handle.configure(cfg);
    return handle;
  }

  /**
   * Log probabilities at a batch logit index from the RAW model distribution (softmax of the unmodified logits over
   * the whole vocabulary), for the sampled `token` and the `top` most likely tokens. Sampling copies the logits into
   * the sampler's own candidate array and never changes the context's logits, so the request's own sampler and these
   * calls see the same logits, in any order. Two native calls on bias- and penalty-free samplers:
   *   1. top-k (k = max(top, LOGPROB_WINDOW)) at temperature 1 with probabilities: the k most likely tokens, sorted,
   *      with their probabilities renormalised over those k (q_i);
   *   2. greedy with confidence: the full-vocabulary probability P of the most likely token;
   * so log p_i = log q_i + log P − log q_0 (measured equal to the full softmax within 2e-7). Only when the sampled
   * token is outside the k does a third call return the whole distribution (a transfer of the full vocabulary).
   * Measured on the 1019-token tiny vocabulary: 0.2 ms per token (the full transfer: 0.43 ms; it grows with the
   * vocabulary, the two calls mostly do not). Call sequentially, between decodes.
   */
  async logprobs(batchLogitIndex: number, token: number, top: number): Promise<RawLogprobs> {
    if (this.decoding) throw new Error("logprobs() while a decode is in flight (one native call at a time)");
    const raw = (this.rawSamplers ??= this.createRawSamplers());
    const k = Math.max(top, LOGPROB_WINDOW);
    raw.topK.applyConfig({ temperature: 1, topK: k, topP: 1, seed: 0 });
    const [, window] = await this.native.ctx.sampleToken(batchLogitIndex, raw.topK, true);
    const [argmax, , confidence] = await this.native.ctx.sampleToken(batchLogitIndex, raw.greedy, false, true);
    if (argmax < 0 || !window || window.length < 2 || confidence === undefined) throw new Error(`no log probabilities at batch logit index ${batchLogitIndex}`);
    const shift = Math.log(confidence) - Math.log(window[1]!);
    const logprobOf = (q: number): number => (q > 0 ? Math.max(MIN_LOGPROB, Math.log(q) + shift) : MIN_LOGPROB);
    const out: RawLogprobs = { token, logprob: NaN, top: [] };
    for (let i = 0; i < window.length; i += 2) {
      const t = window[i]!;
      if (i / 2 < top) out.top.push({ token: t, logprob: logprobOf(window[i + 1]!) });
      if (t === token) out.logprob = logprobOf(window[i + 1]!);
    }
    if (Number.isNaN(out.logprob)) {
      // Sampled outside the window (temperature sampling): take its probability from the whole distribution.
      const [, all] = await this.native.ctx.sampleToken(batchLogitIndex, raw.greedy, true);
      const at = all ? all.findIndex((v, i) => i % 2 === 0 && v === token) : -1;
      const p = at >= 0 ? all![at + 1]! : 0;
      out.logprob = p > 0 ? Math.max(MIN_LOGPROB, Math.log(p)) : MIN_LOGPROB;
    }
    return out;
  }
  /** Bias- and penalty-free samplers shared by every logprobs call (created on first use). */
  private rawSamplers: { topK: NativeSampler; greedy: NativeSampler } | null = null;

  private createRawSamplers(): { topK: NativeSampler; greedy: NativeSampler } {
    const topK = new this.native.SamplerClass(this.native.model);
    const greedy = new this.native.SamplerClass(this.native.model);
    greedy.applyConfig({ temperature: 0 });
    return { topK, greedy };
  }

  /**
   * Decode one batch. Returns, per item, the batch logit index of its last token (or -1 without logits).
   * @throws Error when llama.cpp refuses the batch (the batch is rolled back; the context stays usable).
   */
  async decode(items: DecodeItem[]): Promise<number[]> {
    if (this.decoding) throw new Error("decode() while a decode is in flight (one native call at a time)");
    const total = items.reduce((a, it) => a + it.tokens.length, 0);
    if (total === 0) return [];
    if (total > this.options.batchSize) throw new RangeError(`batch of ${total} tokens exceeds batchSize ${this.options.batchSize}`);
    this.decoding = true;
    const guard = this.native.disposeGuard.createPreventDisposalHandle();
    try {
      this.native.ctx.initBatch(total);
      // Added in slot order (docs/upstream.md, "ubatch split by sequence id"); each item keeps its own logit index.
      const logitIdx = new Array<number>(items.length).fill(-1);
      for (const i of slotOrder(items)) {
        const it = items[i]!;
        const idx = it.wantsLogits ? Uint32Array.of(it.tokens.length - 1) : new Uint32Array(0);
        const r = this.native.ctx.addToBatch(it.slot, it.pos, Uint32Array.from(it.tokens), idx);
        if (it.wantsLogits) logitIdx[i] = r[0] ?? -1;
      }
      // A decode step (one token per sequence) runs on this thread with Keel's addon: the worker hop and the
      // event-loop wake-up of decodeBatch cost as much as a small model's decode. Prefill chunks stay on a worker
      // (long; the engine keeps answering pings). Either way no other native call overlaps (this.decoding).
      if (this.native.decodeSync && items.every((it) => it.tokens.length === 1)) this.native.decodeSync(this.native.ctx);
      else await this.native.ctx.decodeBatch();
      return logitIdx;
    } finally {
      guard.dispose();
      this.decoding = false;
    }
  }

  /**
   * Sample the next token at a batch logit index. Call sequentially, never in parallel (output_reorder race).
   * With a grammar attached, the native sampler feeds the token into the grammar state (never an EOG). When the
   * grammar and the bias together masked every token, llama.cpp still picks one: its accept then throws (the state
   * is emptied), or the pick is an EOG while the rule is incomplete, or a grammar-inert token (accepted as nothing).
   * All three mark the state dead (never touched natively again) and throw {@link GrammarMaskedError}; the caller
   * reconfigures without the grammar and samples again (sampling never changes the logits).
   */
  async sample(batchLogitIndex: number, handle: SamplerHandle): Promise<number> {
    const state = this.samplers.get(handle);
    if (!state) throw new Error("sampler not created by this adapter");
    let token: number;
    try {
      token = await this.native.ctx.sampleToken(batchLogitIndex, state.native);
    } catch (err) {
      throw this.nativeSampleFailed(state, err);
    }
    return this.settleSample(state, token, batchLogitIndex);
  }

  /**
   * Sample every item of the current step in ONE synchronous native call (Keel's addon, src/native/keel-sampling.cpp):
   * per item exactly what {@link sample} does, in order, with the same bookkeeping (penalty mirror, grammar checks),
   * without a libuv worker hop and an event-loop wake-up per sequence. A failing item (unknown or disposed sampler,
   * nothing selected, a grammar rejection) is an Error in its place; the other items are unaffected. Only present
   * when Keel's addon is loaded ({@link nativeAddon}); call between decodes, like {@link sample}.
   */
  readonly sampleMany?: (batch: readonly SampleRequest[]) => (number | Error)[];

  private sampleManyNative(sampleTokens: NativeSampleTokens, batch: readonly SampleRequest[]): (number | Error)[] {
    if (this.decoding) throw new Error("sampleMany() while a decode is in flight (one native call at a time)");
    const results: (number | Error)[] = new Array(batch.length);
    // 1. Resolve the handles; an unknown one fails alone (never reaches the native call).
    const states: SamplerState[] = [];
    const positions: number[] = [];
    for (let i = 0; i < batch.length; i++) {
      const state = this.samplers.get(batch[i]!.sampler);
      if (state) {
        states.push(state);
        positions.push(i);
      } else results[i] = new Error("sampler not created by this adapter");
    }
    const n = states.length;
    if (n === 0) return results;
    // 2. One native call for the whole step (scratch arrays grow once and are reused: no allocation per step).
    if (this.sampleScratch.indices.length < n) this.sampleScratch = { indices: new Int32Array(n * 2), out: new Int32Array(n * 2) };
    const indices = this.sampleScratch.indices.subarray(0, n);
    const out = this.sampleScratch.out.subarray(0, n);
    for (let k = 0; k < n; k++) indices[k] = batch[positions[k]!]!.batchLogitIndex;
    const messages = sampleTokens(this.native.ctx, indices, states.map((s) => s.native), out);
    // 3. The same per-item bookkeeping as sample().
    for (let k = 0; k < n; k++) {
      const i = positions[k]!;
      const state = states[k]!;
      const failure = messages?.[k];
      if (failure !== undefined) {
        results[i] = this.nativeSampleFailed(state, new Error(failure));
        continue;
      }
      try {
        results[i] = this.settleSample(state, out[k]!, indices[k]!);
      } catch (err) {
        results[i] = err as Error;
      }
    }
    return results;
  }
  /** Reused input/output arrays of {@link sampleMany}'s native call. */
  private sampleScratch = { indices: new Int32Array(0), out: new Int32Array(0) };

  /** A native sampling call threw: under a grammar the state is dead and the caller retries unconstrained. */
  private nativeSampleFailed(state: SamplerState, err: unknown): Error {
    const grammar = state.grammar;
    if (!grammar) return err instanceof Error ? err : new Error(String(err));
    grammar.dead = true;
    return new GrammarMaskedError(`the grammar rejected the sampled token: ${(err as Error).message}`);
  }

  /** Checks a natively sampled token and mirrors it into the handle's penalty history. @throws as {@link sample}. */
  private settleSample(state: SamplerState, token: number, batchLogitIndex: number): number {
    const grammar = state.grammar;
    if (token < 0) {
      if (grammar) grammar.dead = true; // nothing was selected: do not trust the state any more
      throw new Error(`sampling failed at batch logit index ${batchLogitIndex}`);
    }
    if (grammar) {
      const masked = this.grammarInert.has(token) || (this.eogSet.has(token) && !this.grammarCanBeNext(grammar, token));
      if (masked) {
        grammar.dead = true;
        throw new GrammarMaskedError(`every token was masked by the grammar and the bias (picked ${token})`);
      }
    }
    state.accept(token); // the native sampler accepted it too (sampleToken / keelSampleTokens → acceptToken)
    return token;
  }

  /**
   * Compile GBNF `grammar` with root `rule`, or — with a non-empty `prefix` — with root `prefix-literal rule` (a
   * trigger matched inside a token: the token's text before the match is swallowed by the literal). Cached (LRU).
   * @throws Error when llama.cpp cannot parse the grammar or the rule is not defined.
   */
  compileGrammar(grammar: string, rule: string, prefix = ""): CompiledGrammar {
    const key = `${rule}\u0000${prefix}\u0000${grammar}`;
    const hit = this.grammarCache.get(key);
    if (hit) {
      this.grammarCache.delete(key);
      this.grammarCache.set(key, hit);
      return hit.handle;
    }
    const text = prefix === "" ? grammar : `${grammar}\n${PREFIXED_ROOT_RULE} ::= ${gbnfLiteral(prefix)} ${rule}\n`;
    const root = prefix === "" ? rule : PREFIXED_ROOT_RULE;
    const native = new this.native.grammar.Grammar(text, { addonExports: (this.llama as unknown as { _bindings: unknown })._bindings, rootRuleName: root });
    const handle: CompiledGrammar = { key };
    this.nativeGrammars.set(handle, native);
    this.grammarCache.set(key, { handle, native });
    this.grammarCacheBytes += key.length;
    // Evict least recently used entries beyond the count or size budget (never the one just added).
    while (this.grammarCache.size > 1 && (this.grammarCache.size > GRAMMAR_CACHE_SIZE || this.grammarCacheBytes > GRAMMAR_CACHE_BYTES)) {
      const oldest = this.grammarCache.keys().next().value!;
      this.grammarCache.delete(oldest);
      this.grammarCacheBytes -= oldest.length;
    }
    return handle;
  }

  /** A fresh evaluation state at the start of a compiled grammar's root. */
  createGrammarState(grammar: CompiledGrammar): GrammarState {
    const native = this.nativeGrammars.get(grammar);
    if (!native) throw new Error("grammar not compiled by this adapter");
    const state: GrammarState = { grammar, dead: false };
    this.nativeStates.set(state, new this.native.grammar.State(this.native.model, native));
    return state;
  }

  /** Whether `token` may come next in the grammar (an EOG: whether the rule is complete). False on a dead state. */
  grammarCanBeNext(state: GrammarState, token: number): boolean {
    const native = this.nativeStates.get(state);
    if (!native || state.dead || token < 0 || token >= this.vocabSize) return false;
    return this.native.grammar.canBeNext(native, token);
  }

  /** True when the rule is complete (an end-of-generation token may come next). */
  grammarIsComplete(state: GrammarState): boolean {
    const eog = this.eogTokens[0];
    return eog !== undefined && this.grammarCanBeNext(state, eog);
  }

  /**
   * Feed one token into a grammar state (a replayed token). Guards both process-fatal hazards by construction: an
   * EOG is never passed to llama.cpp (GGML_ABORT on an incomplete grammar), and a token is passed only after
   * canBeNext said yes (a rejected accept empties the state; the next use trips GGML_ASSERT). @throws Error when the
   * token is refused; the state is then dead.
   */
  grammarAccept(state: GrammarState, token: number): void {
    const native = this.nativeStates.get(state);
    if (!native || state.dead) throw new Error("grammar state is dead");
    if (this.eogSet.has(token)) throw new Error(`end-of-generation token ${token} is never fed to a grammar`);
    if (this.grammarInert.has(token) || !this.native.grammar.canBeNext(native, token)) {
      state.dead = true;
      throw new Error(`token ${token} cannot continue the grammar`);
    }
    try {
      this.native.grammar.accept(native, token);
    } catch (err) {
      state.dead = true;
      throw err;
    }
  }

  /**
   * Whether the grammar can continue with a token that is not end-of-generation and not banned by `bias` (-Infinity),
   * at a batch logit index of the current step. A probe on a clone of the state (llama.cpp applies the grammar to
   * the whole vocabulary: O(vocabulary), so the loop calls it only when the rule is complete): greedy over the masked
   * candidates; a NaN confidence, a failed accept, an EOG or an inert pick means nothing is allowed.
   */
  async grammarCanContinue(batchLogitIndex: number, state: GrammarState, bias: ReadonlyMap<number, number>): Promise<boolean> {
    if (this.decoding) throw new Error("grammarCanContinue() while a decode is in flight (one native call at a time)");
    const native = this.nativeStates.get(state);
    if (!native || state.dead) return false;
    const clone = new this.native.grammar.State(native);
    const probe = (this.probeSampler ??= new this.native.SamplerClass(this.native.model));
    const banned = new Map(bias);
    for (const t of this.eogTokens) banned.set(t, -Infinity);
    probe.applyConfig({
      temperature: 0,
      grammarEvaluationState: clone,
      tokenBiasKeys: Uint32Array.from(banned.keys()),
      tokenBiasValues: Float32Array.from(banned.values()),
    });
    try {
      const [token, , confidence] = await this.native.ctx.sampleToken(batchLogitIndex, probe, false, true);
      return token >= 0 && !this.eogSet.has(token) && !this.grammarInert.has(token) && confidence !== undefined && confidence > 0;
    } catch {
      return false; // the clone rejected the forced pick: nothing was allowed
    } finally {
      probe.applyConfig({ temperature: 0 }); // detach the clone
    }
  }

  /** Control and user-defined tokens that are not end-of-generation, with their text. */
  specialTokens(): readonly { token: number; text: string }[] {
    return this.specials;
  }

  /**
   * Keep the first `keep` tokens of a slot's KV and drop the rest (keep = 0 clears it). Returns false when llama.cpp
   * cannot trim this memory partially (recurrent state); the slot is then cleared completely. Only between decodes.
   */
  trimSequence(slot: number, keep: number): boolean {
    if (this.decoding) throw new Error("trimSequence() while a decode is in flight");
    if (keep <= 0) {
      this.native.ctx.disposeSequence(slot);
      return true;
    }
    const ok = this.native.ctx.removeTokenCellsFromSequence(slot, keep, -1);
    if (!ok) this.native.ctx.disposeSequence(slot);
    return ok;
  }

  /**
   * False for models with recurrent state (SSM / linear attention, alone or hybrid), whose state cannot be rewound
   * to a shorter prefix: the scheduler then never asks for a partial trim.
   */
  get supportsPartialTrim(): boolean {
    // node-llama-cpp's insights mirror llama.cpp's llm_arch_is_recurrent / _is_hybrid; the name list is a fallback.
    const insights = this.model.fileInsights as unknown as { isRecurrent?: boolean; isHybrid?: boolean };
    if (insights.isRecurrent || insights.isHybrid) return false;
    return !RECURRENT_ARCHITECTURES.has(this.metadata().architecture);
  }

  /** A failed decode is rolled back by llama.cpp for attention KV; recurrent state gives no such guarantee. */
  get canRollBack(): boolean {
    return this.supportsPartialTrim;
  }

  /** Free a slot's KV cells at once. Only between decodes. */
  clearSequence(slot: number): void {
    if (this.decoding) throw new Error("clearSequence() while a decode is in flight");
    this.native.ctx.disposeSequence(slot);
  }

  /** Free the context and model. Only after the last decode settled. */
  async dispose(): Promise<void> {
    this.rawSamplers?.topK.dispose();
    this.rawSamplers?.greedy.dispose();
    this.rawSamplers = null;
    this.probeSampler?.dispose();
    this.probeSampler = null;
    await this.context.dispose();
    await this.model.dispose();
    await this.llama.dispose();
  }


  private computeTokenBytes(t: number, vocabType: number, gpt2: Map<string, number> | null, enc: TextEncoder): Uint8Array {
    // Control tokens (ChatML markers, BOS/EOS) are not part of the output text.
    const attrs = this.native.model.getTokenAttributes(t);
    const CONTROL = 1 << 3; // llama.h LLAMA_TOKEN_ATTR_CONTROL
    if (attrs & CONTROL) return new Uint8Array(0);
    const text = this.native.model.getTokenString(t) ?? "";
    if (gpt2) {
      const out: number[] = [];
      for (const ch of text) {
        const b = gpt2.get(ch);
        if (b === undefined) return enc.encode(text); // an added token stored verbatim
        out.push(b);
      }
      return Uint8Array.from(out);
    }
    if (vocabType === VOCAB_SPM) {
      const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(text);
      if (m) return Uint8Array.of(parseInt(m[1]!, 16));
      return enc.encode(text.replaceAll("\u2581", " "));
    }
    return enc.encode(text);
  }
}
