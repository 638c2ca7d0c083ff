/**
 * The ONLY code that reaches into node-llama-cpp's internals (pinned: node-llama-cpp 3.21.1): the shapes of the
 * native objects Keel calls, and where to find them. Why internals at all: see src/engine/llama/adapter.ts.
 */
import type { Llama, LlamaContext, LlamaModel } from "node-llama-cpp";

/* Shapes of the internals we use (node-llama-cpp 3.21.1 dist/bindings/AddonTypes.d.ts). */
export interface NativeContext {
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
export interface NativeSampler {
  applyConfig(config: Record<string, unknown>): void;
  dispose(): void;
}
/** Opaque native grammar (AddonGrammar) and evaluation state (AddonGrammarEvaluationState). */
export type NativeGrammar = object;
export type NativeGrammarState = object;
export interface NativeGrammarBindings {
  Grammar: new (text: string, options: { addonExports: unknown; rootRuleName: string }) => NativeGrammar;
  State: { new (model: unknown, grammar: NativeGrammar): NativeGrammarState; new (existing: NativeGrammarState): NativeGrammarState };
  accept(state: NativeGrammarState, token: number): void;
  canBeNext(state: NativeGrammarState, token: number): boolean;
}
export interface NativeModel {
  getTokenString(token: number): string | undefined;
  getTokenAttributes(token: number): number;
  getVocabularyType(): number;
  isEogToken(token: number): boolean;
}
/**
 * Keel's synchronous step sampler (src/native/keel-sampling.cpp), present only when Keel's addon is loaded: fills
 * `out[i]` with the token of item i (-1: nothing selected; -2: failed, its message at index i of the returned array),
 * on up to `threads` threads (default 1; the items of one sampler in order).
 */
export type NativeSampleTokens = (context: NativeContext, logitIndices: Int32Array, samplers: NativeSampler[], out: Int32Array, threads?: number) => (string | undefined)[] | undefined;
/**
 * Keel's decode of the batch built with initBatch/addToBatch on the calling thread (throws decodeBatch's messages):
 * waits for the backend, or with `wait` false returns once the work is queued (then {@link NativeSynchronize}).
 */
export type NativeDecodeSync = (context: NativeContext, wait?: boolean) => void;
/** Wait for the decode a `NativeDecodeSync(context, false)` queued. */
export type NativeSynchronize = (context: NativeContext) => void;
export interface Internals {
  ctx: NativeContext;
  /** Keel's one-call sampler of a whole step, or null when node-llama-cpp's own addon runs. */
  sampleTokens: NativeSampleTokens | null;
  /** Keel's decode on the calling thread (no worker hop), or null when node-llama-cpp's own addon runs. */
  decodeSync: NativeDecodeSync | null;
  /** Keel's wait for a queued decode, or null when node-llama-cpp's own addon runs. */
  synchronize: NativeSynchronize | null;
  model: NativeModel;
  SamplerClass: new (model: unknown) => NativeSampler;
  grammar: NativeGrammarBindings;
  disposeGuard: { createPreventDisposalHandle(): { dispose(): void } };
}

export function internalsOf(llama: Llama, model: LlamaModel, context: LlamaContext): Internals {
  const c = context as unknown as { _ctx?: NativeContext; _backendContextDisposeGuard?: Internals["disposeGuard"] };
  const m = model as unknown as { _model?: NativeModel };
  type SamplerStatics = Internals["SamplerClass"] & {
    acceptGrammarEvaluationStateToken?: (state: NativeGrammarState, token: number) => void;
    canBeNextTokenForGrammarEvaluationState?: (state: NativeGrammarState, token: number) => boolean;
  };
  const l = llama as unknown as {
    _bindings?: { AddonSampler?: SamplerStatics; AddonGrammar?: NativeGrammarBindings["Grammar"]; AddonGrammarEvaluationState?: NativeGrammarBindings["State"]; keelSampleTokens?: NativeSampleTokens; keelDecodeBatch?: NativeDecodeSync; keelSynchronize?: NativeSynchronize };
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
  const synchronize = decodeSync && typeof b.keelSynchronize === "function" ? b.keelSynchronize : null;
  return { ctx: c._ctx, sampleTokens, decodeSync, synchronize, model: m._model, SamplerClass: S, grammar, disposeGuard: c._backendContextDisposeGuard };
}

/**
 * Keel's addon's `keelContextOptions` (src/native/keel-sampling.cpp): sets whether contexts created after the call
 * share one KV buffer across their sequences; null when node-llama-cpp's own addon runs (it has no such option).
 */
export function contextOptionsOf(llama: Llama): ((options: { kvUnified?: boolean }) => { kvUnified: boolean }) | null {
  const b = (llama as unknown as { _bindings?: { keelContextOptions?: unknown } })._bindings;
  return typeof b?.keelContextOptions === "function" ? (b.keelContextOptions as (options: { kvUnified?: boolean }) => { kvUnified: boolean }) : null;
}

/**
 * The one-native-call-at-a-time contract: llama.cpp's context must not be called while a decode is pending. Every
 * part of the adapter shares one guard and checks it before touching the context.
 */
export class NativeCallGuard {
  /** True while a decode is in flight. */
  decoding = false;

  /** @throws Error naming `what` when a decode is in flight. */
  assertIdle(what: string): void {
    if (this.decoding) throw new Error(`${what} while a decode is in flight (one native call at a time)`);
  }
}
