/**
 * The output-constraint fields beyond OpenAI's `response_format`, on chat and completions: vLLM's
 * `structured_outputs` object (`json`, `regex`, `choice`, `grammar`, `json_object`), its older top-level forms
 * (`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, accepted as aliases) and llama.cpp's `grammar`
 * (a GBNF string) and `json_schema` (a schema). A request has at most one constraint: two of these (or one with a non-text `response_format`)
 * are a 400 naming the second. Only the shape is checked here; whether a regex or grammar can be applied is
 * guided/output-rule.ts's question (a 400 naming the field there too).
 */
import { z } from "zod";
import { describe, invalidValue } from "../http/errors.js";
import type { ResponseFormat } from "../tools.js";
import { report } from "./request-issues.js";

/** The keys of `structured_outputs` Keel applies (vLLM's others, e.g. `whitespace_pattern`, are refused). */
const STRUCTURED_KEYS = ["json", "regex", "choice", "grammar", "json_object"] as const;

/** vLLM's switches of `structured_outputs` Keel has no use for: accepted at their default (false), else refused. */
const NOOP_SWITCHES = ["disable_fallback", "disable_any_whitespace", "disable_additional_properties"];

/** A constraint read from one field, before the one-constraint rule. */
type Constraint = Exclude<ResponseFormat, { kind: "text" }>;

/** A JSON schema given as an object or as its JSON text (vLLM takes both); `undefined` after reporting a problem. */
function jsonSchemaValue(v: unknown, field: string, ctx: z.RefinementCtx, path: PropertyKey[]): Constraint | undefined {
  let schema = v;
  if (typeof v === "string") {
    try {
      schema = JSON.parse(v);
    } catch {
      report(ctx, "invalid_value", "expected a JSON schema (an object, or its JSON text), but the string is not JSON.", path, v);
      return undefined;
    }
  }
  if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
    report(ctx, "invalid_type", `expected a JSON schema object, but got ${describe(schema)} instead.`, path, v);
    return undefined;
  }
  return { kind: "json_schema", name: "structured_output", schema: schema as Record<string, unknown>, strict: true, field };
}

/** One constraint value of kind `key` at `path` (field name `field`); undefined for null/absent or after a problem. */
function constraintValue(key: (typeof STRUCTURED_KEYS)[number], v: unknown, field: string, ctx: z.RefinementCtx, path: PropertyKey[]): Constraint | undefined {
  if (v === undefined || v === null) return undefined;
  switch (key) {
    case "json":
      return jsonSchemaValue(v, field, ctx, path);
    case "json_object":
      if (typeof v !== "boolean") report(ctx, "invalid_type", `expected a boolean, but got ${describe(v)} instead.`, path, v);
      return v === true ? { kind: "json_object", field } : undefined;
    case "choice":
      if (!Array.isArray(v) || v.length === 0 || !v.every((c) => typeof c === "string")) {
        report(ctx, "invalid_value", `expected a non-empty array of strings, but got ${Array.isArray(v) ? (v.length === 0 ? "an empty array" : "an array holding a non-string") : describe(v)}.`, path, v);
        return undefined;
      }
      return { kind: "choice", choices: v as string[], field };
    case "regex":
    case "grammar":
      if (typeof v !== "string" || v.length === 0) {
        report(ctx, "invalid_value", `expected a non-empty string, but got ${typeof v === "string" ? "an empty string" : describe(v)}.`, path, v);
        return undefined;
      }
      return key === "regex" ? { kind: "regex", pattern: v, field } : { kind: "grammar", grammar: v, field };
  }
}

/** `structured_outputs`: an object with exactly one of {@link STRUCTURED_KEYS} set (vLLM's rule). */
const structuredOutputsSchema = z
  .unknown()
  .optional()
  .transform((v, ctx): Constraint | undefined => {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "object" || Array.isArray(v)) {
      report(ctx, "invalid_type", `expected an object, but got ${describe(v)} instead.`, [], v);
      return undefined;
    }
    const found: Constraint[] = [];
    for (const [key, value] of Object.entries(v as Record<string, unknown>)) {
      if (!(STRUCTURED_KEYS as readonly string[]).includes(key)) {
        if (NOOP_SWITCHES.includes(key) && value === false) continue;
        if (value !== null) report(ctx, "unsupported_field", `Keel applies only ${STRUCTURED_KEYS.map((k) => `'${k}'`).join(", ")} in 'structured_outputs'.`, [key], value);
        continue;
      }
      const c = constraintValue(key as (typeof STRUCTURED_KEYS)[number], value, `structured_outputs.${key}`, ctx, [key]);
      if (c !== undefined) found.push(c);
    }
    if (found.length > 1) {
      report(ctx, "invalid_value", `only one kind of constraint may be set, but ${found.map((c) => `'${c.field!.split(".")[1]}'`).join(" and ")} are.`, [], v);
    }
    return found[0];
  });

/** A top-level alias of one constraint kind (`guided_regex`, llama.cpp's `grammar`, …). */
function aliasSchema(key: (typeof STRUCTURED_KEYS)[number], field: string) {
  return z
    .unknown()
    .optional()
    .transform((v, ctx) => constraintValue(key, v, field, ctx, []));
}

/** zod fields of the constraints beyond `response_format` (snake_case, as in the request body). */
export const structuredOutputFields = {
  structured_outputs: structuredOutputsSchema,
  guided_json: aliasSchema("json", "guided_json"),
  guided_regex: aliasSchema("regex", "guided_regex"),
  guided_choice: aliasSchema("choice", "guided_choice"),
  guided_grammar: aliasSchema("grammar", "guided_grammar"),
  grammar: aliasSchema("grammar", "grammar"),
  json_schema: aliasSchema("json", "json_schema"),
};

/** The parsed constraint fields, plus `response_format`. */
export type ConstraintFieldsBody = { response_format: ResponseFormat } & z.output<z.ZodObject<typeof structuredOutputFields>>;

/**
 * The request's one output constraint (`{kind: "text"}` when none): a non-text `response_format`, or one of the
 * fields above. Two set → 400 naming the second, in field order.
 */
export function outputConstraint(b: ConstraintFieldsBody): ResponseFormat {
  const set: Array<[string, Constraint]> = [];
  if (b.response_format.kind !== "text") set.push(["response_format", b.response_format]);
  for (const key of Object.keys(structuredOutputFields) as (keyof typeof structuredOutputFields)[]) {
    const c = b[key];
    if (c !== undefined) set.push([key, c]);
  }
  if (set.length > 1) {
    const [first, second] = [set[0]![0], set[1]![0]];
    throw invalidValue(second, `Invalid value for '${second}': a request takes one output constraint, but '${first}' and '${second}' are both set.`);
  }
  return set[0]?.[1] ?? { kind: "text" };
}
