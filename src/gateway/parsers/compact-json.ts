/**
 * An incremental JSON reader that re-writes one value as compact JSON while it arrives — the streamed tool-call
 * arguments of hermes3 and llama3. Fed one character at a time, it emits only what is certain: whitespace is
 * dropped, a string's characters as they come (each re-escaped the way `JSON.stringify` writes it), a number or
 * literal once it ends (normalised by `JSON.stringify(JSON.parse(…))`), an object key together with the start of
 * its value. So the text emitted so far plus {@link CompactJson.closer} is always valid JSON: a call cut in the
 * middle keeps the arguments produced so far, closed.
 *
 * Lenient where a model's slip is unambiguous: raw control characters inside strings (a literal line break in a
 * code argument) are accepted and written escaped. For a value without duplicate keys the output equals
 * `JSON.stringify(JSON.parse(text))`; duplicate keys are kept as written (a client's JSON parser keeps the last).
 *
 * @module
 */
import { isSpace } from "./tag-scan.js";

/** What one character did: consumed and more is needed; consumed and the value ended; the value had already
 * ended before it (a top-level number: the character is not consumed); or not JSON (not consumed). */
export type CompactStep = "more" | "done" | "ended" | "error";

/** An open container and how many members it has emitted (a `,` precedes every later one). */
interface Container {
  type: "obj" | "arr";
  count: number;
}

/** What the reader expects next. */
type Mode =
  | "value" // a value (top level, after `:`, after `,` in an array)
  | "valueOrEnd" // a value or `]`
  | "key" // a key string
  | "keyOrEnd" // a key string or `}`
  | "colon"
  | "afterValue" // `,` or the container's closer
  | "string" // inside a string (key or value)
  | "escape" // after `\`
  | "unicode" // inside `\uXXXX`
  | "number"
  | "literal"
  | "done";

const NUMBER = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$/;
const ESCAPES: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };

export class CompactJson {
  /** Open containers, innermost last. */
  readonly #stack: Container[] = [];
  /** Position in the grammar. */
  #mode: Mode = "value";
  /** Whether the string being read is an object key. */
  #inKey = false;
  /** The decoded text of the key being read. */
  #key = "";
  /** `"key":` of the member whose value is about to start ("" in arrays and at the top). */
  #memberKey = "";
  /** A number's or literal's text so far, and the `,`/key prefix it will be emitted with. */
  #scalar = "";
  #scalarPrefix = "";
  /** The hex digits of a `\u` escape so far. */
  #hex = "";
  /** A high surrogate waiting for its low half (so a pair is written as one character, as `JSON.stringify`). */
  #high = "";
  /** Emitted text not yet taken. */
  #out = "";
  /** Everything emitted (taken or not). */
  #all = "";

  /** True once the value is complete. */
  get complete(): boolean {
    return this.#mode === "done";
  }

  /** All compact text emitted so far. */
  get text(): string {
    return this.#all;
  }

  /** True while the top-level value is an object still open, or nothing has started. */
  get startedObject(): boolean {
    return this.#stack[0]?.type === "obj";
  }

  /** The compact text emitted since the last call. */
  take(): string {
    const t = this.#out;
    this.#out = "";
    return t;
  }

