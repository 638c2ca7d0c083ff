/**
 * Size limits on the schemas of one request, checked ITERATIVELY over the raw JSON value before any recursive walk
 * (the converter, `JSON.stringify` of the cache key), so a hostile schema is a 400 naming the limit and the JSON
 * pointer instead of a stack overflow or an engine step that takes seconds.
 *
 * Why these numbers: llama.cpp's per-step grammar cost grows with the number of alternatives a grammar keeps alive
 * (issue #9: 100000 enum values made each step take >30 s; 12000 delayed a bystander by 19 s on the real model), so
 * the totals follow OpenAI's structured-output limits: at most 1000 enum values and 15000 characters of enum/const
 * strings per request, at most 5000 properties per request. The JSON nesting bound is twice the schema depth (a
 * schema level is usually two JSON levels: `properties` → name) plus room for annotations. A tuple's `prefixItems`
 * are capped at 100 positions (each is one rule; llama.cpp refused 1000 of them in the nested form).
 */
import { invalidValue, type KeelHttpError } from "../http/errors.js";

/** Deepest nesting of the raw JSON value of one schema (objects and arrays, `default`s and examples included). */
export const MAX_JSON_DEPTH = 160;
/** Most enum values (const counts one) over all schemas of a request. */
export const MAX_ENUM_VALUES = 1000;
/** Most characters of enum/const string values over all schemas of a request. */
export const MAX_ENUM_CHARS = 15000;
/** Most declared properties over all schemas of a request. */
export const MAX_PROPERTIES = 5000;
/** Most `prefixItems` (or tuple `items`) of one array schema. */
export const MAX_PREFIX_ITEMS = 100;

/** Running totals over the schemas of one request. */
export interface SchemaTotals {
  /** Enum values seen so far (a const counts one). */
  enumValues: number;
  /** Characters of enum/const string values seen so far. */
  enumChars: number;
  /** Declared properties seen so far. */
  properties: number;
}

/** Fresh totals for one request. */
export function newTotals(): SchemaTotals {
  return { enumValues: 0, enumChars: 0, properties: 0 };
}

/** Characters of the strings among enum/const values (top level of each value). */
function stringChars(values: readonly unknown[]): number {
  let n = 0;
  for (const v of values) if (typeof v === "string") n += v.length;
  return n;
}

/**
 * Checks the raw schema value `schema` of request field `param` against the limits, adding to `totals`. Keys are
 * read where they sit in the JSON value (an `enum` inside a `default` counts too: conservative, never recursive).
 * Throws the 400 (`invalid_value`, `param`, message naming the limit and the pointer).
 */
export function checkSchemaLimits(schema: unknown, param: string, totals: SchemaTotals): void {
  const fail = (ptr: string, what: string): KeelHttpError =>
    invalidValue(param, `Invalid schema for '${param}' at '${ptr}': ${what}; simplify the schema.`);
  if (typeof schema !== "object" || schema === null) return; // `true`/`false`: nothing to count
  const stack: Array<{ value: unknown; ptr: string; depth: number }> = [{ value: schema, ptr: "#", depth: 0 }];
  while (stack.length > 0) {
    // 1. Next container (scalars are never pushed).
    const { value, ptr, depth } = stack.pop()!;
    if (depth > MAX_JSON_DEPTH) throw fail(ptr, `the schema nests deeper than ${MAX_JSON_DEPTH} JSON levels (limit ${MAX_JSON_DEPTH})`);
    if (Array.isArray(value)) {
      for (let i = value.length - 1; i >= 0; i--) {
        const v = value[i];
        if (typeof v === "object" && v !== null) stack.push({ value: v, ptr: `${ptr}/${i}`, depth: depth + 1 });
      }
      continue;
    }
    const obj = value as Record<string, unknown>;
    // 2. The limits this object's keywords count towards.
    if (Array.isArray(obj.enum)) {
      totals.enumValues += obj.enum.length;
      totals.enumChars += stringChars(obj.enum);
    }
    if ("const" in obj) {
      totals.enumValues += 1;
      totals.enumChars += stringChars([obj.const]);
    }
    if (totals.enumValues > MAX_ENUM_VALUES) throw fail(ptr, `more than ${MAX_ENUM_VALUES} enum/const values in the request (limit ${MAX_ENUM_VALUES})`);
    if (totals.enumChars > MAX_ENUM_CHARS) {
      throw fail(ptr, `enum/const strings total more than ${MAX_ENUM_CHARS} characters in the request (limit ${MAX_ENUM_CHARS})`);
    }
    if (typeof obj.properties === "object" && obj.properties !== null && !Array.isArray(obj.properties)) {
      totals.properties += Object.keys(obj.properties).length;
      if (totals.properties > MAX_PROPERTIES) throw fail(`${ptr}/properties`, `more than ${MAX_PROPERTIES} properties in the request (limit ${MAX_PROPERTIES})`);
    }
    for (const k of ["prefixItems", "items"]) {
      const p = obj[k];
      if (Array.isArray(p) && p.length > MAX_PREFIX_ITEMS) throw fail(`${ptr}/${k}`, `more than ${MAX_PREFIX_ITEMS} tuple items (limit ${MAX_PREFIX_ITEMS})`);
    }
    // 3. Children, in order.
    const keys = Object.keys(obj);
    for (let i = keys.length - 1; i >= 0; i--) {
      const v = obj[keys[i]!];
      if (typeof v === "object" && v !== null) {
        stack.push({ value: v, ptr: `${ptr}/${keys[i]!.replace(/~/g, "~0").replace(/\//g, "~1")}`, depth: depth + 1 });
      }
    }
  }
}
