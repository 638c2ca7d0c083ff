/**
 * The engine port: what the step loop drives. The llama.cpp adapter (src/engine/llama/adapter.ts) implements it,
 * fault injection wraps it (src/engine/faulty-backend.ts), and unit tests fake it. Nothing here knows llama.cpp.
 *
 * Contract every backend keeps (the loop relies on it; src/engine/llama/adapter.contract.test.ts pins llama.cpp's):
 * - one native call at a time: the loop never calls into the backend while `decode()` is pending;
 * - `clearSequence()` / `trimSequence()` free a slot's KV at once (only between decodes);
 * - a failed decode is rolled back and the next decode works, unless `canRollBack` is false;
 * - sampling never changes the logits: a position can be sampled again, or its log probabilities read, in any order.
 */

/** One entry of a batch: `tokens` of request `id` go at positions pos, pos+1, … of sequence `slot`. */
export interface DecodeItem {
  /** The request the tokens belong to (llama.cpp needs only the slot; logs and fault injection read it). */
  id: string;
  slot: number;
  pos: number;
  tokens: number[];
  /** True when the last token's logits are needed (a decode, or the final prefill chunk). */
  wantsLogits: boolean;
  /**
   * Draft tokens at the end of `tokens` (prompt-lookup speculation; absent = 0): logits are wanted at each of the
   * last drafts + 1 positions. `decode` then returns the logit index of the first of them; the others follow it
   * consecutively (index + j for position j).
   */
  drafts?: number;
}

/**
 * Sampling configuration of one sequence. The llama.cpp chain applies, in this order: `bias` (additive) → repetition
 * penalty → then greedy argmax when temperature is 0, else top-k → top-p → min-p → temperature → seeded draw.
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
   * Every configure passes it while constrained (the backend drops the grammar when it is missing).
   */
  grammar?: GrammarState | null;
}

/** Opaque per-sequence sampler. */
export interface SamplerHandle {
  configure(cfg: SamplerConfig): void;
  dispose(): void;
}

/** One item of {@link ModelBackend.sampleMany}: a sequence's batch logit index and its sampler. */
export interface SampleRequest {
  batchLogitIndex: number;
  sampler: SamplerHandle;
}

/** Log probabilities at one position from the raw model distribution. */
export interface RawLogprobs {
  token: number;
  logprob: number;
  top: { token: number; logprob: number }[];
}

/** A GBNF grammar compiled with one root (opaque; the backend caches them by text). */
export interface CompiledGrammar {
  /** Cache key: root rule, literal prefix and grammar text. */
  readonly key: string;
}

/**
 * One grammar evaluation state (opaque): the position of one request inside its rule. `dead` is set once anything
 * failed on it (a rejected accept, a sampler error, a sample that found every token masked): the native state is then
 * possibly emptied, and touching it again aborts the process (GGML_ASSERT), so the backend refuses to, in JS.
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

/**
 * Grammar support of a backend (guided generation, `SamplingParams.guide`). All of it or none: without it the
 * engine announces `capabilities.grammars: false` and refuses a guide. The methods guard the process-fatal hazards
 * (never an EOG or an unchecked token into llama.cpp; a failed state is never touched again).
 */
export interface GrammarBackend {
  /** Compile GBNF with root `rule`, preceded by the literal `prefix` when non-empty (cached). @throws on a bad grammar. */
  compileGrammar(grammar: string, rule: string, prefix?: string): CompiledGrammar;
  createGrammarState(grammar: CompiledGrammar): GrammarState;
  grammarCanBeNext(state: GrammarState, token: number): boolean;
  /** Feed a replayed token (never EOG; checked first). @throws when refused; the state is then dead. */
  grammarAccept(state: GrammarState, token: number): void;
  grammarIsComplete(state: GrammarState): boolean;
  /** Whether a non-EOG token not banned by `bias` may continue the grammar, at a logit index of this step. */
  grammarCanContinue(batchLogitIndex: number, state: GrammarState, bias: ReadonlyMap<number, number>): Promise<boolean>;
  /** Control / user-defined tokens that are not end-of-generation, with their text (banned in rule phases). */
  specialTokens(): readonly { token: number; text: string }[];
}

const GRAMMAR_METHODS = ["compileGrammar", "createGrammarState", "grammarCanBeNext", "grammarAccept", "grammarIsComplete", "grammarCanContinue", "specialTokens"] as const;

/** The backend's grammar support, or null when it lacks any of the methods. */
export function grammarSupport(backend: ModelBackend): GrammarBackend | null {
  return GRAMMAR_METHODS.every((m) => typeof backend[m] === "function") ? (backend as GrammarBackend) : null;
}

/** What the step loop needs from a model backend (the llama.cpp adapter, a fault-injecting wrapper, or a test fake). */
export interface ModelBackend extends Partial<GrammarBackend> {
  tokenize(text: string): number[];
  /** The BOS token id the tokenizer prepends, or null when it adds none (tokenize without special tokens). */
  readonly bosToken?: number | null;
  /**
   * A cheap lower bound on the tokens `tokenize(text)` would produce, computed without tokenizing. The loop refuses
   * a prompt whose bound already exceeds the capacity, because tokenizing is synchronous and llama.cpp's
   * special-token pass is quadratic in the number of markers (an 800 KB prompt of `<|im_end|>` took 44 s).
   */
  tokenLowerBound?(text: string): number;
  bytesOf(token: number): Uint8Array;
  isEndOfGeneration(token: number): boolean;
  readonly eogTokens: number[];
  readonly vocabSize: number;
  /** A sampler whose repetition-penalty history starts as `history` (prompt + resumed tokens). */
  createSampler(cfg: SamplerConfig, history?: readonly number[]): SamplerHandle;
  /**
   * Decode one batch of step `step` (the loop's step counter + 1; a retried or bisected batch keeps its step);
   * returns the batch logit index per item (-1 without logits; the first of its run for a drafted item).
   * @throws when the batch cannot be decoded.
   */
  decode(items: DecodeItem[], step: number, alongside?: () => Promise<void> | void): Promise<number[]>;
  /**
   * True when `decode` computes on a device while it runs `alongside` (host work that touches no backend state: the
   * loop's previous step message and event-loop turn); absent or false, `alongside` is never passed.
   */
  readonly overlapsDecode?: boolean;
  /** Sample the next token at a batch logit index (sequentially, never in parallel). */
  sample(batchLogitIndex: number, sampler: SamplerHandle): Promise<number>;
  /**
   * Sample several sequences of the current step in ONE synchronous native call: per item what `sample` gives, in
   * order; a failing item is an Error in its place. Absent when the backend has no such call (node-llama-cpp's own addon).
   */
  readonly sampleMany?: (batch: readonly SampleRequest[]) => (number | Error)[];
  /**
   * Raw-distribution log probabilities at a batch logit index (the sampled `token` and the `top` most likely).
   * Absent: the engine serves no log probabilities (capabilities.maxTopLogprobs = -1).
   */
  logprobs?(batchLogitIndex: number, token: number, top: number): Promise<RawLogprobs>;
  clearSequence(slot: number): void;
  /** Keep the first `keep` tokens of a slot's KV (0 = clear). False if the memory cannot be trimmed partially. */
  trimSequence?(slot: number, keep: number): boolean;
  /** False when a failed decode may leave state behind (recurrent memory): the loop then never retries. */
  readonly canRollBack?: boolean;
}
