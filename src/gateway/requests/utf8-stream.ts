/**
 * Incremental UTF-8 decoding for token byte streams, and string sanitising
 * for JSON output.
 *
 * A tokenizer's pieces are byte sequences, not characters: one emoji can be
 * split across two or three tokens, and a sampled token can be bytes that
 * never form a valid character. Streaming code therefore decodes bytes with
 * {@link Utf8StreamDecoder} and never calls `TextDecoder.decode` per token.
 *
 * @module
 */

/**
 * Stateful UTF-8 decoder for a stream of byte chunks (one chunk per token).
 *
 * Follows the WHATWG Encoding Standard's UTF-8 decoder in replacement mode
 * (the same algorithm as `new TextDecoder("utf-8")` with `fatal: false`):
 *
 * - a multi-byte character split across chunks is held back until its last
 *   byte arrives, so no chunk ever yields half a character;
 * - each maximal byte sequence that can never become a valid character
 *   (stray continuation bytes, overlong forms, surrogates, values above
 *   U+10FFFF, a sequence cut short by a non-continuation byte) becomes one
 *   U+FFFD;
 * - {@link Utf8StreamDecoder.flush} turns an incomplete tail into one U+FFFD.
 *
 * Unlike a default `TextDecoder`, a leading byte-order mark is *kept*
 * (`ignoreBOM: true`): a model that generates U+FEFF as its first character
 * gets it delivered rather than silently dropped.
 *
 * Guarantee: for any split of a byte array into chunks,
 * `chunks.map(push).join("") + flush()` equals
 * `new TextDecoder("utf-8", { ignoreBOM: true }).decode(allBytes)`.
 * The output is always well-formed UTF-16 (no lone surrogates).
 * No method throws.
 */
export class Utf8StreamDecoder {
  #decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

  /**
   * Decodes the next chunk of bytes.
   *
   * @param bytes - The chunk; may be empty. The decoder does not keep a
   *   reference to it after returning.
   * @returns The characters completed by this chunk (possibly `""`, when the
   *   chunk only starts or continues a multi-byte character).
   */
  push(bytes: Uint8Array): string {
    return this.#decoder.decode(bytes, { stream: true });
  }

  /**
   * Ends the stream: returns U+FFFD if bytes of an incomplete character are
   * still held back, otherwise `""`. The decoder is then reset and may be
   * reused for a new stream.
   */
  flush(): string {
    return this.#decoder.decode();
  }
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** Whether `s` holds no lone UTF-16 surrogate (Node 20's String.prototype.isWellFormed; TypeScript's ES2022 lib lacks it). */
export function isWellFormed(s: string): boolean {
  return (s as unknown as { isWellFormed(): boolean }).isWellFormed();
}

/**
 * Replaces every lone (unpaired) UTF-16 surrogate in `s` with U+FFFD, so the
 * string can be encoded as UTF-8 / serialised with `JSON.stringify` without
 * producing `\udXXX` escapes that strict JSON parsers reject.
 *
 * Well-formed surrogate pairs are kept; a string without lone surrogates is
 * returned unchanged (same value). Equivalent to ES2024
 * `String.prototype.toWellFormed`.
 *
 * @param s - Any string, e.g. one that came from `JSON.parse` of client input
 *   (`"\ud800"` parses to a lone surrogate).
 * @returns The sanitised string; same length as `s`.
 */
export function sanitizeForJson(s: string): string {
  return s.replace(LONE_SURROGATE, "\uFFFD");
}
