/**
 * What the engine keeps of one live request beside the scheduler (which owns its tokens and slot): its validated
 * parameters, its sampler, its text decoder, its bias/penalty/stop state and its guide; and how its sampler is
 * configured for an unguided sample. Guided configuration: guides/guided-sampler.ts.
 */
import type { SamplingParams } from "../protocol/messages.js";
import type { GrammarState, SamplerConfig, SamplerHandle } from "./backend.js";
import type { GuideState } from "./guides/guide-state.js";
import type { SamplingState } from "./sampling-state.js";

/** Engine-side data of one live request. */
export interface RequestState {
  /** Validated sampling parameters. */
  readonly params: SamplingParams;
  /** Sampler of the request's sequence, created at add. */
  readonly sampler: SamplerHandle;
  /** Incremental UTF-8 decoder: holds back an incomplete character, U+FFFD for impossible bytes. */
  readonly decoder: TextDecoder;
  /** Bias, penalty and stop state, a pure function of (params, prompt, generated ids). */
  readonly sampling: SamplingState;
  /** The guide's phase machine (params.guide), or null for an unguided request. */
  readonly guide: GuideState | null;
  /** What the sampler was last configured with for the guide (reconfigure when the grammar or bias changes). */
  configured: { grammar: GrammarState | null; bias: ReadonlyMap<number, number> } | null;
  /** The rule-phase bias last built: (base bias, ending) → merged map, kept while unchanged (compared by identity). */
  guideBias: { base: ReadonlyMap<number, number>; ending: boolean; merged: ReadonlyMap<number, number> } | null;
}

/**
 * Seed of the token at `position`, derived from the request seed (splitmix32-style mixing). A token's randomness
 * depends only on (seed, position), so a generation resumed on a new engine samples what the first run would have.
 */
export function tokenSeed(seed: number, position: number): number {
  let z = (seed ^ Math.imul(position + 1, 0x9e3779b9)) >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}

/** The sampler configuration of a request's next sample at `seed` (its own bias; no grammar). */
export function samplerConfig(st: Pick<RequestState, "params" | "sampling">, seed: number): SamplerConfig {
  const p = st.params;
  return { temperature: p.temperature, topP: p.topP, topK: p.topK, minP: p.minP ?? 0, seed, bias: st.sampling.takeBias(), repetitionPenalty: st.sampling.repetitionPenalty };
}

/**
 * Reconfigure an unguided request's sampler only when something changed: the seed (per position, with a
 * temperature) or the bias (penalties, min_tokens); a greedy request without those keeps its sampler as created.
 */
export function configureUnguided(st: RequestState, seed: number): void {
  if (st.params.temperature > 0 || st.sampling.biasChanged) st.sampler.configure(samplerConfig(st, seed));
}