  /** What closes the value as emitted so far (an open string, open containers); "" once complete. */
  closer(): string {
    let s = "";
    if ((this.#mode === "string" || this.#mode === "escape" || this.#mode === "unicode") && !this.#inKey) {
      s += this.#high === "" ? "" : JSON.stringify(this.#high).slice(1, -1);
      s += '"';
    }
    for (let i = this.#stack.length - 1; i >= 0; i--) s += this.#stack[i]!.type === "obj" ? "}" : "]";
    return s;
  }

  /** Emits the closer as if the value had ended here (a cut call); later input is refused. */
  close(): string {
    const c = this.closer();
    this.#emit(c);
    this.#stack.length = 0;
    this.#mode = "done";
    return this.take();
  }

  /** Feeds one UTF-16 unit. */
  push(ch: string): CompactStep {
    switch (this.#mode) {
      case "done":
        return "ended";
      case "string":
        return this.#stringChar(ch);
      case "escape":
        return this.#escapeChar(ch);
      case "unicode": {
        if (!/[0-9a-fA-F]/.test(ch)) return "error";
        this.#hex += ch;
        if (this.#hex.length === 4) {
          this.#mode = "string";
          this.#unit(String.fromCharCode(parseInt(this.#hex, 16)));
        }
        return "more";
      }
      case "number":
        if ("0123456789+-.eE".includes(ch)) {
          this.#scalar += ch;
          return "more";
        }
        if (!NUMBER.test(this.#scalar)) return "error";
        this.#endScalar(JSON.stringify(JSON.parse(this.#scalar)));
        // Why re-dispatch: the character that ends a number is the next token; at the top it is not ours.
        return (this.#mode as Mode) === "done" ? "ended" : this.push(ch);
      case "literal": {
        const want = ["true", "false", "null"].find((l) => l.startsWith(this.#scalar + ch));
        if (want === undefined) return "error";
        this.#scalar += ch;
        if (this.#scalar === want) this.#endScalar(want);
        return (this.#mode as Mode) === "done" ? "done" : "more";
      }
      default:
        break;
    }
    if (isSpace(ch)) return "more";
    switch (this.#mode) {
      case "value":
      case "valueOrEnd":
        if (ch === "]" && this.#mode === "valueOrEnd") return this.#close();
        return this.#startValue(ch);
      case "key":
      case "keyOrEnd":
        if (ch === "}" && this.#mode === "keyOrEnd") return this.#close();
        if (ch !== '"') return "error";
        this.#inKey = true;
        this.#key = "";
        this.#mode = "string";
        return "more";
      case "colon":
        if (ch !== ":") return "error";
        this.#memberKey = JSON.stringify(this.#key) + ":";
        this.#mode = "value";
        return "more";
      case "afterValue": {
        const top = this.#stack[this.#stack.length - 1]!;
        if (ch === ",") {
          this.#mode = top.type === "obj" ? "key" : "value";
          return "more";
        }
        if ((ch === "}" && top.type === "obj") || (ch === "]" && top.type === "arr")) return this.#close();
        return "error";
      }
      default:
        return "error";
    }
  }

  /** The prefix of a member about to be emitted: `,` unless first, then `"key":` in an object. */
  #prefix(): string {
    const top = this.#stack[this.#stack.length - 1];
    if (top === undefined) return "";
    const p = (top.count > 0 ? "," : "") + (top.type === "obj" ? this.#memberKey : "");
    top.count++;
    return p;
  }

  #startValue(ch: string): CompactStep {
    if (ch === "{" || ch === "[") {
      this.#emit(this.#prefix() + ch);
      this.#stack.push({ type: ch === "{" ? "obj" : "arr", count: 0 });
      this.#mode = ch === "{" ? "keyOrEnd" : "valueOrEnd";
      return "more";
    }
    if (ch === '"') {
      this.#emit(this.#prefix() + '"');
      this.#inKey = false;
      this.#mode = "string";
      return "more";
    }
    if (ch === "-" || (ch >= "0" && ch <= "9") || ch === "t" || ch === "f" || ch === "n") {
      // Why the prefix is computed now but emitted later: a cut scalar is dropped with its key.
      const top = this.#stack[this.#stack.length - 1];
      this.#scalarPrefix = top === undefined ? "" : (top.count > 0 ? "," : "") + (top.type === "obj" ? this.#memberKey : "");
      this.#scalar = ch;
      this.#mode = ch === "t" || ch === "f" || ch === "n" ? "literal" : "number";
      return "more";
    }
    return "error";
  }

  #endScalar(text: string): void {
    const top = this.#stack[this.#stack.length - 1];
    if (top !== undefined) top.count++;
    this.#emit(this.#scalarPrefix + text);
    this.#mode = top === undefined ? "done" : "afterValue";
  }

  #stringChar(ch: string): CompactStep {
    if (ch === "\\") {
      this.#mode = "escape";
      return "more";
    }
    if (ch !== '"') {
      this.#unit(ch);
      return "more";
    }
    // The closing quote.
    this.#flushHigh();
    if (this.#inKey) {
      this.#inKey = false;
      this.#mode = "colon";
      return "more";
    }
    this.#emit('"');
    this.#mode = this.#stack.length === 0 ? "done" : "afterValue";
    return this.#mode === "done" ? "done" : "more";
  }

  #escapeChar(ch: string): CompactStep {
    if (ch === "u") {
      this.#hex = "";
      this.#mode = "unicode";
      return "more";
    }
    const decoded = ESCAPES[ch];
    if (decoded === undefined) return "error";
    this.#mode = "string";
    this.#unit(decoded);
    return "more";
  }

  /** One decoded UTF-16 unit of a string: into the key, or written re-escaped (pairs kept together). */
  #unit(u: string): void {
    if (this.#inKey) {
      this.#key += u;
      return;
    }
    const code = u.charCodeAt(0);
    if (this.#high !== "") {
      const high = this.#high;
      this.#high = "";
      if (code >= 0xdc00 && code <= 0xdfff) {
        this.#emit(high + u);
        return;
      }
      this.#emit(JSON.stringify(high).slice(1, -1));
    }
    if (code >= 0xd800 && code <= 0xdbff) this.#high = u;
    else this.#emit(JSON.stringify(u).slice(1, -1));
  }

  #flushHigh(): void {
    if (this.#high === "" || this.#inKey) return;
    this.#emit(JSON.stringify(this.#high).slice(1, -1));
    this.#high = "";
  }

  #close(): CompactStep {
    const c = this.#stack.pop()!;
    this.#emit(c.type === "obj" ? "}" : "]");
    this.#mode = this.#stack.length === 0 ? "done" : "afterValue";
    return this.#mode === "done" ? "done" : "more";
  }

  #emit(s: string): void {
    this.#out += s;
    this.#all += s;
  }
}
