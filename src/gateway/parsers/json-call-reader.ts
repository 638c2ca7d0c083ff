/**
 * Reads one JSON tool call `{"name": "N", "arguments": {…}}` (also `"parameters"`, also arguments as a JSON text)
 * character by character, for hermes3 `<tool_call>` bodies and llama3 calls after `<|python_tag|>`: the name is
 * known the moment its string closes, and the arguments object is re-written as compact JSON while it arrives
 * (compact-json.ts). Keys other than these are skipped; the first `name` and the first arguments key win.
 *
 * A bare call (no tag says "this is a call") is read with `declared`: the name must be a declared tool and every
 * top-level key one a call can have, so a JSON answer is given up at its first other key (and streams as content).
 *
 * Before the name is known the reader can still give up (`giveUp`: the text is not this shape — a list, OpenAI's
 * `{"function": …}` wrapper, not JSON at all), and the caller re-reads it the old way, as a whole. After the name
 * is known the call exists (it was streamed); text that breaks the JSON then `broken`s it: the arguments are
 * closed as produced so far ({@link JsonCallReader.closeArgs}) and the caller treats the rest as text.
 *
 * @module
 */
import { CompactJson } from "./compact-json.js";
import { isSpace } from "./tag-scan.js";

/** One character's effect: consumed (`more`, `done` = the object closed), or not consumed (`giveUp`, `broken`). */
export type CallReadStep = "more" | "done" | "giveUp" | "broken";

/** Where the reader is in the top-level object. */
type Part =
  | { at: "open" } // before `{`
  | { at: "keyOrEnd"; first: boolean } // a key, or (when `first`, right after `{`) `}`
  | { at: "key"; reader: CompactJson } // inside a key string
  | { at: "colon"; key: string }
  | { at: "value"; key: string; role: Role; reader: CompactJson | null } // a value; reader once it started
  | { at: "afterValue" };

/** What a value of a key is for. */
type Role = "name" | "args" | "skip" | "wrapper";

/** The keys a call object may have (call-shape.ts), the OpenAI-style wrapper included. */
const CALL_KEYS = new Set(["name", "arguments", "parameters", "type", "function", "id"]);

export class JsonCallReader {
  /** Every character consumed (the text to re-read or release if the reader gives up). */
  #raw = "";
  /** Position in the object. */
  #part: Part = { at: "open" };
  /** The call's name, once its string closed. */
  #name: string | null = null;
  /** The arguments writer, once the arguments value started (or was decoded from a JSON text). */
  #args: CompactJson | null = null;
  /** An arguments key was seen (later ones are skipped). */
  #argsSeen = false;

  constructor(
    /** For a bare call: the declared tool names (the name must be one; keys must be call keys); null after a tag. */
    private readonly declared: readonly string[] | null = null,
  ) {}

  /** Text consumed so far. */
  get raw(): string {
    return this.#raw;
  }

  /** The name, once known (the caller announces the call then). */
  get name(): string | null {
    return this.#name;
  }

  /** Compact arguments text produced since the last call; "" until the name is known (held until then). */
  takeArgs(): string {
    return this.#name === null || this.#args === null ? "" : this.#args.take();
  }

