/**
 * Tool-call grammars in the exact text formats the output parsers read (parsers/), built on one
 * {@link GbnfBuilder} so that every tool's argument schema and the shared primitives appear once:
 *
 * - hermes3: `<tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>` — tags and their newlines exact,
 *   bounded `space` inside the JSON object (as llama.cpp's grammar allows).
 * - hermes bare JSON (a small model that opens the call without the tag): `{"name": "N", "arguments": ARGS}`.
 * - qwen3coder: `<tool_call>\n<function=N>\n` + parameters + `</function>\n</tool_call>`, each parameter
 *   `<parameter=P>\n` VALUE `\n</parameter>\n`. VALUE: string-like → raw text never containing `\n</parameter>`;
 *   boolean `true|false|True|False`; null `null|None`; numbers by their rules; objects/arrays their JSON.
 *   Up to MAX_ANY_ORDER (4) declared parameters come in ANY ORDER, each at most once, all required ones present
 *   (one rule per subset already written); with more, in DECLARATION ORDER (required mandatory, optional
 *   skippable), which keeps the grammar linear in the parameter count. Extra parameters (where the schema allows
 *   extra keys) follow the declared ones. Zero parameters is `<function=N>\n</function>`.
 * - llama3 (Llama 3.1 JSON calls): `{"name": "N", "parameters": ARGS}`, several joined by `;` (OVMS's llama3 parser
 *   splits on it), optionally after `<|python_tag|>`.
 *
 * A tool without `parameters` takes no arguments: ARGS is `{}` (qwen3coder: no parameter).
 */
import { invalidValue } from "../http/errors.js";
import type { ToolSpec } from "../tools.js";
import { literal } from "./gbnf-text.js";
import { GbnfBuilder, finite, markUnsupported as unsupportedSchema, resolvePointer } from "./json-schema-gbnf.js";
import { qwenValue } from "./qwen-values.js";

/** Call formats with grammars. */
export type CallFormat = "hermes3" | "hermes3-bare" | "qwen3coder" | "llama3";

/** Rules for calls of a tool set in one builder. */
export interface CallRules {
  /** One complete call of any of the tools, in `format`, by rule name. */
  call: string;
  /** Per tool name, the rule of one call of that tool. */
  byTool: ReadonlyMap<string, string>;
  /** qwen3coder only: per tool name, the `<function=N>\n…</function>` rule (for `<function=N>` triggers). */
  functions: ReadonlyMap<string, string>;
}

/** Request field path of a tool's parameters, for 400s. */
export const toolParam = (index: number) => `tools[${index}].function.parameters`;

/**
 * Adds the rules for one call of any of `tools` in `format` to `b`. `indexOf` gives each tool's index in the
 * request (for error params). Throws a KeelHttpError 400 on a bad parameter schema.
 */
export function addCallRules(b: GbnfBuilder, format: CallFormat, tools: readonly ToolSpec[], indexOf: (t: ToolSpec) => number): CallRules {
  const byTool = new Map<string, string>();
  const functions = new Map<string, string>();
  /** Per tool, the part of its call after the text every call shares (the tool's own alternative in `call`). */
  const own: string[] = [];
  const head = format === "qwen3coder" ? '"<tool_call>\\n"' : jsonCallHead(b, format);
  const tail = format === "qwen3coder" ? '"\\n</tool_call>"' : jsonCallTail(b, format);
  for (const tool of tools) {
    const i = indexOf(tool);
    checkParametersShape(tool, toolParam(i));
    const prefix = `t${i}-${format === "hermes3-bare" ? "hb" : format === "qwen3coder" ? "qc" : format === "llama3" ? "l3" : "h"}`;
    let middle: string;
    if (format === "qwen3coder") {
      middle = b.define(b.fresh(prefix, "function"), qwenFunction(b, tool, prefix, toolParam(i)));
      functions.set(tool.name, middle);
    } else middle = b.define(b.fresh(prefix, "named"), jsonCallMiddle(b, format, tool, prefix, toolParam(i)));
    own.push(middle);
    byTool.set(tool.name, b.define(b.fresh(prefix, "call"), `${head} ${middle} ${tail}`));
  }
  // The shared head and tail once, the tools as alternatives in between: llama.cpp's grammar keeps one parse stack
  // per live alternative, and masking the vocabulary costs (vocabulary x stacks) per token, so `call_0 | call_1 | …`
  // with the head repeated made every token of the head N times as expensive (bench/vocab.mjs, docs/real-vocab.md).
  const call = b.define(b.fresh(`calls-${format}`, "any"), `${head} (${own.join(" | ")}) ${tail}`);
  return { call, byTool, functions };
}

/**
 * Tool arguments are a JSON object: `parameters` must be an object schema (a JSON object whose `type`, when given,
 * is "object"). Throws the 400 (recipe M2: parameters that are not an object).
 */
