/**
 * OpenAI `stop` sequences applied to streamed generated text.
 *
 * @module
 */

/** Result of {@link StopMatcher.push}. */
export interface StopPushResult {
  /** Text that is now certain to be part of the output; may be `""`. */
  emit: string;
  /** True once a stop string has matched; generation should end. */
  stopped: boolean;
}

/**
 * Finds stop strings in text that arrives in arbitrary pieces.
 *
 * Semantics (OpenAI `stop`): generation ends as soon as any stop string has
 * been produced in full; the output is the text before that stop string,
 * which itself is not returned. When several stop strings complete at the
 * same character the longest wins (the least text is emitted); when one
 * completes earlier than another that started earlier (stops `"bc"` and
 * `"abcd"` on `"abcd"`), the earlier completion wins — exactly what a
 * token-by-token engine does, and independent of how the text is split.
 *
 * To stream this, the matcher holds back the longest suffix of the text seen
 * so far that could still grow into a stop string (at most `longest stop − 1`
 * UTF-16 units, plus one so that a surrogate pair is never split across
 * pieces). Matching runs one Knuth–Morris–Pratt automaton per stop string,
 * so each pushed character costs O(number of stop strings), whatever their
 * length.
 *
 * Guarantee: for any split of a text into pieces, the concatenated `emit`s
 * plus `flush()` equal the text cut at the first completed stop string (or
 * the whole text when none occurs).
 *
 * With no (non-empty) stop strings every `push` returns its input unchanged.
 */
export class StopMatcher {
  readonly #stops: readonly string[];
  /** KMP failure function per stop string. */
  readonly #failure: readonly Int32Array[];
  /** Characters of each stop string matched so far. */
  readonly #state: Int32Array;
  /** Text seen but not yet emitted: the longest suffix that could still grow into a stop string. */
  #held = "";
  /** The stop string that matched, once one has (null before). */
  #matched: string | null = null;

  /**
   * @param stops - Stop strings; empty strings are ignored (they would match
   *   everywhere) and duplicates are merged. The request parser already
   *   rejects empty ones.
   */
  constructor(stops: readonly string[]) {
    this.#stops = [...new Set(stops.filter((s) => s.length > 0))];
    this.#failure = this.#stops.map(failureFunction);
    this.#state = new Int32Array(this.#stops.length);
  }

  /** True once a stop string has matched. */
  get stopped(): boolean {
    return this.#matched !== null;
  }

  /** The stop string that matched (for `include_stop_str_in_output`), or null. */
  get matched(): string | null {
    return this.#matched;
  }

  /**
   * Feeds the next piece of generated text.
   *
   * After a match, further calls return `{ emit: "", stopped: true }`.
   */
  push(text: string): StopPushResult {
    if (this.#matched !== null) return { emit: "", stopped: true };
    if (this.#stops.length === 0) return { emit: text, stopped: false };

    const buf = this.#held + text;
    for (let i = this.#held.length; i < buf.length; i++) {
      const c = buf.charCodeAt(i);
      let matched = 0;
      let which = "";
      for (let k = 0; k < this.#stops.length; k++) {
        const n = this.#advance(k, c);
        if (n === this.#stops[k]!.length && n > matched) {
          matched = n;
          which = this.#stops[k]!;
        }
      }
      if (matched > 0) {
        this.#matched = which;
        this.#held = "";
        return { emit: buf.slice(0, i + 1 - matched), stopped: true };
      }
    }
    let keepFrom = buf.length - Math.max(...this.#state);
    if (keepFrom > 0 && isHighSurrogate(buf.charCodeAt(keepFrom - 1))) keepFrom -= 1;
    this.#held = buf.slice(keepFrom);
    return { emit: buf.slice(0, keepFrom), stopped: false };
  }

  /**
   * Ends the stream for a reason other than a stop string (EOS, length,
   * cancellation): returns the held-back text, which is then part of the
   * output, and resets partial matches. Returns `""` after a match.
   */
  flush(): string {
    const rest = this.#held;
    this.#held = "";
    this.#state.fill(0);
    return this.#matched !== null ? "" : rest;
  }

  /** Advances automaton `k` by one UTF-16 unit; returns its new state. */
  #advance(k: number, c: number): number {
    const stop = this.#stops[k]!;
    const fail = this.#failure[k]!;
    let q = this.#state[k]!;
    if (q === stop.length) q = fail[q - 1]!;
    while (q > 0 && stop.charCodeAt(q) !== c) q = fail[q - 1]!;
    if (stop.charCodeAt(q) === c) q++;
    this.#state[k] = q;
    return q;
  }
}

/** `f[i]` = length of the longest proper prefix of `s` that is a suffix of `s[0..i]`. */
function failureFunction(s: string): Int32Array {
  const f = new Int32Array(s.length);
  let q = 0;
  for (let i = 1; i < s.length; i++) {
    while (q > 0 && s.charCodeAt(i) !== s.charCodeAt(q)) q = f[q - 1]!;
    if (s.charCodeAt(i) === s.charCodeAt(q)) q++;
    f[i] = q;
  }
  return f;
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}
