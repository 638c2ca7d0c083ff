/**
 * An incremental JSON syntax scanner for one top-level object or array, fed one character at a time. It answers
 * "still a valid prefix", "the value just ended" or "cannot be JSON" without re-reading earlier text — so a parser
 * can hold back a possible bare tool call and release it as content the moment it cannot be one.
 *
 * Deliberately lax where laxness only delays a decision (number spelling, control characters and escapes inside
 * strings): the final word is always `JSON.parse` on the finished value. It is never stricter than JSON, so a valid
 * call is never released as content.
 *
 * @module
 */
import { isSpace } from "./tag-scan.js";

/** What the scanner expects next. */
type Mode =
  | "start" // before the top-level `{` or `[`
  | "value" // a value (after `:` or `,` in an array)
  | "valueOrEnd" // a value or `]` (just after `[`)
  | "key" // a key string (after `,` in an object)
  | "keyOrEnd" // a key string or `}` (just after `{`)
  | "colon" // `:` after a key
  | "afterValue" // `,` or the container's closer
  | "string" // inside a string
  | "escape" // after a backslash inside a string
  | "number" // inside a number
  | "literal"; // inside true / false / null

/** Result of feeding one character. */
export type ScanStep = "more" | "done" | "error";

export class JsonScanner {
  /** Open containers, innermost last. */
  #stack: ("obj" | "arr")[] = [];
  /** What comes next. */
  #mode: Mode = "start";
  /** Whether the string being read is an object key (then `:` follows it). */
  #inKey = false;
  /** The rest of the literal being read (`rue` after `t`). */
  #literalRest = "";
  /** Set once the top-level value closed or a syntax error was seen; later input is refused. */
  #final: ScanStep = "more";

  /** How many containers are open (1 inside the top-level object or array). */
  get depth(): number {
    return this.#stack.length;
  }

  /** True while the characters fed are an object key's text (between its quotes, escapes included). */
  get readingKey(): boolean {
    return this.#inKey && (this.#mode === "string" || this.#mode === "escape");
  }

  /** True while the characters fed are inside a string (a key or a value), escapes included. */
  get inString(): boolean {
    return this.#mode === "string" || this.#mode === "escape";
  }

  /** Feeds one character (a UTF-16 unit; surrogates only ever occur inside strings, where any unit is fine). */
  push(ch: string): ScanStep {
    if (this.#final !== "more") return "error";
    const step = this.#step(ch);
    if (step !== "more") this.#final = step;
    return step;
  }

  #step(ch: string): ScanStep {
    switch (this.#mode) {
      case "string":
        if (ch === "\\") this.#mode = "escape";
        else if (ch === '"') this.#mode = this.#inKey ? "colon" : "afterValue";
        return "more";
      case "escape":
        this.#mode = "string";
        return "more";
      case "number":
        if ("0123456789+-.eE".includes(ch)) return "more";
        // Why re-dispatch: the character that ends a number is the next token (`,`, `}`, space…).
        this.#mode = "afterValue";
        return this.#step(ch);
      case "literal":
        if (ch !== this.#literalRest[0]) return "error";
        this.#literalRest = this.#literalRest.slice(1);
        if (this.#literalRest === "") this.#mode = "afterValue";
        return "more";
      default:
        break;
    }
    if (isSpace(ch)) return "more";
    switch (this.#mode) {
      case "start":
        return this.#open(ch) ? "more" : "error";
      case "value":
      case "valueOrEnd":
        if (ch === "]" && this.#mode === "valueOrEnd") return this.#close();
        if (this.#open(ch)) return "more";
        if (ch === '"') {
          this.#inKey = false;
          this.#mode = "string";
          return "more";
        }
        if (ch === "-" || (ch >= "0" && ch <= "9")) {
          this.#mode = "number";
          return "more";
        }
        if (ch === "t" || ch === "f" || ch === "n") {
          this.#literalRest = { t: "rue", f: "alse", n: "ull" }[ch];
          this.#mode = "literal";
          return "more";
        }
        return "error";
      case "key":
      case "keyOrEnd":
        if (ch === "}" && this.#mode === "keyOrEnd") return this.#close();
        if (ch !== '"') return "error";
        this.#inKey = true;
        this.#mode = "string";
        return "more";
      case "colon":
        if (ch !== ":") return "error";
        this.#mode = "value";
        return "more";
      case "afterValue": {
        const top = this.#stack[this.#stack.length - 1];
        if (ch === ",") {
          this.#mode = top === "obj" ? "key" : "value";
          return "more";
        }
        if ((ch === "}" && top === "obj") || (ch === "]" && top === "arr")) return this.#close();
        return "error";
      }
      default:
        return "error";
    }
  }

  /** Opens a container for `{` / `[`; false for any other character. */
  #open(ch: string): boolean {
    if (ch === "{") {
      this.#stack.push("obj");
      this.#mode = "keyOrEnd";
      return true;
    }
    if (ch === "[") {
      this.#stack.push("arr");
      this.#mode = "valueOrEnd";
      return true;
    }
    return false;
  }

  /** Closes the innermost container; "done" when it was the top-level one. */
  #close(): ScanStep {
    this.#stack.pop();
    this.#mode = "afterValue";
    return this.#stack.length === 0 ? "done" : "more";
  }
}
