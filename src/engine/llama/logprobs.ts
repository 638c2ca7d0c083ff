/**
 * Log probabilities from the RAW model distribution (softmax of the unmodified logits over the whole vocabulary),
 * read with bias- and penalty-free samplers of their own: sampling never changes the context's logits, so these
 * calls and the request's own sampler see the same logits, in any order.
 */
import type { RawLogprobs } from "../backend.js";
import type { Internals, NativeCallGuard, NativeSampler } from "./internals.js";

/** Tokens whose log probabilities one top-k call returns: the sampled token is usually among them. */
const LOGPROB_WINDOW = 20;

/** Floor for a probability that underflows float32 (log 0): OpenAI's value for an impossible token. */
export const MIN_LOGPROB = -9999;

export class LlamaLogprobs {
  /** Bias- and penalty-free samplers shared by every call (created on first use). */
  private raw: { topK: NativeSampler; greedy: NativeSampler } | null = null;

  constructor(
    private readonly native: Internals,
    private readonly guard: NativeCallGuard,
  ) {}

  /**
   * The sampled `token`'s and the `top` most likely tokens' log probabilities at a batch logit index. Two native calls:
   *   1. top-k (k = max(top, LOGPROB_WINDOW)) at temperature 1 with probabilities: the k most likely tokens, sorted,
   *      with their probabilities renormalised over those k (q_i);
   *   2. greedy with confidence: the full-vocabulary probability P of the most likely token;
   * so log p_i = log q_i + log P − log q_0 (measured equal to the full softmax within 2e-7). Only when the sampled
   * token is outside the k does a third call return the whole distribution (a transfer of the full vocabulary).
   * Measured on the 1019-token tiny vocabulary: 0.2 ms per token (the full transfer: 0.43 ms; it grows with the
   * vocabulary, the two calls mostly do not). Call sequentially, between decodes.
   */
  async at(batchLogitIndex: number, token: number, top: number): Promise<RawLogprobs> {
    this.guard.assertIdle("logprobs()");
    const raw = (this.raw ??= this.createRawSamplers());
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

  private createRawSamplers(): { topK: NativeSampler; greedy: NativeSampler } {
    const topK = new this.native.SamplerClass(this.native.model);
    const greedy = new this.native.SamplerClass(this.native.model);
    greedy.applyConfig({ temperature: 0 });
    return { topK, greedy };
  }

  /** Free the raw samplers. */
  dispose(): void {
    this.raw?.topK.dispose();
    this.raw?.greedy.dispose();
    this.raw = null;
  }
}
