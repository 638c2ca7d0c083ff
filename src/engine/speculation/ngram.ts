/**
 * Prompt-lookup (n-gram) draft proposal, pure: the tokens a sequence is likely to repeat from its own history.
 * Semantics of OpenVINO GenAI's prompt lookup (OVMS `num_assistant_tokens`, `max_ngram_size`): the last n tokens of
 * the history (n = maxNgramSize down to 1) are searched for at an earlier place of the history, the most recent
 * match wins, and the up to `maxDrafts` tokens that followed that match are the draft. Agent traffic (a file edited
 * in place, a tool result quoted back) repeats long runs of its prompt, so most of such drafts are accepted.
 */

/** Per-request prompt-lookup settings (protocol SamplingParams.speculation). */
export interface NgramSettings {
  /** Draft tokens proposed per step at most (OVMS `num_assistant_tokens`). */
  readonly numAssistantTokens: number;
  /** Longest n-gram matched (OVMS `max_ngram_size`); shorter ones are tried down to 1. */
  readonly maxNgramSize: number;
}

/** Default of `num_assistant_tokens` when prompt lookup is on by the server switch (OVMS's typical value). */
export const DEFAULT_NUM_ASSISTANT_TOKENS = 5;
/** Default of `max_ngram_size` (OVMS's typical value). */
export const DEFAULT_MAX_NGRAM_SIZE = 3;

/**
 * Draft tokens for `history` (prompt + generated, the pending token last): the up to `maxDrafts` tokens that
 * followed the most recent earlier occurrence of the history's last n tokens, for the largest n ≤ `maxNgramSize`
 * that has one. Empty when nothing matches or `maxDrafts` < 1.
 */
export function proposeNgramDrafts(history: readonly number[], maxNgramSize: number, maxDrafts: number): number[] {
  const len = history.length;
  if (maxDrafts < 1 || len < 2) return [];
  // 1. Longest n first: a longer match predicts the continuation better.
  for (let n = Math.min(maxNgramSize, len - 1); n >= 1; n--) {
    const tail = len - n;
    // 2. Most recent earlier occurrence: start positions from tail-1 down to 0 (the tail itself is excluded).
    for (let start = tail - 1; start >= 0; start--) {
      let k = 0;
      while (k < n && history[start + k] === history[tail + k]) k++;
      if (k < n) continue;
      // 3. What followed it (at least one token: start + n < len), capped by maxDrafts.
      return history.slice(start + n, Math.min(start + n + maxDrafts, len));
    }
  }
  return [];
}
