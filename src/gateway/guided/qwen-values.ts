/**
 * The grammar of one qwen3coder parameter value, chosen so that what the parser reads back is the value the grammar
 * meant. The parser (parsers/parameter-values.ts) types a raw value by the parameter's schema alone: when its
 * `type` (or an `anyOf`/`oneOf` branch's) lists `string`, the text is the string (`null` is null where null is
 * listed too); otherwise the text is parsed as JSON (Python's True/False/None normalised), or kept as the string
 * when it is not JSON. So:
 *
 * - "string" listed → only strings, written raw, and the literal `null` where the type also lists null; a number,
 *   object… the schema also allows would be read back as a string, so the grammar never writes one;
 * - nothing listed and the schema constrains (a `$ref` to a string schema…) → JSON (a string quoted): raw text such
 *   as `61` or `true` would be read back as a number or a boolean — except an enum/const whose strings are no JSON
 *   texts, and a schema that says nothing (any value the parser reads is valid): raw, as before;
 * - otherwise raw mode: JSON for containers and numbers, Python spellings allowed for literals.
 */
import { markUnsupported, resolvePointer } from "./json-schema-gbnf.js";
import type { GbnfBuilder } from "./json-schema-gbnf.js";
import { ANNOTATIONS } from "./json-schema-support.js";
import { invalidValue } from "../http/errors.js";

/** The JSON types the parser reads from a parameter schema: `type` and the branches of anyOf/oneOf (as parameter-values.ts). */
export function parserTypes(schema: unknown): Set<string> {
  const out = new Set<string>();
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) return out;
  const s = schema as Record<string, unknown>;
  if (typeof s.type === "string") out.add(s.type);
  else if (Array.isArray(s.type)) for (const x of s.type) if (typeof x === "string") out.add(x);
  for (const key of ["anyOf", "oneOf"]) {
    const branches = s[key];
    if (Array.isArray(branches)) for (const b of branches) for (const x of parserTypes(b)) out.add(x);
  }
  return out;
}

/**
 * Raw text is read back right for a schema with no listed type: it says nothing (any value is valid), or it is an
 * enum/const (through any `$ref`s) whose strings are not JSON texts (the parser keeps those as strings; other values
 * are written as JSON).
 */
function rawSafe(root: unknown, schema: unknown): boolean {
  let s = schema;
  for (let hops = 0; typeof s === "object" && s !== null && typeof (s as Record<string, unknown>).$ref === "string" && hops < 16; hops++) {
    s = resolvePointer(root, (s as Record<string, unknown>).$ref as string);
  }
  if (s === true || s === undefined) return true;
  if (typeof s !== "object" || s === null) return false;
  const o = s as Record<string, unknown>;
  if (Object.keys(o).every((k) => ANNOTATIONS.has(k))) return true;
  const values = Array.isArray(o.enum) ? (o.enum as unknown[]) : "const" in o ? [o.const] : null;
  if (values === null || Object.keys(o).some((k) => !ANNOTATIONS.has(k) && k !== "enum" && k !== "const")) return false;
  return values.every((v) => typeof v !== "string" || !readsAsJson(v));
}

/** The parser would read `text` as JSON (or a Python literal) rather than keep it as the string. */
function readsAsJson(text: string): boolean {
  if (["True", "False", "None", "TRUE", "FALSE", "NONE"].includes(text.trim())) return true;
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

/**
 * The value rule of the parameter at JSON pointer `at` of `root` (a tool's parameters schema).
 * @throws KeelHttpError 400 (marked unsupported: unguided `auto` still serves it) when the parser's reading and the
 *   schema leave the parameter no value the grammar can write.
 */
export function qwenValue(b: GbnfBuilder, root: Record<string, unknown>, at: string, prefix: string, param: string): string {
  const prop = resolvePointer(root, at);
  const types = parserTypes(prop);
  if (!types.has("string")) return b.addSchemaAt(root, at, prefix, param, types.size === 0 && !rawSafe(root, prop) ? "json" : "raw");
  const s = prop as Record<string, unknown>;
  if (s.type === "string") return b.addSchemaAt(root, at, prefix, param, "raw");
  // Mixed types: the schema narrowed to strings, in a copy of the root so that its `$defs` still resolve.
  const own = s.type === undefined ? null : Array.isArray(s.type) ? (s.type as unknown[]) : [s.type];
  if ("$ref" in s || (own !== null && !own.includes("string"))) {
    throw markUnsupported(invalidValue(param, `Invalid schema for '${param}': the parameter at '${at}' mixes a string type with a '$ref' or with types that exclude strings, which the qwen3coder format cannot write unambiguously.`));
  }
  const copy = structuredClone(root);
  const target = resolvePointer(copy, at) as Record<string, unknown>;
  target.type = "string";
  const text = b.addSchemaAt(copy, at, prefix, param, "raw");
  // `null`, read back as null where the type lists it, when nothing else in the schema could exclude it.
  const plainNull = own !== null && own.includes("null") && !["anyOf", "oneOf", "allOf", "enum", "const", "not"].some((k) => k in s);
  return plainNull ? `(${text} | "null")` : text;
}