export function checkParametersShape(tool: ToolSpec, param: string): void {
  const p: unknown = tool.parameters;
  if (p === undefined) return;
  const isObject = typeof p === "object" && p !== null && !Array.isArray(p);
  const type = isObject ? (p as Record<string, unknown>).type : undefined;
  if (!isObject || (type !== undefined && type !== "object")) {
    throw invalidValue(param, `Invalid value for '${param}': a tool's parameters must be a JSON schema of type 'object'.`);
  }
}

/** Arguments rule per tool, per builder: the tagged and bare hermes formats share one conversion. */
const argsCache = new WeakMap<GbnfBuilder, Map<ToolSpec, string>>();

/** Parameters schema → object rule (JSON formats); a missing schema is `{}`. */
function argsRule(b: GbnfBuilder, tool: ToolSpec, prefix: string, param: string): string {
  let cache = argsCache.get(b);
  if (!cache) argsCache.set(b, (cache = new Map()));
  const known = cache.get(tool);
  if (known !== undefined) return known;
  // The arguments are an object whatever the root says (`{}`, a root enum or anyOf would otherwise admit any JSON
  // value, e.g. `"arguments": 6942`, which no parser reads as a call): `type: "object"` is added beside the root's
  // own keywords, so its `$defs` stay where its `$ref`s point.
  // A root `$ref` (which admits no sibling `type`) must lead to an object schema.
  const rule =
    tool.parameters === undefined
      ? b.define(`${prefix}-noargs`, `"{" ${b.primitive("space")} "}"`)
      : b.addSchema(typeof tool.parameters.$ref === "string" ? refToObject(tool.parameters, param) : { ...tool.parameters, type: "object" }, `${prefix}-args`, param);
  cache.set(tool, rule);
  return rule;
}

/**
 * `schema` (whose root is a `$ref`) with the schema its reference chain ends at typed `object` (a copy, when that
 * schema has no `type`); the 400 when it ends at another type.
 */
function refToObject(schema: Record<string, unknown>, param: string): Record<string, unknown> {
  const copy = structuredClone(schema);
  let obj: unknown = copy;
  for (let hops = 0; typeof obj === "object" && obj !== null && typeof (obj as Record<string, unknown>).$ref === "string"; hops++) {
    obj = hops > 16 ? null : resolvePointer(copy, (obj as Record<string, unknown>).$ref as string);
  }
  const target = typeof obj === "object" && obj !== null && !Array.isArray(obj) ? (obj as Record<string, unknown>) : null;
  // A chain that loops or leads nowhere: the converter refuses it with its own, more precise message.
  if (target === null) return schema;
  if (target.type !== undefined && target.type !== "object") {
    throw invalidValue(param, `Invalid schema for '${param}': the root '$ref' must lead to an object schema (tool arguments are a JSON object).`);
  }
  if (target.type === undefined) target.type = "object";
  return copy;
}

/** What every JSON call of `format` starts with, up to the name's value: `<tool_call>\n{"name": `. */
function jsonCallHead(b: GbnfBuilder, format: "hermes3" | "hermes3-bare" | "llama3"): string {
  const sp = b.primitive("space");
  const obj = `"{" ${sp} "\\"name\\"" ${sp} ":" ${sp}`;
  return format === "hermes3" ? `"<tool_call>\\n" ${obj}` : obj;
}

/** One tool's part of a JSON call: its name's value, then the arguments key and object. */
function jsonCallMiddle(b: GbnfBuilder, format: "hermes3" | "hermes3-bare" | "llama3", tool: ToolSpec, prefix: string, param: string): string {
  const sp = b.primitive("space");
  const nameLit = literal(JSON.stringify(tool.name));
  const argsKey = format === "llama3" ? '"\\"parameters\\""' : '"\\"arguments\\""';
  return `${nameLit} ${sp} "," ${sp} ${argsKey} ${sp} ":" ${sp} ${argsRule(b, tool, prefix, param)}`;
}

/** What every JSON call of `format` ends with after the arguments: `}` (and `\n</tool_call>`). */
function jsonCallTail(b: GbnfBuilder, format: "hermes3" | "hermes3-bare" | "llama3"): string {
  const obj = `${b.primitive("space")} "}"`;
  return format === "hermes3" ? `${obj} "\\n</tool_call>"` : obj;
}

/** `<function=N>\n` + parameters + `</function>` for one tool. */
export function qwenFunction(b: GbnfBuilder, tool: ToolSpec, prefix: string, param: string): string {
  const open = literal(`<function=${tool.name}>\n`);
  const params = qwenParams(b, tool, prefix, param);
  return `${open} ${params} "</function>"`;
}

