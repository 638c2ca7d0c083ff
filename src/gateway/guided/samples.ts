/**
 * TEST SUPPORT ONLY: sample tools and schemas shared by the guided-generation tests (recogniser tests and the
 * llama.cpp parser test), so every grammar shape we emit is checked by both.
 */
import type { ToolSpec } from "../tools.js";

export const WEATHER: ToolSpec = {
  name: "get_weather",
  description: "Weather for a city",
  parameters: {
    type: "object",
    properties: {
      city: { type: "string", description: "City name" },
      unit: { type: "string", enum: ["c", "f"] },
      days: { type: "integer", minimum: 1, maximum: 14 },
      detailed: { type: "boolean" },
    },
    required: ["city"],
  },
};

export const NO_ARGS: ToolSpec = { name: "get_time" };

export const SEARCH: ToolSpec = {
  name: "search",
  parameters: {
    type: "object",
    properties: {
      q: { type: "string", minLength: 1 },
      filters: { type: "object", properties: { lang: { type: "string" }, since: { type: "string", format: "date" } } },
      note: { type: ["string", "null"] },
      ids: { type: "array", items: { type: "integer" }, maxItems: 3 },
      extra: {},
    },
    required: ["q", "filters"],
    additionalProperties: false,
  },
};

export const TREE: ToolSpec = {
  name: "save_tree",
  parameters: {
    type: "object",
    $defs: {
      node: {
        type: "object",
        properties: { label: { type: "string", pattern: "^[a-z]{1,8}$" }, children: { type: "array", items: { $ref: "#/$defs/node" } } },
        required: ["label"],
      },
    },
    properties: { root: { $ref: "#/$defs/node" }, mode: { anyOf: [{ const: "fast" }, { type: "integer", exclusiveMinimum: 0 }] } },
    required: ["root"],
  },
};

/** Free-form arguments, reached through a root `$ref`. */
export const LOG: ToolSpec = {
  name: "log_event",
  parameters: { $ref: "#/$defs/Event", $defs: { Event: { type: "object", properties: { level: { enum: ["info", "warn"] } }, additionalProperties: true } } },
};

export const TOOLS: readonly ToolSpec[] = [WEATHER, NO_ARGS, SEARCH, TREE, LOG];

/** Schemas for structured output (and the llama.cpp parser test). */
export const SCHEMAS: readonly unknown[] = [
  {},
  true,
  { type: "object" },
  { type: "object", properties: { a: { type: "integer", minimum: -40, maximum: 1200 }, ab: {} }, additionalProperties: { type: "number" } },
  { type: "array", prefixItems: [{ type: "string", format: "uuid" }, { type: "string", format: "date-time" }], items: false, minItems: 1 },
  { type: "array", items: { type: "string", format: "email" }, minItems: 1, maxItems: 5 },
  { enum: ["x", 1, null, { a: [true] }] },
  { type: "string", pattern: '^(\\w+|"[^"]*")\\.\\d{2,3}$' },
  { type: "string", pattern: "a.c" },
  { type: "string", minLength: 2, maxLength: 10 },
  { type: "object", properties: { d: { type: "string", format: "date" }, t: { type: "string", format: "time" }, u: { type: "string", format: "uri" } }, required: ["d", "t", "u"] },
  { type: "number", minimum: -1.25, exclusiveMaximum: 300.5 },
  { type: "object", properties: { t: { type: "number", minimum: 0, maximum: 1 }, p: { type: "number", exclusiveMinimum: 0 } } },
  { type: ["integer", "null"], exclusiveMaximum: 100 },
  { allOf: [{ type: "object", properties: { a: { type: "string", format: "time" } } }, { properties: { b: { type: "string", format: "uri" } } }] },
  { oneOf: [{ type: "boolean" }, { type: "array", items: { $ref: "#" } }] },
  ...TOOLS.filter((t) => t.parameters).map((t) => t.parameters),
];

/** Arguments declared as `{}`: any object (the grammar must still write an object, never a bare value). */
export const ANY_ARGS: ToolSpec = { name: "note", description: "Take a note", parameters: {} };

/** A root `enum` of argument objects (and one non-object the arguments can never be). */
export const ROOT_ENUM: ToolSpec = { name: "set_mode", parameters: { enum: [{ mode: "fast" }, { mode: "slow", level: 2 }, 3] } };

/** A root `anyOf` with an object branch and a branch that is no object. */
export const ROOT_ANYOF: ToolSpec = {
  name: "lookup",
  parameters: { anyOf: [{ type: "object", properties: { id: { type: "integer", minimum: 1 } }, required: ["id"], additionalProperties: false }, { type: "string" }] },
};

/** Tools whose root schema is not a plain object schema (qwen3coder refuses the enum and anyOf roots: one parameter list). */
export const EDGE_TOOLS: readonly ToolSpec[] = [ANY_ARGS, ROOT_ENUM, ROOT_ANYOF];
