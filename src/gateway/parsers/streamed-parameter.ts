/**
 * One qwen3coder parameter written as a JSON object member while its raw value arrives. A string parameter (the
 * schema allows `string`) streams: `"P":"` and the value's characters, JSON-escaped, as soon as they are certain —
 * holding back a final `\n` (the one before `</parameter>` is trimmed), a lone high surrogate (a pair is written as
 * one character, as `JSON.stringify`), and, when the schema also allows `null`, a value that could still be exactly
 * `null`. Any other parameter is written whole when its value ends, typed by the schema (parameter-values.ts).
 * The fragments concatenate to `"P":` + `JSON.stringify(typedValue(raw, schema))` for every split.
 *
 * @module
 */
import { schemaTypes, typedValue } from "./parameter-values.js";

export class StreamedParameter {
  /** `,"P":` (no comma for the first member). */
  readonly #prefix: string;
  /** The parameter's schema (undefined when the tool does not describe it). */
  readonly #schema: unknown;
  /** String-typed: the value streams. */
  readonly #streams: boolean;
  /** The schema also allows null: a value `null` is JSON null. */
  readonly #nullable: boolean;
  /** The raw value so far. */
  #raw = "";
  /** The opening quote was written. */
  #open = false;
  /** How many characters of the (trimmed) value were written. */
  #written = 0;

  constructor(name: string, schema: unknown, first: boolean) {
    this.#prefix = (first ? "" : ",") + JSON.stringify(name) + ":";
    this.#schema = schema;
    const types = schemaTypes(schema);
    this.#streams = types.has("string");
    this.#nullable = types.has("null");
  }

  /** More raw value text; returns what can be written now. */
  push(text: string): string {
    this.#raw += text;
    if (!this.#streams || this.#raw === "") return "";
    // 1. The certain part: without the leading `\n`, a possible trailing `\n` and a possible first half of a pair.
    const raw = this.#raw;
    const lead = raw.startsWith("\n") ? 1 : 0;
    let end = raw.length;
    if (end > lead && raw.endsWith("\n")) end--;
    const code = end > lead ? raw.charCodeAt(end - 1) : 0;
    if (code >= 0xd800 && code <= 0xdbff) end--;
    const safe = raw.slice(lead, end);
    // 2. A nullable string that may still be `null` waits.
    if (!this.#open && this.#nullable && "null".startsWith(safe)) return "";
    let out = "";
    if (!this.#open) {
      this.#open = true;
      out += this.#prefix + '"';
    }
    out += escaped(safe.slice(this.#written));
    this.#written = safe.length;
    return out;
  }

  /** The value ended (closed, or cut with the output): the rest of the member. */
  end(): string {
    const value = typedValue(this.#raw, this.#schema);
    if (!this.#open) return this.#prefix + JSON.stringify(value);
    return escaped((value as string).slice(this.#written)) + '"';
  }
}

/** A string's JSON escaping without the quotes. */
function escaped(s: string): string {
  return s === "" ? "" : JSON.stringify(s).slice(1, -1);
}