  /** At the end of the call (complete, cut or broken): the rest of its arguments, closed to a JSON object. */
  closeArgs(): string {
    if (this.#args === null) return "{}";
    const rest = this.#args.take();
    return rest + (this.#args.complete ? "" : this.#args.close());
  }

  /** Feeds one character. */
  push(ch: string): CallReadStep {
    const step = this.#step(ch);
    if (step === "more" || step === "done") this.#raw += ch;
    return step;
  }

  /** The step's failure: before the name, give the text back; after it, the call is broken here. */
  #fail(): CallReadStep {
    return this.#name === null ? "giveUp" : "broken";
  }

  #step(ch: string): CallReadStep {
    const part = this.#part;
    switch (part.at) {
      case "open":
        if (isSpace(ch)) return "more";
        if (ch !== "{") return "giveUp";
        this.#part = { at: "keyOrEnd", first: true };
        return "more";
      case "keyOrEnd":
        if (isSpace(ch)) return "more";
        if (ch === "}" && part.first) return this.#end();
        if (ch !== '"') return this.#fail();
        this.#part = { at: "key", reader: new CompactJson() };
        return this.#keyChar(ch);
      case "key":
        return this.#keyChar(ch);
      case "colon":
        if (isSpace(ch)) return "more";
        if (ch !== ":") return this.#fail();
        this.#part = { at: "value", key: part.key, role: this.#role(part.key), reader: null };
        return "more";
      case "value":
        return this.#valueChar(part, ch);
      case "afterValue":
        if (isSpace(ch)) return "more";
        if (ch === ",") {
          this.#part = { at: "keyOrEnd", first: false };
          return "more";
        }
        if (ch === "}") return this.#end();
        return this.#fail();
    }
  }

  #keyChar(ch: string): CallReadStep {
    const part = this.#part as Extract<Part, { at: "key" }>;
    const step = part.reader.push(ch);
    if (step === "error") return this.#fail();
    if (step !== "done") return "more";
    const key = JSON.parse(part.reader.text) as string;
    if (this.declared !== null && this.#name === null && !CALL_KEYS.has(key)) return "giveUp";
    this.#part = { at: "colon", key };
    return "more";
  }

  /** The role of the value of `key` now. */
  #role(key: string): Role {
    if (key === "name" && this.#name === null) return "name";
    if ((key === "arguments" || key === "parameters") && !this.#argsSeen) return "args";
    // Why give up on `function` before a name: OpenAI's wrapper shape, read as a whole by the caller.
    if (key === "function" && this.#name === null) return "wrapper";
    return "skip";
  }

  #valueChar(part: Extract<Part, { at: "value" }>, ch: string): CallReadStep {
    if (part.reader === null) {
      if (isSpace(ch)) return "more";
      const role = part.role;
      if (role === "wrapper") return this.#fail();
      if (role === "name" && ch !== '"') return this.#fail();
      if (role === "args") {
        if (ch !== "{" && ch !== '"') return this.#fail();
        this.#argsSeen = true;
      }
      part.reader = new CompactJson();
      if (role === "args" && ch === "{") this.#args = part.reader;
    }
    const step = part.reader.push(ch);
    if (step === "error") return this.#fail();
    if (step === "more") return "more";
    if (step === "ended") {
      // A top-level number ended before `ch`: re-read `ch` after the value.
      this.#part = { at: "afterValue" };
      return this.#step(ch);
    }
    // The value closed with `ch`.
    const role = part.role;
    this.#part = { at: "afterValue" };
    if (role === "name") {
      const name = JSON.parse(part.reader.text) as string;
      if (name.trim() === "" || (this.declared !== null && !this.declared.includes(name))) return this.#fail();
      this.#name = name;
    } else if (role === "args" && part.reader !== this.#args) {
      // Arguments given as a JSON text (OpenAI's wire shape): decoded and re-written whole.
      const decoded = decodeArgumentsText(JSON.parse(part.reader.text) as string);
      if (decoded === null) return this.#fail();
      this.#args = decoded;
    }
    return "more";
  }

  /** The object closed: a call when it had a name. */
  #end(): CallReadStep {
    return this.#name === null ? "giveUp" : "done";
  }
}

/** A JSON text holding exactly one object, as a complete writer; null when it is not one. */
function decodeArgumentsText(text: string): CompactJson | null {
  const w = new CompactJson();
  let i = 0;
  while (i < text.length && isSpace(text[i]!)) i++;
  if (text[i] !== "{") return null;
  for (; i < text.length; i++) {
    const step = w.push(text[i]!);
    if (step === "error") return null;
    if (step === "done") break;
  }
  if (!w.complete || text.slice(i + 1).trim() !== "") return null;
  return w;
}
