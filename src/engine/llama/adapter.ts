/**
 * The llama.cpp backend of the engine port (src/engine/backend.ts). With its parts in this folder, the only code that
 * touches node-llama-cpp internals (pinned: node-llama-cpp 3.21.1).
 *
 * Why internals: the public multi-sequence `evaluate()` path samples sequences in parallel on libuv threads while
 * llama.cpp's lazy `output_reorder()` is not thread-safe, so a sequence can receive a token sampled from another
 * sequence's logits (docs/upstream.md). It also batches N−1 of N sequences, cannot cancel a queued
 * prefill, and blocks slot reuse until the whole batch loop drains. This adapter exposes the native context's batch
 * primitives (`initBatch` / `addToBatch` / `decodeBatch` / `sampleToken` / `disposeSequence`) so the engine loop can
 * build exactly one batch per step and sample sequentially.
 *
 * Contract (checked by src/engine/llama/adapter.contract.test.ts, which must be re-run on any upgrade):
 * - one native call at a time: the caller never calls into the context while `decode()` is pending;
 * - `clearSequence()` frees a slot's KV at once (only between decodes);
 * - a failed decode is rolled back by llama.cpp and the next decode works;
 * - sampling never changes the context's logits (AddonSampler copies them into its own candidate array), so the
 *   raw-distribution log probabilities of a position can be read with extra samplers before or after the request's
 *   own sampler; a top-k + greedy-confidence pair of calls equals the full softmax;
 * - a native repetition-penalty sampler accepts every token it samples (acceptToken), and applyConfig keeps its
 *   state when given the same history (else rebuilds it from the given tokens): the adapter mirrors that history.
 *
 * Parts, one concern each: internals.ts (the native shapes), vocabulary.ts (token bytes, EOG, specials),
 * batch.ts (one batch per step), sampler.ts (samplers and their penalty mirror), logprobs.ts (raw log probabilities),
 * grammar.ts (GBNF cache and evaluation states), kv.ts (trims, clears, recurrent state).
 */
import { getLlama, LlamaLogLevel, type Llama, type LlamaContext, type LlamaModel } from "node-llama-cpp";
import type { EngineBackend, ModelMetadata } from "../../protocol/messages.js";
import { decodeOverlapSwitch, loadWithKeelAddon, type NativeAddonChoice } from "../../native/loader.js";
import type { CompiledGrammar, GrammarBackend, GrammarState, ModelBackend, RawLogprobs, SampleRequest, SamplerConfig, SamplerHandle } from "../backend.js";
import { decodeBatch, DecodePace, type Alongside, type LlamaBatchItem } from "./batch.js";
import { LlamaGrammars } from "./grammar.js";
import { contextOptionsOf, internalsOf, NativeCallGuard, type Internals } from "./internals.js";
import { kvElementsPerToken, LlamaKv, supportsPartialTrim } from "./kv.js";
import { LlamaLogprobs } from "./logprobs.js";
import { LlamaSamplers } from "./sampler.js";
import { NativeGarbage } from "./native-garbage.js";
import { Vocabulary } from "./vocabulary.js";

export { slotOrder } from "./batch.js";
export { gbnfLiteral, PREFIXED_ROOT_RULE } from "./grammar.js";
export { MIN_LOGPROB } from "./logprobs.js";

/** A GPU was required (device "gpu") and no GPU backend of node-llama-cpp (CUDA, Vulkan, Metal) loads here. */
export class NoGpuBackendError extends Error {
  constructor() {
    super("no GPU backend loads on this machine (node-llama-cpp's prebuilt CUDA, Vulkan and Metal backends were tried)");
    this.name = "NoGpuBackendError";
  }
}

/**
 * Why a shared KV buffer (`--kv_unified true`) cannot be given to a model with these tensors here, or null when it
 * can. Shared, llama.cpp takes the whole buffer as each sequence's context (`n_ctx_seq = n_ctx`): a LongRoPE model
 * (Phi-3 class: `rope_factors_long`) would then switch to its long-context RoPE factors at any length, and its text
 * would change. Setting it needs Keel's native addon (node-llama-cpp's own has no such option).
 */
export function sharedKvRefusal(tensorNames: readonly string[], addonHasSwitch: boolean, addon: NativeAddonChoice): string | null {
  if (!addonHasSwitch) return `--kv_unified true needs Keel's native addon, which is not loaded here: ${addon.kind === "keel" ? `${addon.path} has no keelContextOptions` : addon.reason}`;
  if (tensorNames.some((name) => name.startsWith("rope_factors_long"))) {
    return "--kv_unified true is refused for this model: it has LongRoPE factors (rope_factors_long), and with one shared KV buffer llama.cpp would apply its long-context factors to every sequence, changing its output";
  }
  return null;
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
  /**
   * One KV buffer shared by every sequence (llama.cpp's kv_unified). Absent = one stream per sequence. Needs Keel's
   * addon; refused for LongRoPE models ({@link sharedKvRefusal}).
   */
  kvUnified?: boolean;
  /** Receives llama.cpp's log lines at warn level and above. */
  log?: (level: string, message: string) => void;
  /** Receives the model's load progress (0..1) while llama.cpp loads its tensors. */
  onLoadProgress?: (progress: number) => void;
  /** Called when the llama.cpp backend has loaded, before the model is read (the model check times its phases). */
  onBackendLoaded?: () => void;
  /** Disposed samplers' native bytes that trigger a full V8 collection (native-garbage.ts; tests lower it). */
  garbageThresholdBytes?: number;
}

