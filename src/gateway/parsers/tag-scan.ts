/**
 * Finding tags in text that arrives in arbitrary pieces: the earliest complete tag, and otherwise how much of the
 * tail must be held back because it could still grow into one. Shared by every parser stage.
 *
 * @module
 */

/** The earliest complete occurrence of any of `tags` in `text` (ties: the longer tag), or null. */
export function findFirstTag(text: string, tags: readonly string[]): { at: number; tag: string } | null {
  let best: { at: number; tag: string } | null = null;
  for (const tag of tags) {
    const at = text.indexOf(tag);
    if (at < 0) continue;
    if (best === null || at < best.at || (at === best.at && tag.length > best.tag.length)) best = { at, tag };
  }
  return best;
}

/**
 * Length of the longest suffix of `text` that is a proper prefix of one of `tags` — the part that must be held
 * back (anything before it can be emitted now, whatever comes next).
 */
export function partialTagLength(text: string, tags: readonly string[]): number {
  let longest = 0;
  for (const tag of tags) {
    const max = Math.min(tag.length - 1, text.length);
    // Why from the longest candidate down: the first hit is this tag's answer.
    for (let n = max; n > longest; n--) {
      if (text.endsWith(tag.slice(0, n))) {
        longest = n;
        break;
      }
    }
  }
  return longest;
}

/** True when `text` (already left-trimmed by the caller if needed) could still become `tag` or starts with it. */
export function couldStartWith(text: string, tag: string): boolean {
  return text.length <= tag.length ? tag.startsWith(text) : text.startsWith(tag);
}

/** JSON's whitespace (what models put between tags and around JSON). */
export function isSpace(ch: string): boolean {
  return ch === " " || ch === "\n" || ch === "\r" || ch === "\t";
}

/** Index of the first non-whitespace character of `text` from `from`, or `text.length`. */
export function skipSpace(text: string, from = 0): number {
  let i = from;
  while (i < text.length && isSpace(text[i]!)) i++;
  return i;
}