function qwenParams(b: GbnfBuilder, tool: ToolSpec, prefix: string, param: string): string {
  const schema = tool.parameters;
  if (schema === undefined) return '""';
  // Validate the whole schema as JSON (refs, root keywords) in a throwaway builder, so a bad schema is refused the
  // same way in every format without its JSON rules landing in this grammar.
  new GbnfBuilder().addSchema(schema, `${prefix}-check`, param);
  // The object schema whose properties become parameters: the root, or what a root `$ref` points at.
  let ptr = "#";
  let obj: Record<string, unknown> = schema;
  for (let hops = 0; typeof obj.$ref === "string"; hops++) {
    const next = resolvePointer(schema, obj.$ref);
    if (hops > 16 || typeof next !== "object" || next === null) throw invalidForQwen(param, "the root '$ref' does not lead to an object schema");
    ptr = obj.$ref;
    obj = next as Record<string, unknown>;
  }
  for (const k of ["anyOf", "oneOf", "allOf", "enum", "const"]) {
    if (k in obj) throw unsupportedSchema(invalidForQwen(param, `a root '${k}' cannot be guided in the qwen3coder format (one parameter list is needed)`));
  }
  const props = (obj.properties ?? {}) as Record<string, unknown>;
  // A name the parser would read back otherwise (it ends a name at `>`, refuses `<` and line breaks, trims blanks).
  for (const name of Object.keys(props)) {
    if (/[<>\n]/.test(name) || name.trim() !== name || name === "") throw unsupportedSchema(invalidForQwen(param, `the property name ${JSON.stringify(name)} cannot be written as a qwen3coder parameter name`));
  }
  const required = new Set(Array.isArray(obj.required) ? (obj.required as string[]) : []);
  // Optional parameters whose schema has no finite value can never be written: left out (see GbnfBuilder.usable).
  const finiteRefs = new Set<string>();
  const names = Object.keys(props).filter((n) => required.has(n) || finite(schema, props[n], new Set(), finiteRefs));
  const base = ptr === "#" ? "#" : ptr;
  const items = names.map((name, k) => {
    // The value as the parser will read it back (qwen-values.ts). Converted in place so the tool schema's $defs
    // stay reachable.
    const at = `${base}/properties/${name.replace(/~/g, "~0").replace(/\//g, "~1")}`;
    const value = qwenValue(b, schema, at, `${prefix}-p${k}`, param);
    return `${literal(`<parameter=${name}>\n`)} ${value} "\\n</parameter>\\n"`;
  });
  // Extra parameters where the schema allows extra keys (no `properties` keyword, or additionalProperties
  // true/a schema): any name the parser reads back as written — no `<` (not the format), no line break, no blank
  // (it trims names) — (declared names are not excluded here), after the declared ones.
  const addl = obj.additionalProperties;
  let body = '""';
  if ((!("properties" in obj) && (addl === undefined || addl === true)) || (typeof addl === "object" && addl !== null && finite(schema, addl, new Set(), finiteRefs))) {
    const value = typeof addl === "object" ? b.addSchemaAt(schema, `${base}/additionalProperties`, `${prefix}-extra`, param, "raw") : b.primitive("raw-text");
    body = `(${b.define(b.fresh(prefix, "extra-param"), `"<parameter=" [^<>\\n\\t ]+ ">\\n" ${value} "\\n</parameter>\\n"`)})*`;
  }
  if (names.length <= MAX_ANY_ORDER) return anyOrder(b, prefix, names, items, required, body);
  // Declaration order; optional parameters skippable.
  for (let k = names.length - 1; k >= 0; k--) {
    const one = `${items[k]} ${body}`;
    body = required.has(names[k]!) ? one : `(${items[k]})? ${body}`;
    body = b.define(b.fresh(prefix, `params-${k}`), body);
  }
  return body;
}

/** Up to this many declared parameters, they may come in any order (2^n rules); beyond, declaration order. */
export const MAX_ANY_ORDER = 4;

/**
 * Parameters in any order, each at most once, all required ones present, then `tail` (extra parameters): one rule
 * per set of parameters already written (a bitmask), each offering the parameters not yet written.
 */
function anyOrder(b: GbnfBuilder, prefix: string, names: readonly string[], items: readonly string[], required: ReadonlySet<string>, tail: string): string {
  const requiredMask = names.reduce((m, n, k) => (required.has(n) ? m | (1 << k) : m), 0);
  const rules = new Map<number, string>();
  const state = (done: number): string => {
    const known = rules.get(done);
    if (known !== undefined) return known;
    const name = b.fresh(prefix, `params-set${done}`);
    rules.set(done, name);
    const alts: string[] = [];
    for (let k = 0; k < names.length; k++) if (!(done & (1 << k))) alts.push(`${items[k]} ${state(done | (1 << k))}`);
    if ((done & requiredMask) === requiredMask) alts.push(tail);
    b.define(name, alts.join(" | "));
    return name;
  };
  return state(0);
}

function invalidForQwen(param: string, why: string) {
  return invalidValue(param, `Invalid schema for '${param}': ${why}.`);
}
