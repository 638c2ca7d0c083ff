/**
 * Draft tokens of one decoding sequence for prompt-lookup speculative decoding: how many its step may verify (the
 * step budget, the slot's capacity and max_tokens all bound it), and which (speculation/ngram.ts).
 */
import { proposeNgramDrafts } from "../speculation/ngram.js";
import type { Sequence } from "./types.js";

/**
 * Most draft tokens `s` may add to its decode item: one step emits up to drafts + 1 tokens, so the drafts are
 * bounded by the request's setting, what is left of the step's token budget, the slot's capacity (the tokens after
 * the step must fit maxModelLen) and the tokens left before max_tokens. 0 without speculation.
 */
export function draftRoom(s: Sequence, budgetLeft: number, maxModelLen: number): number {
  if (!s.speculation) return 0;
  const byCapacity = maxModelLen - s.tokens.length - 1;
  const byLength = s.maxNewTokens === null ? Infinity : s.maxNewTokens - s.generated - 1;
  return Math.max(0, Math.min(s.speculation.numAssistantTokens, budgetLeft, byCapacity, byLength));
}

/** The draft tokens of `s` for this step (at most `room`): its history's n-gram continuation. */
export function draftsFor(s: Sequence, room: number): number[] {
  if (room < 1 || !s.speculation) return [];
  return proposeNgramDrafts(s.tokens, s.speculation.maxNgramSize, room);
}
