/**
 * Content text around tool calls. Text before, between and after calls is kept (OVMS drops text after the first
 * call when streaming); only whitespace that touches nothing but calls and the ends of the output — the `\n`
 * between `</tool_call>` and `<tool_call>`, the `\n\n` after `</think>` before a call — is dropped, so an answer
 * that is only calls has content "". Streaming-safe: such whitespace is held until what follows it is known.
 *
 * @module
 */

export class ContentGaps {
  /** Whitespace held at a boundary (start of output or just after a call), not yet known to be content. */
  #held = "";
  /** True at the start and right after a call, until non-whitespace content arrives. */
  #atBoundary = true;
  /** Whether any call was recognised (decides the fate of trailing whitespace). */
  #sawCall = false;

  /** Content text; returns what is certain now. */
  text(s: string): string {
    if (s === "") return "";
    if (!this.#atBoundary) return s;
    if (s.trim() === "") {
      this.#held += s;
      return "";
    }
    const out = this.#held + s;
    this.#held = "";
    this.#atBoundary = false;
    return out;
  }

  /** A call was recognised here: whitespace between it and the previous boundary is dropped. */
  call(): void {
    if (this.#atBoundary) this.#held = "";
    this.#atBoundary = true;
    this.#sawCall = true;
  }

  /** End of output: held whitespace is content only when the output had no call at all (lossless plain text). */
  finish(): string {
    const out = this.#sawCall ? "" : this.#held;
    this.#held = "";
    return out;
  }
}
