/**
 * The vocabulary of the JSON schema → GBNF conversion (json-schema-gbnf.ts): limits, the shared primitive rules,
 * the keywords it refuses, the conversion's context types, and the schema helpers (JSON pointers, inferred types,
 * finiteness) that need no builder.
 */
import { invalidValue, type KeelHttpError } from "../http/errors.js";
import { literal } from "./gbnf-text.js";

/** Deepest schema nesting we convert. */
export const MAX_SCHEMA_DEPTH = 64;
/**
 * Largest GBNF text one builder (one request) may produce, in characters with repetitions counted expanded: it
 * bounds llama.cpp's per-step grammar cost. 50 tools of 5 parameters (bench/guided.mjs's set) count 64–74 K in
 * every call format (57.6 K characters of text), so 256 K leaves a 3.5× margin.
 */
export const MAX_GBNF_CHARS = 256 * 1024;
/** Largest integral part of an integer/number, in digits (llama.cpp's bound). */
export const MAX_DIGITS = 16;

/** Shared primitive rules: name → body. Emitted once per builder, on first use (with their dependencies). */
export const PRIMITIVES: Readonly<Record<string, string>> = {
  space: '| " " | "\\n" [ \\t]{0,20}',
  "json-char": '[^"\\\\\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
  // One code point exactly (for length limits): no `\uD800`–`\uDFFF` escapes, so an astral character is written
  // raw and never as an escaped surrogate pair that would count twice.
  "json-char-cp": '[^"\\\\\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))',
  "json-string": '"\\"" json-char* "\\""',
  "json-int": '"-"? ([0-9] | [1-9] [0-9]{0,15})',
  "json-number": 'json-int ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})?',
  "json-bool": '"true" | "false"',
  "json-null": '"null"',
  "json-value": "json-object | json-array | json-string | json-number | json-bool | json-null",
  "json-member": 'json-string space ":" space json-value',
  "json-object": '"{" space (json-member space ("," space json-member space)*)? "}"',
  "json-array": '"[" space (json-value space ("," space json-value space)*)? "]"',
  // Raw text (a qwen3coder parameter value) that never contains "</parameter>": an automaton whose state counts how
  // much of that tag has just been seen; the full tag has no transition. (The parser ends a value at a
  // `</parameter>` followed by another tag, with or without a newline before it, so a value may hold none.)
  "raw-text": "raw-s0",
};
/** Dependencies of primitives (emitting a primitive emits these too). */
export const PRIMITIVE_DEPS: Readonly<Record<string, readonly string[]>> = {
  "json-string": ["json-char"],
  "json-number": ["json-int"],
  "json-value": ["json-object", "json-array", "json-string", "json-number", "json-bool", "json-null"],
  "json-member": ["json-string", "space", "json-value"],
  "json-object": ["space", "json-member"],
  "json-array": ["space", "json-value"],
};

/**
 * The markup a raw parameter value must not contain: `</parameter>` ends the value, and the qwen3coder parser also
 * reads a value as ended where `<parameter=` opens a parameter it was not given yet or where `</function>` follows
 * (a model that forgot `</parameter>`: parsers/qwen3coder.ts). A guided value holding any of them would be read back
 * as other parameters than the grammar let through (the breaker's `unit: "<f>"`).
 */
export const RAW_EXCLUDED = ["</parameter>", "<parameter=", "</function>"] as const;

/**
 * Rules of the raw-text automaton (see PRIMITIVES["raw-text"]): one state per prefix of the excluded tags that the
 * text written so far ends with (`raw-s0`: none). Every tag starts with `<` and has no other `<`, so a character that
 * leaves the trie goes back to the `<` state on `<` and to `raw-s0` on anything else, and a character that would
 * complete a tag has no rule. Any state may end the value.
 */
