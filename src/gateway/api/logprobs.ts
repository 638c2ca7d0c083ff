/**
 * The two OpenAI wire shapes of log probabilities, built from the session's views:
 *  - chat: `choices[].logprobs.content[]` = `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`;
 *  - completions (legacy): `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
 */
import type { PositionLogprobView, TokenLogprobView } from "../session/events.js";

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
 * Where each token starts in a choice's text (legacy `text_offset`, UTF-16 units as the text is a JSON string). The
 * text is the tokens' bytes decoded together, so a character split over two tokens (each shown as U+FFFD on its own)
 * counts once: offsets follow the decoded text, not the per-token strings.
 */
export class TextOffsets {
  /** Decodes the choice's token bytes as one stream, holding back an incomplete character. */
  readonly #decoder = new TextDecoder("utf-8", { fatal: false });
  /** Length of the text decoded so far (UTF-16 units), from the start offset. */
  #at: number;
  constructor(start: number) {
    this.#at = start;
  }
  /** Offset of the token `v` (where its text starts), then advance past it. */
  next(v: TokenLogprobView): number {
    const at = this.#at;
    this.#at += v.bytes ? this.#decoder.decode(Uint8Array.from(v.bytes), { stream: true }).length : v.token.length;
    return at;
  }
}

/**
 * Legacy completions shape of a run of positions, with offsets from `offsets` (one per choice, kept across stream
 * chunks). `top_logprobs` holds the requested alternatives plus the sampled token, as OpenAI documents ("up to
 * logprobs+1 elements").
 */
export function completionLogprobs(views: readonly PositionLogprobView[], offsets: TextOffsets): CompletionLogprobs {
  const out: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const v of views) {
    out.tokens.push(v.token);
    out.token_logprobs.push(v.logprob);
    // Two alternatives with the same text (e.g. two partial-UTF-8 tokens shown as U+FFFD) keep the likelier one.
    const top: Record<string, number> = {};
    for (const t of v.top) if (!(t.token in top)) top[t.token] = t.logprob;
    if (!(v.token in top)) top[v.token] = v.logprob;
    out.top_logprobs.push(top);
    out.text_offset.push(offsets.next(v));
  }
  return out;
}
