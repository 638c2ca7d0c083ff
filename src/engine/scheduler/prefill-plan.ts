/**
 * The prefill chunk plan of one step: how the token budget left after the decode tokens is shared among the
 * prefilling sequences (chunked prefill, as vLLM v1 / Sarathi).
 */

/**
 * Largest share of a step's token budget one prefilling sequence whose rest does not fit the step takes while
 * another prefill waits behind it (the last one in line takes whatever is left). A quarter: a 4,000-token prompt ahead of short ones costs them a few
 * steps, not its whole length; a burst of short prompts still completes four or more per step at the default budget.
 */
export const PREFILL_CAP_SHARE = 0.25;
/** ...but never below this many tokens (a small budget is not cut into slivers: the cap only matters for long prompts). */
export const PREFILL_CAP_MIN = 64;

/**
 * Tokens each prefilling sequence (in admission order, with `left` input tokens still to prefill) gets from
 * `budget`, first come first served: the earliest admitted prompt is finished first (as vLLM v1 and llama-server
 * do), so in a burst half the requests get their first token in half the steps — an equal share for everyone made
 * every prompt finish together, last. A prompt whose rest fits what is left of the step is prefilled whole, in this
 * step, even while others wait behind it (its first token then comes one step after admission, as llama-server's;
 * cutting it to the cap only delayed it). A prompt that does not fit takes at most PREFILL_CAP_SHARE of the step
 * budget (`stepBudget`) while another prefill waits behind it, so a long prompt cannot hold the short ones back for
 * its whole length (they still get the rest of each step).
 */
export function planPrefill(left: readonly number[], budget: number, stepBudget: number): number[] {
  const cap = Math.max(PREFILL_CAP_MIN, Math.ceil(stepBudget * PREFILL_CAP_SHARE));
  const take = left.map(() => 0);
  // 1. In admission order: the whole rest when it fits, else up to the cap while someone waits behind it; 2. what
  //    is left goes to the same order again without the cap (a long prompt alone in line still gets the whole step).
  for (let pass = 0; pass < 2; pass++) {
    for (let k = 0; k < left.length && budget > 0; k++) {
      const rest = left[k]! - take[k]!;
      const limit = pass === 0 && k < left.length - 1 && rest > budget ? cap : Infinity;
      const n = Math.min(budget, rest, limit);
      take[k]! += n;
      budget -= n;
    }
  }
  return take;
}
