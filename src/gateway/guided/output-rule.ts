/**
 * The grammar rule of a request's output constraint (everything but tools): JSON (any object, or a schema's values),
 * the full match of a regex, one of a list of strings, or a client's GBNF grammar. Each is one forced rule
 * (guide.ts: after any reasoning, then end of generation). Limits are those of schemas: a `choice` list counts as
 * enum values (at most 1000 strings, 15000 characters in all), a regex as a schema `pattern` (gbnf-limits.ts), a
 * grammar as user-grammar.ts says; every rule passes the builder's size limit.
 */
import { invalidValue } from "../http/errors.js";
import type { ResponseFormat } from "../tools.js";
import { bodyProblem } from "./gbnf-limits.js";
import { literal } from "./gbnf-text.js";
import type { GbnfBuilder } from "./json-schema-gbnf.js";
import { PatternError, regexToGbnf } from "./pattern-gbnf.js";
import { MAX_ENUM_CHARS, MAX_ENUM_VALUES } from "./schema-limits.js";
import { addUserGrammar } from "./user-grammar.js";

/** The request field a JSON constraint's schema is blamed on (`response_format` unless it came from elsewhere). */
export function schemaParam(rf: Extract<ResponseFormat, { kind: "json_schema" }>): string {
  return rf.field ?? "response_format.json_schema.schema";
}

/** The request field an output constraint came from, for the 400s about it. */
export function constraintField(rf: Exclude<ResponseFormat, { kind: "text" }>): string {
  return rf.field ?? "response_format";
}

/** Adds the rules of constraint `rf` to `b`; returns the name of the rule the whole output must match. */
export function addOutputRule(b: GbnfBuilder, rf: Exclude<ResponseFormat, { kind: "text" }>): string {
  // The builder's size 400 names the field the constraint came from.
  b.lastParam = rf.kind === "json_schema" ? schemaParam(rf) : constraintField(rf);
  switch (rf.kind) {
    case "json_object":
      return b.define("rf-body", b.primitive("json-object"));
    case "json_schema":
      return b.define("rf-body", b.addSchema(rf.schema, "rf", schemaParam(rf)));
    case "regex":
      return b.define("rf-body", regexRule(rf.pattern, rf.field));
    case "choice":
      return b.define("rf-body", choiceRule(rf.choices, rf.field));
    case "grammar":
      return addUserGrammar(b, rf.grammar, rf.field);
  }
}

/** The rule body of a full match of `pattern`; a 400 naming `field` for a pattern that cannot be a grammar. */
function regexRule(pattern: string, field: string): string {
  let body: string;
  try {
    body = regexToGbnf(pattern);
  } catch (e) {
    if (e instanceof PatternError) throw invalidValue(field, `Invalid value for '${field}': ${e.message}.`);
    if (e instanceof RangeError) throw invalidValue(field, `Invalid value for '${field}': the regular expression is too deeply nested.`);
    throw e;
  }
  const problem = bodyProblem(body);
  if (problem !== null) throw invalidValue(field, `Invalid value for '${field}': ${problem}; simplify the regular expression.`);
  return body;
}

/** The rule body matching exactly one of `choices` (an alternation of literals), within the enum limits. */
function choiceRule(choices: readonly string[], field: string): string {
  if (choices.length > MAX_ENUM_VALUES) {
    throw invalidValue(field, `Invalid value for '${field}': more than ${MAX_ENUM_VALUES} choices (limit ${MAX_ENUM_VALUES}).`);
  }
  const chars = choices.reduce((n, c) => n + c.length, 0);
  if (chars > MAX_ENUM_CHARS) {
    throw invalidValue(field, `Invalid value for '${field}': the choices total more than ${MAX_ENUM_CHARS} characters (limit ${MAX_ENUM_CHARS}).`);
  }
  return `(${[...new Set(choices)].map(literal).join(" | ")})`;
}