export class LlamaAdapter implements ModelBackend, GrammarBackend {
  /** End-of-generation token ids. */
  readonly eogTokens: number[];
  /** Vocabulary size (tokens), read once from the GGUF metadata (it is used per sampled token). */
  readonly vocabSize: number;
  /** The one-native-call-at-a-time guard every part shares. */
  private readonly guard = new NativeCallGuard();
  /** How fast batches with prefill chunks decode: whether the next one runs on this thread (batch.ts). */
  private readonly pace = new DecodePace();
  private readonly vocab: Vocabulary;
  private readonly grammars: LlamaGrammars;
  private readonly samplers: LlamaSamplers;
  private readonly raw: LlamaLogprobs;
  private readonly kv: LlamaKv;
  /** See {@link overlapsDecode}; on with `KEEL_DECODE_OVERLAP=on` (A/B benchmarks: bench/gpu/plan-i21c.sh). */
  private readonly overlap: boolean;

  private constructor(
    private readonly llama: Llama,
    private readonly model: LlamaModel,
    private readonly context: LlamaContext,
    private readonly native: Internals,
    readonly options: LlamaAdapterOptions,
    /** The native addon node-llama-cpp runs on: Keel's build (with {@link sampleMany}) or its own. */
    readonly nativeAddon: NativeAddonChoice,
    /** Whether the context shares one KV buffer across its sequences (`--kv_unified`). */
    readonly kvUnified: boolean,
  ) {
    const meta = model.fileInfo.metadata as unknown as { tokenizer?: { ggml?: { tokens?: unknown[] } } };
    this.vocabSize = meta.tokenizer?.ggml?.tokens?.length ?? 0;
    this.vocab = new Vocabulary(native.model, this.vocabSize);
    this.eogTokens = this.vocab.eogTokens;
    this.grammars = new LlamaGrammars(native, (llama as unknown as { _bindings: unknown })._bindings, this.vocab, this.guard);
    this.samplers = new LlamaSamplers(native, this.vocab, this.grammars, this.guard, options.contextSize, options.threads, new NativeGarbage(options.garbageThresholdBytes));
    this.raw = new LlamaLogprobs(native, this.guard);
    this.kv = new LlamaKv(native.ctx, this.guard);
    // Opt-in until measured to keep time to first token (docs/gpu-h200.md, "decode overlap"): unset is off.
    const raw = process.env["KEEL_DECODE_OVERLAP"];
    const overlapSwitch = decodeOverlapSwitch(raw);
    if (overlapSwitch === "invalid") throw new Error(`KEEL_DECODE_OVERLAP=${JSON.stringify(raw)} is not on/off (1/0, true/false, yes/no)`);
    this.overlap = native.synchronize !== null && llama.gpu !== false && options.gpu !== "cpu" && overlapSwitch === "on";
    // Asked for but nothing to overlap with (AUTO found no GPU, or node-llama-cpp's own addon runs): said, not ignored.
    if (overlapSwitch === "on" && !this.overlap) options.log?.("warn", "KEEL_DECODE_OVERLAP=on has no effect: the decode runs on the CPU or without Keel's addon");
    const sampleTokens = native.sampleTokens;
    if (sampleTokens) this.sampleMany = (batch) => this.samplers.sampleMany(sampleTokens, batch);
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
    opts.onBackendLoaded?.();
    const model = await llama.loadModel({ modelPath: opts.modelPath, ...(opts.onLoadProgress ? { onLoadProgress: opts.onLoadProgress } : {}) });
    const kvUnified = opts.kvUnified === true;
    const layout = contextOptionsOf(llama);
    const refusal = kvUnified ? sharedKvRefusal(model.fileInfo.tensorInfo?.map((t) => t.name) ?? [], layout !== null, addon) : null;
    if (refusal !== null) {
      await model.dispose();
      throw new Error(refusal);
    }
    const kv = opts.kvCacheType.toUpperCase() as "F16";
    // The addon's layout switch is process-wide: set for this context's creation only, then back to the default.
    layout?.({ kvUnified });
    let context: LlamaContext;
    try {
      context = await model.createContext({
        contextSize: opts.contextSize,
        sequences: opts.sequences,
        batchSize: opts.batchSize,
        threads: opts.threads,
        flashAttention: opts.flashAttention,
        experimentalKvCacheKeyType: kv,
        experimentalKvCacheValueType: kv,
      });
    } finally {
      layout?.({ kvUnified: false });
    }
    const native = internalsOf(llama, model, context);
    native.ctx.setThreads(opts.threads);
    const nativeAddon: NativeAddonChoice =
      addon.kind === "keel" && !native.sampleTokens ? { kind: "node-llama-cpp", reason: `${addon.path} has no keelSampleTokens` } : addon;
    return new LlamaAdapter(llama, model, context, native, opts, nativeAddon, kvUnified);
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

  /** See ModelBackend.tokenLowerBound and {@link Vocabulary.tokenLowerBound}. */
  tokenLowerBound(text: string): number {
    return this.vocab.tokenLowerBound(text);
  }

  /** Raw bytes of a token's text (empty for control tokens and ids outside the vocabulary). */
  bytesOf(token: number): Uint8Array {
    return this.vocab.bytesOf(token);
  }

  /** True for an end-of-generation token. */
  isEndOfGeneration(token: number): boolean {
    return this.vocab.eogSet.has(token);
  }

  /** A sampler for one sequence whose penalty history starts as `history` (see {@link LlamaSamplers.create}). */
  /** Native memory of disposed samplers waiting for V8 (native-garbage.ts). */
  get nativeGarbage(): NativeGarbage {
    return this.samplers.garbage;
  }

  createSampler(cfg: SamplerConfig, history: readonly number[] = []): SamplerHandle {
    return this.samplers.create(cfg, history);
  }

  /** Raw-distribution log probabilities at a batch logit index (see {@link LlamaLogprobs.at}). */
  logprobs(batchLogitIndex: number, token: number, top: number): Promise<RawLogprobs> {
    return this.raw.at(batchLogitIndex, token, top);
  }

  /**
   * True when a decode computes on a GPU while the host runs `alongside` (Keel's addon queues it and waits after);
   * on the CPU the decode is the host's own work, so nothing is gained by deferring host work into it.
   */
  get overlapsDecode(): boolean {
    return this.overlap;
  }

  /** Decode one batch (see {@link decodeBatch}); the step number is the loop's, unused here. */
  decode(items: readonly LlamaBatchItem[], _step?: number, alongside?: Alongside): Promise<number[]> {
    return decodeBatch(this.native, this.guard, this.options.batchSize, items, this.pace, alongside);
  }

  /** Sample the next token at a batch logit index (see {@link LlamaSamplers.sample}). @throws GrammarMaskedError */
  sample(batchLogitIndex: number, handle: SamplerHandle): Promise<number> {
    return this.samplers.sample(batchLogitIndex, handle);
  }

  /** Sample the whole step in one native call; only with Keel's addon (see {@link LlamaSamplers.sampleMany}). */
  readonly sampleMany?: (batch: readonly SampleRequest[]) => (number | Error)[];

  compileGrammar(grammar: string, rule: string, prefix = ""): CompiledGrammar {
    return this.grammars.compile(grammar, rule, prefix);
  }

  createGrammarState(grammar: CompiledGrammar): GrammarState {
    return this.grammars.createState(grammar);
  }

  grammarCanBeNext(state: GrammarState, token: number): boolean {
    return this.grammars.canBeNext(state, token);
  }

  grammarIsComplete(state: GrammarState): boolean {
    return this.grammars.isComplete(state);
  }

  grammarAccept(state: GrammarState, token: number): void {
    this.grammars.accept(state, token);
  }

  grammarCanContinue(batchLogitIndex: number, state: GrammarState, bias: ReadonlyMap<number, number>): Promise<boolean> {
    return this.grammars.canContinue(batchLogitIndex, state, bias);
  }

  /** Control and user-defined tokens that are not end-of-generation, with their text. */
  specialTokens(): readonly { token: number; text: string }[] {
    return this.vocab.specials;
  }

  /** Keep the first `keep` tokens of a slot's KV (see {@link LlamaKv.trim}). Only between decodes. */
  trimSequence(slot: number, keep: number): boolean {
    return this.kv.trim(slot, keep);
  }

  /** False for models with recurrent state: the scheduler then never asks for a partial trim. */
  get supportsPartialTrim(): boolean {
    return supportsPartialTrim(this.model.fileInsights as unknown as { isRecurrent?: boolean; isHybrid?: boolean }, this.metadata().architecture);
  }

  /** A failed decode is rolled back by llama.cpp for attention KV; recurrent state gives no such guarantee. */
  get canRollBack(): boolean {
    return this.supportsPartialTrim;
  }

  /** Free a slot's KV cells at once. Only between decodes. */
  clearSequence(slot: number): void {
    this.kv.clear(slot);
  }

  /** Free the context and model. Only after the last decode settled. */
  async dispose(): Promise<void> {
    this.raw.dispose();
    this.grammars.dispose();
    await this.context.dispose();
    await this.model.dispose();
    await this.llama.dispose();
  }
}
