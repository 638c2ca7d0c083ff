/**
 * The lenient mode for small models: an output that is, as a whole (trimmed), a bare JSON call
 * `{"name": <declared tool>, "arguments": {…}}` — or a list of them, several separated by `;` (Llama 3 style) or
 * one per line, or these inside a ```json fence — is a call even without `<tool_call>` / `<|python_tag|>`. Qwen2.5-Coder-0.5B answers
 * exactly so; the 1.5B fences it.
 *
 * A leading single call object is streamed by the stages themselves (json-call-reader.ts, once its name is a
 * declared tool); this detector reads what that cannot: a list, OpenAI's wrapper shape, a fenced call, and any
 * candidate the streamed reader gave up on. Whether the whole output is such a call is only known at the end, so the caller holds the text back while it
 * could still be one and releases it as content the moment it cannot (a non-JSON character, text after the value,
 * a value that is not a call to a declared tool).
 *
 * @module
 */
import type { ToolSpec } from "../tools.js";
import { callsFromJson, tryParseJson, type FoundCall } from "./call-shape.js";
import { JsonScanner } from "./json-scanner.js";
import { isSpace } from "./tag-scan.js";

const FENCE = "```";
/** The keys a call object may have (call-shape.ts), the OpenAI-style wrapper included. */
const CALL_KEYS = new Set(["name", "arguments", "parameters", "type", "function", "id"]);

/** Where the detector is in `[```lang] value [; value]… [```]`. */
type BareState =
  | { kind: "begin" } // nothing but (already skipped) whitespace yet
  | { kind: "fenceOpen"; ticks: number } // reading the opening backticks
  | { kind: "fenceLang"; spaced: boolean } // after ```: an info string (letters), then whitespace
  | { kind: "value"; scanner: JsonScanner; start: number } // inside a JSON value starting at `start`
  | { kind: "after"; newline: boolean } // after a value: whitespace, `;`, the closing fence, or after a line break the next value
  | { kind: "separated" } // after `;`: whitespace, then the next value
  | { kind: "fenceClose"; ticks: number } // reading the closing backticks
  | { kind: "closed" } // after the closing fence: whitespace only
  | { kind: "impossible" };

export class BareCallDetector {
  /** Every character pushed (starting at the first non-whitespace one). */
  #text = "";
  /** Position in the grammar above. */
  #state: BareState = { kind: "begin" };
  /** Whether the value is inside a ``` fence. */
  #fenced = false;
  /** The text of the object key being read (for the early check of call keys). */
  #key = "";
  /** Calls of the values completed so far. */
  #calls: FoundCall[] = [];

  constructor(
    /** The request's tools: a bare call must name one of them. */
    private readonly tools: readonly ToolSpec[],
  ) {}

  /** True when text starting with `ch` (the first non-whitespace character) may be a bare call. */
  static mayStartWith(ch: string): boolean {
    return ch === "{" || ch === "[" || ch === "`";
  }

  /** Everything pushed so far (to release as content). */
  get text(): string {
    return this.#text;
  }

  /** Feeds text; false once the output can no longer be a bare call (then stop feeding and release `text`). */
  push(s: string): boolean {
    for (let i = 0; i < s.length; i++) {
      this.#text += s[i];
      if (!this.#step(s[i]!)) {
        this.#state = { kind: "impossible" };
        // Keep the rest too, so `text` is everything pushed.
        this.#text += s.slice(i + 1);
        return false;
      }
    }
    return true;
  }

  /** At the end of the output: the calls, or null when the whole output is not a bare call. */
  calls(): FoundCall[] | null {
    const k = this.#state.kind;
    // Why "after" also when fenced: a model stopped right after the value is still clear; a cut value is not.
    return (k === "after" || k === "closed") && this.#calls.length > 0 ? this.#calls : null;
  }

  /** One character at position `this.#text.length - 1`; false = impossible. */
  #step(ch: string): boolean {
    const st = this.#state;
    const pos = this.#text.length - 1;
    switch (st.kind) {
      case "begin":
        if (ch === "`") {
          this.#fenced = true;
          this.#state = { kind: "fenceOpen", ticks: 1 };
          return true;
        }
        return this.#startValue(ch, pos);
      case "fenceOpen":
        if (ch !== "`") return false;
        if (st.ticks + 1 === FENCE.length) this.#state = { kind: "fenceLang", spaced: false };
        else this.#state = { kind: "fenceOpen", ticks: st.ticks + 1 };
        return true;
      case "fenceLang":
        if (isSpace(ch)) {
          this.#state = { kind: "fenceLang", spaced: true };
          return true;
        }
        if (!st.spaced && /[A-Za-z0-9_-]/.test(ch)) return true;
        return this.#startValue(ch, pos);
      case "value": {
        const wasKey = st.scanner.readingKey;
        const step = st.scanner.push(ch);
        if (step === "error") return false;
        if (step === "more") return this.#checkKey(st, wasKey, ch);
        const found = callsFromJson(tryParseJson(this.#text.slice(st.start)), this.tools, true);
        if (found === null) return false;
        this.#calls.push(...found);
        this.#state = { kind: "after", newline: false };
        return true;
      }
      case "after":
        if (ch === "\n") this.#state = { kind: "after", newline: true };
        if (isSpace(ch)) return true;
        // One call object per line (JSON Lines), as small models write parallel calls in one fence.
        if (st.newline && ch === "{") return this.#startValue(ch, pos);
        if (ch === ";") {
          this.#state = { kind: "separated" };
          return true;
        }
        if (ch === "`" && this.#fenced) {
          this.#state = { kind: "fenceClose", ticks: 1 };
          return true;
        }
        return false;
      case "separated":
        if (isSpace(ch)) return true;
        return this.#startValue(ch, pos);
      case "fenceClose":
        if (ch !== "`") return false;
        this.#state = st.ticks + 1 === FENCE.length ? { kind: "closed" } : { kind: "fenceClose", ticks: st.ticks + 1 };
        return true;
      case "closed":
        return isSpace(ch);
      case "impossible":
        return false;
    }
  }

  /**
   * Early release: a key of a call object (depth 1 for `{…}`, 2 inside `[…]`) must be one a call can have
   * (`name`, `arguments`, …), so `{"answer": …` streams as content at once instead of after its last `}`.
   */
  #checkKey(st: Extract<BareState, { kind: "value" }>, wasKey: boolean, ch: string): boolean {
    const callDepth = this.#text[st.start] === "[" ? 2 : 1;
    if (st.scanner.depth !== callDepth) return true;
    if (st.scanner.readingKey) {
      // Why skip the opening quote: the key text starts after it.
      if (wasKey) this.#key += ch;
      else this.#key = "";
      return true;
    }
    if (!wasKey) return true;
    // The closing quote was just read. A key with escapes could still spell a call key: leave it to the end.
    return this.#key.includes("\\") || CALL_KEYS.has(this.#key);
  }

  /** A value must start here (`{` or `[`). */
  #startValue(ch: string, pos: number): boolean {
    const scanner = new JsonScanner();
    if (scanner.push(ch) !== "more") return false;
    this.#state = { kind: "value", scanner, start: pos };
    return true;
  }
}
