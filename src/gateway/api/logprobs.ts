/**
 * The two OpenAI wire shapes of log probabilities, built from the session's views:
 *  - chat: `choices[].logprobs.content[]` = `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`;
 *  - completions (legacy): `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
 */
import type { PositionLogprobView } from "../session/events.js";

export interface ChatLogprobEntry {
  token: string;
  logprob: number;
  bytes: number[] | null;
  top_logprobs: { token: string; logprob: number; bytes: number[] | null }[];
}

/** Chat shape of a run of positions. */
export function chatLogprobs(views: readonly PositionLogprobView[]): { content: ChatLogprobEntry[] } {
  return {
    content: views.map((v) => ({
      token: v.token,
      logprob: v.logprob,
      bytes: v.bytes,
      top_logprobs: v.top.map((t) => ({ token: t.token, logprob: t.logprob, bytes: t.bytes })),
    })),
  };
}

/** Legacy completions shape. */
export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: number[];
  top_logprobs: Record<string, number>[];
  text_offset: number[];
}

/**
 * Legacy completions shape of a run of positions; `offset` is the character offset (UTF-16 units, as the text is
 * a JSON string) of the first token in the choice's text. Returns the shape and the offset after the run.
 */
export function completionLogprobs(views: readonly PositionLogprobView[], offset: number): { logprobs: CompletionLogprobs; next: number } {
  const out: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let at = offset;
  for (const v of views) {
    out.tokens.push(v.token);
    out.token_logprobs.push(v.logprob);
    // Two alternatives with the same text (e.g. two partial-UTF-8 tokens shown as U+FFFD) keep the likelier one.
    const top: Record<string, number> = {};
    for (const t of v.top) if (!(t.token in top)) top[t.token] = t.logprob;
    out.top_logprobs.push(top);
    out.text_offset.push(at);
    at += v.token.length;
  }
  return { logprobs: out, next: at };
}