export function rawTextRules(): Array<[string, string]> {
  const hex = (c: string) => `\\x${c.codePointAt(0)!.toString(16).toUpperCase().padStart(2, "0")}`;
  const prefixes = ["", ...new Set(RAW_EXCLUDED.flatMap((t) => Array.from({ length: t.length - 1 }, (_, j) => t.slice(0, j + 1))))];
  const state = (prefix: string): string => `raw-s${prefixes.indexOf(prefix)}`;
  return prefixes.map((prefix) => {
    const next = new Map<string, string>(); // character → prefix it leads to
    const banned = new Set<string>(); // characters that would complete a tag
    for (const tag of RAW_EXCLUDED) {
      if (!tag.startsWith(prefix)) continue;
      const c = tag[prefix.length]!;
      if (prefix.length + 1 === tag.length) banned.add(c);
      else next.set(c, prefix + c);
    }
    if (!next.has("<")) next.set("<", "<");
    const alts = [...next].filter(([c]) => !banned.has(c)).map(([c, to]) => `${literal(c)} ${state(to)}`);
    const stay = [...new Set([...next.keys(), ...banned])].map(hex).join("");
    return [state(prefix), [...alts, `[^${stay}] raw-s0`, '""'].join(" | ")];
  });
}

/** Closing tags of the qwen3coder call format: a raw parameter value holding one cannot be read back. */
export const QWEN_TAGS = ["</parameter>", "</function>", "</tool_call>"] as const;

/** Keywords that constrain but that the grammar cannot honour: always refused (unless trivially satisfied). */
export const REFUSED_KEYWORDS = [
  "multipleOf",
  "not",
  "if",
  "then",
  "else",
  "dependentRequired",
  "dependentSchemas",
  "dependencies",
  "patternProperties",
  "propertyNames",
  "contains",
  "minContains",
  "maxContains",
  "unevaluatedProperties",
  "unevaluatedItems",
  "$dynamicRef",
  "$recursiveRef",
  "contentSchema",
] as const;

/** Where a conversion is and what it may not revisit. */
export interface Ctx {
  /** JSON pointer of the current schema inside the root (`#/properties/a`). */
  ptr: string;
  /** Nesting depth. */
  depth: number;
  /** Refs entered since the last object/array: re-entering one is a ref cycle without structure. */
  unguarded: ReadonlySet<string>;
}

/** One schema's conversion state. */
export interface SchemaJob {
  /** The root schema (target of `#…` refs). */
  root: unknown;
  /** Rule-name prefix. */
  prefix: string;
  /** Request field path for errors (`tools[2].function.parameters`). */
  param: string;
  /** Rule name per resolved `$ref` pointer (emitted once). */
  refRules: Map<string, string>;
  /** `$ref`s proven to admit a finite value (memo of {@link finite}). */
  finiteRefs: Set<string>;
}

export type JsonSchema = Record<string, unknown>;


/**
 * Whether some finite JSON value satisfies `schema` as the grammar reads it (run after a successful conversion, so
 * the schema is well-formed). A minimal finite value never nests a `$ref` inside itself, so a ref met again on the
 * current path counts as unusable; `known` memoises refs proven finite (true in every context).
 */
export function finite(root: unknown, schema: unknown, path: Set<string>, known: Set<string>): boolean {
  if (typeof schema !== "object" || schema === null) return schema !== false;
  const s = schema as JsonSchema;
  const sub = (x: unknown) => finite(root, x, path, known);
  if (typeof s.$ref === "string") {
    const ref = s.$ref;
    if (known.has(ref)) return true;
    if (path.has(ref)) return false;
    path.add(ref);
    const ok = sub(resolvePointer(root, ref));
    path.delete(ref);
    if (ok) known.add(ref);
    return ok;
  }
  if ("const" in s || "enum" in s) return true;
  if (Array.isArray(s.allOf)) {
    // As converted: one object with every part's properties and required names (parts may be refs).
    const parts = [{ ...s, allOf: undefined }, ...s.allOf.map((p) => (typeof p === "object" && p !== null && typeof (p as JsonSchema).$ref === "string" ? resolvePointer(root, (p as JsonSchema).$ref as string) : p))];
    const properties: JsonSchema = {};
    const required: unknown[] = [];
    for (const p of parts) {
      if (typeof p !== "object" || p === null) continue;
      Object.assign(properties, (p as JsonSchema).properties ?? {});
      if (Array.isArray((p as JsonSchema).required)) required.push(...((p as JsonSchema).required as unknown[]));
    }
    return finite(root, { type: "object", properties, required }, path, known);
  }
  for (const k of ["anyOf", "oneOf"] as const) if (Array.isArray(s[k])) return (s[k] as unknown[]).some(sub);
  const type = s.type ?? inferType(s);
  const types = Array.isArray(type) ? type : [type];
  return types.some((t) => {
    if (t === "object") {
      const props = (s.properties ?? {}) as JsonSchema;
      const required = Array.isArray(s.required) ? (s.required as string[]) : [];
      return required.every((r) => sub(props[r]));
    }
    if (t === "array") {
      const min = num(s.minItems, 0);
      const prefix = Array.isArray(s.prefixItems) ? s.prefixItems : Array.isArray(s.items) ? s.items : [];
      const rest = Array.isArray(s.prefixItems) ? s.items : Array.isArray(s.items) ? s.additionalItems : s.items;
      return prefix.slice(0, min).every(sub) && (min <= prefix.length || rest === undefined || sub(rest));
    }
    return true;
  });
}

