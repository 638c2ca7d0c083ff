/**
 * The two OpenAI wire shapes of log probabilities, built from the session's views:
 *  - chat: `choices[].logprobs.content[]` = `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`;
 *  - completions (legacy): `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
 */
import type { PositionLogprobView, TokenLogprobView } from "../requests/session/events.js";

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
  /** Length of the text decoded so far (UTF-16 units), from the start offset; excludes `#pending`. */
  #at: number;
  /** Bytes of an incomplete character held back at the end of what was decoded (at most 3). */
  #pending: number[] = [];
  /** Where the held-back character starts. */
  constructor(start: number) {
    this.#at = start;
  }
  /** Offset of the token `v` (where its text starts), then advance past it. */
  next(v: TokenLogprobView): number {
    if (!v.bytes) {
      const at = this.#at + flushedLength(this.#pending);
      this.#pending = [];
      this.#at = at + v.token.length;
      return at;
    }
    const bytes = v.bytes;
    // A token that continues the held-back character starts where that character starts; any other token starts
    // after it (the held-back bytes then decode on their own, as U+FFFD).
    const continues = this.#pending.length > 0 && bytes.length > 0 && (bytes[0]! & 0xc0) === 0x80;
    const at = continues ? this.#at : this.#at + flushedLength(this.#pending);
    const all = [...this.#pending, ...bytes];
    const keep = incompleteTail(all);
    this.#at += utf8.decode(Uint8Array.from(all.slice(0, all.length - keep))).length;
    this.#pending = all.slice(all.length - keep);
    return at;
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: false });

/** UTF-16 length of held-back bytes decoded on their own (each invalid sequence one U+FFFD). */
function flushedLength(bytes: readonly number[]): number {
  return bytes.length === 0 ? 0 : utf8.decode(Uint8Array.from(bytes)).length;
}

/** How many bytes at the end of `b` are the start of a character that more bytes could still complete. */
function incompleteTail(b: readonly number[]): number {
  for (let k = 1; k <= Math.min(3, b.length); k++) {
    const lead = b[b.length - k]!;
    if ((lead & 0xc0) === 0x80) continue; // a continuation byte: look further back for its lead
    const need = lead >= 0xf5 ? 1 : lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc2 ? 2 : 1;
    return need > k ? k : 0;
  }
  return 0;
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
