/**
 * The stop decision for one sampled token: does it end its request, and why. The only place where the engine
 * decides a request's natural end (end-of-generation, stop token, length); aborts and errors are decided elsewhere.
 */
import type { Sequence } from "./types.js";

/**
 * Why the token just appended to `s` (already counted in `s.generated`) ends the request, or null. "stop": an
 * end-of-generation token (unless ignoreEos) or a stop token once minTokens were generated (resumed tokens count),
 * or an EOG the guide allowed alone (`guideEnd`, even under ignore_eos or before min_tokens). "length": maxNewTokens
 * generated, or the slot is full.
 */
export function stopReason(s: Sequence, token: number, guideEnd: boolean, isEndOfGeneration: (token: number) => boolean, maxModelLen: number): "stop" | "length" | null {
  const mayStop = s.inputLength - s.promptLength + s.generated >= s.minTokens;
  const stops = (guideEnd && isEndOfGeneration(token)) || (mayStop && ((!s.ignoreEos && isEndOfGeneration(token)) || s.stopTokens?.has(token) === true));
  if (stops) return "stop";
  if (s.maxNewTokens !== null && s.generated >= s.maxNewTokens) return "length";
  if (s.tokens.length >= maxModelLen) return "length";
  return null;
}
