/**
 * qwen3coder parameter values are raw text; the tool's JSON schema says what they mean. String parameters stay
 * strings, exactly as written (a quoted `"x"` keeps its quotes, as OVMS); everything else — integer, number,
 * boolean, null, object, array, and parameters the schema does not describe — is parsed as JSON, with Python's
 * `True`/`False`/`None` (models trained on Python write them) normalised, and kept as the string when it is not JSON.
 *
 * @module
 */
import { isPlainObject } from "./call-shape.js";

/** Python spellings of JSON literals. */
const PYTHON_LITERALS: Record<string, string> = {
  True: "true",
  False: "false",
  None: "null",
  TRUE: "true",
  FALSE: "false",
  NONE: "null",
};

/** One value: one `\n` trimmed at each end, then typed by `schema`. */
export function typedValue(raw: string, schema: unknown): unknown {
  let text = raw.startsWith("\n") ? raw.slice(1) : raw;
  if (text.endsWith("\n")) text = text.slice(0, -1);
  const types = schemaTypes(schema);
  if (types.has("string")) return text === "null" && types.has("null") ? null : text;
  const literal = PYTHON_LITERALS[text.trim()];
  try {
    return JSON.parse(literal ?? text);
  } catch {
    return text;
  }
}

/** The JSON types a schema allows (`type`, a list of them, or the branches of anyOf/oneOf); empty when unknown. */
export function schemaTypes(schema: unknown): Set<string> {
  const out = new Set<string>();
  if (!isPlainObject(schema)) return out;
  const t = schema["type"];
  if (typeof t === "string") out.add(t);
  else if (Array.isArray(t)) for (const x of t) if (typeof x === "string") out.add(x);
  for (const key of ["anyOf", "oneOf"]) {
    const branches = schema[key];
    if (Array.isArray(branches)) for (const b of branches) for (const x of schemaTypes(b)) out.add(x);
  }
  return out;
}