/** The 400 for a schema whose conversion ran out of stack. */
export function tooComplex(param: string | null): KeelHttpError {
  return markUnsupported(invalidValue(param, `Invalid schema for '${param ?? "the request"}' at '#': the schema is too complex to convert (too deep or too large); simplify it.`));
}

/** Errors for valid schemas the grammar cannot honour (vs invalid schemas). */
const UNSUPPORTED = new WeakSet<KeelHttpError>();

/** Marks a schema 400 as "valid schema, not guidable" (see {@link isUnsupportedSchema}). */
export function markUnsupported(err: KeelHttpError): KeelHttpError {
  UNSUPPORTED.add(err);
  return err;
}

/** Whether a schema 400 is about a valid schema that guided generation cannot honour (not an invalid schema). */
export function isUnsupportedSchema(err: unknown): boolean {
  return typeof err === "object" && err !== null && UNSUPPORTED.has(err as KeelHttpError);
}


/** Annotation keywords: never constrain. */
export const ANNOTATIONS = new Set(["title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "$anchor"]);

export function num(v: unknown, dflt: number): number {
  return typeof v === "number" && Number.isFinite(v) ? Math.max(0, Math.floor(v)) : dflt;
}

export function sanitizePrefix(p: string): string {
  const clean = p.replace(/[^a-zA-Z0-9]+/g, "-").replace(/^-+|-+$/g, "");
  return clean || "s";
}

export function escapePointer(seg: string): string {
  return seg.replace(/~/g, "~0").replace(/\//g, "~1");
}

/** Resolves `#`, `#/a/b` (with ~0/~1 and %-escapes) inside `root`; undefined when absent. */
export function resolvePointer(root: unknown, ref: string): unknown {
  if (ref === "#") return root;
  if (!ref.startsWith("#/")) return undefined;
  let cur: unknown = root;
  for (const raw of ref.slice(2).split("/")) {
    const seg = safeDecode(raw).replace(/~1/g, "/").replace(/~0/g, "~");
    if (typeof cur !== "object" || cur === null || !Object.prototype.hasOwnProperty.call(cur, seg)) return undefined;
    cur = (cur as Record<string, unknown>)[seg];
  }
  return cur;
}

/** %-decoding of a pointer segment; a stray `%` stays literal. */
function safeDecode(seg: string): string {
  try {
    return decodeURIComponent(seg);
  } catch {
    return seg;
  }
}

/** The type a schema without `type` constrains, from its keywords (undefined: any value). */
export function inferType(s: JsonSchema): string | undefined {
  if ("properties" in s || "additionalProperties" in s || "required" in s) return "object";
  if ("items" in s || "prefixItems" in s || "minItems" in s || "maxItems" in s) return "array";
  if ("pattern" in s || "minLength" in s || "maxLength" in s || "format" in s) return "string";
  if ("minimum" in s || "maximum" in s || "exclusiveMinimum" in s || "exclusiveMaximum" in s) return "number";
  return undefined;
}

export function jsonTypeMatches(v: unknown, t: unknown): boolean {
  switch (t) {
    case "null":
      return v === null;
    case "boolean":
      return typeof v === "boolean";
    case "string":
      return typeof v === "string";
    case "integer":
      return typeof v === "number" && Number.isInteger(v);
    case "number":
      return typeof v === "number";
    case "array":
      return Array.isArray(v);
    case "object":
      return typeof v === "object" && v !== null && !Array.isArray(v);
    default:
      return false;
  }
}
