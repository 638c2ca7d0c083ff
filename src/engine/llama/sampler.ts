/**
 * llama.cpp samplers of the sequences: one native sampler per request, the mirror of its repetition-penalty history
 * (a native penalty sampler accepts every token it samples, and applyConfig keeps its state only when given the same
 * history), the grammar attached to it, and the checks on every sampled token (one call per sequence, or one call
 * for the whole step with Keel's addon).
 */
import { GrammarMaskedError, type GrammarState, type SampleRequest, type SamplerConfig, type SamplerHandle } from "../backend.js";
import type { LlamaGrammars } from "./grammar.js";
import type { Internals, NativeCallGuard, NativeSampler, NativeSampleTokens } from "./internals.js";
import type { Vocabulary } from "./vocabulary.js";
import { CANDIDATE_BYTES_PER_TOKEN, NativeGarbage } from "./native-garbage.js";

/** A native sampler and the mirror of its penalty history. */
interface SamplerState {
  native: NativeSampler;
  /** Record a token the native sampler accepted. */
  accept(token: number): void;
  /** Grammar state attached by the last configure (the sampler feeds each sampled non-EOG token into it). */
  grammar: GrammarState | null;
}

export class LlamaSamplers {
  /** Native sampler behind each handle. */
  private readonly states = new WeakMap<SamplerHandle, SamplerState>();
  /** Reused input/output arrays of {@link sampleMany}'s native call. */
  private scratch = { indices: new Int32Array(0), out: new Int32Array(0) };

  /**
   * @param contextSize capacity of one slot (the penalty window never slides below it).
   * @param threads the engine's CPU threads: {@link sampleMany} spreads a step's sequences over at most this many
   *   (they are idle between decodes; on a GPU the decode does not use them at all).
   */
  constructor(
    private readonly native: Internals,
    private readonly vocab: Vocabulary,
    private readonly grammars: LlamaGrammars,
    private readonly guard: NativeCallGuard,
    private readonly contextSize: number,
    private readonly threads = 1,
    /** Disposed samplers' native buffers waiting for V8 (native-garbage.ts). */
    readonly garbage = new NativeGarbage(),
  ) {}

  /**
   * Create a sampler for one sequence. `history` is the penalty window at creation (prompt + resumed tokens); the
   * native penalty sampler then accepts every token sampled with this handle (AddonSampler::acceptToken), and the
   * handle mirrors that history so a reconfiguration passes exactly the tokens the native state holds (applyConfig
   * keeps the state when they match, and rebuilds it from them otherwise). No penalty: no history is kept.
   */
  create(cfg: SamplerConfig, history: readonly number[] = []): SamplerHandle {
    const sampler = new this.native.SamplerClass(this.native.model);
    let bias: ReadonlyMap<number, number> | null = null;
    let biasKeys = new Uint32Array(0);
    let biasValues = new Float32Array(0);
    /** Penalty history (prompt + resumed + sampled), grown by doubling; only while a repetition penalty is on. */
    let penaltyTokens: Uint32Array | null = null;
    let penaltyLength = 0;
    let disposed = false;
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
        const nativeGrammar = grammar ? this.grammars.nativeStateOf(grammar) : undefined;
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
                repeatPenaltyMaxTokens: Math.max(this.contextSize, penaltyLength + 1),
                repeatPenaltyPresencePenalty: 0,
                repeatPenaltyFrequencyPenalty: 0,
                repeatPenaltyTokens: penaltyTokens.subarray(0, penaltyLength),
              }
            : {}),
        });
      },
      dispose: () => {
        if (disposed) return;
        disposed = true;
        sampler.dispose();
        // The candidates buffer stays until V8 collects the wrapper (native-garbage.ts).
        this.garbage.released(this.vocab.size * CANDIDATE_BYTES_PER_TOKEN);
      },
    };
    this.states.set(handle, state);
    handle.configure(cfg);
    return handle;
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
    const state = this.states.get(handle);
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
   * per item exactly the token {@link sample} would give (each sampler's items in order; different sequences on up to
   * `threads` native threads), with the same bookkeeping (penalty mirror, grammar checks), without a libuv worker hop
   * and an event-loop wake-up per sequence. A failing item (unknown or disposed sampler,
   * nothing selected, a grammar rejection) is an Error in its place; the other items are unaffected. Only with
   * Keel's addon (`sampleTokens`); call between decodes, like {@link sample}.
   */
  sampleMany(sampleTokens: NativeSampleTokens, batch: readonly SampleRequest[]): (number | Error)[] {
    this.guard.assertIdle("sampleMany()");
    const results: (number | Error)[] = new Array(batch.length);
    // 1. Resolve the handles; an unknown one fails alone (never reaches the native call).
    const states: SamplerState[] = [];
    const positions: number[] = [];
    for (let i = 0; i < batch.length; i++) {
      const state = this.states.get(batch[i]!.sampler);
      if (state) {
        states.push(state);
        positions.push(i);
      } else results[i] = new Error("sampler not created by this adapter");
    }
    const n = states.length;
    if (n === 0) return results;
    // 2. One native call for the whole step (scratch arrays grow once and are reused: no allocation per step).
    if (this.scratch.indices.length < n) this.scratch = { indices: new Int32Array(n * 2), out: new Int32Array(n * 2) };
    const indices = this.scratch.indices.subarray(0, n);
    const out = this.scratch.out.subarray(0, n);
    for (let k = 0; k < n; k++) indices[k] = batch[positions[k]!]!.batchLogitIndex;
    const messages = sampleTokens(this.native.ctx, indices, states.map((s) => s.native), out, this.threads);
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

  /** A native sampling call threw: under a grammar the state is dead and the caller retries unconstrained. */
  private nativeSampleFailed(state: SamplerState, err: unknown): Error {
    const grammar = state.grammar;
    if (!grammar) return err instanceof Error ? err : new Error(String(err));
    grammar.dead = true;
    return new GrammarMaskedError((err as Error).message);
  }

  /** Checks a natively sampled token and mirrors it into the handle's penalty history. @throws as {@link sample}. */
  private settleSample(state: SamplerState, token: number, batchLogitIndex: number): number {
    const grammar = state.grammar;
    if (token < 0) {
      if (grammar) grammar.dead = true; // nothing was selected: do not trust the state any more
      throw new Error(`sampling failed at batch logit index ${batchLogitIndex}`);
    }
    if (grammar) {
      const masked = this.vocab.grammarInert.has(token) || (this.vocab.eogSet.has(token) && !this.grammars.canBeNext(grammar, token));
      if (masked) {
        grammar.dead = true;
        throw new GrammarMaskedError(`every token was masked by the grammar and the bias (picked ${token})`);
      }
    }
    state.accept(token); // the native sampler accepted it too (sampleToken / keelSampleTokens → acceptToken)
    return token;
  }
}
