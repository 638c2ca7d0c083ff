/**
 * Hostile schemas (issue #9 breaker findings) are 400s naming the limit and the JSON pointer, before anything
 * recursive runs: huge enums, too many properties, deep nesting (also inside `default`), long tuples.
 */
import { describe, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import { buildGuide } from "./guide.js";
import { MAX_GBNF_CHARS, schemaToGbnf } from "./json-schema-gbnf.js";
import { checkSchemaLimits, newTotals, MAX_ENUM_CHARS, MAX_ENUM_VALUES, MAX_JSON_DEPTH, MAX_PREFIX_ITEMS, MAX_PROPERTIES } from "./schema-limits.js";
import type { GuideRequest } from "./types.js";

/** A request guiding `response_format` with `schema`. */
function rfRequest(schema: Record<string, unknown>): GuideRequest {
  return {
    toolParser: "hermes3",
    tools: [],
    toolChoice: { kind: "auto" },
    parallelToolCalls: true,
    responseFormat: { kind: "json_schema", name: "s", schema, strict: true },
    guideAuto: true,
    reasoning: null,
  };
}

/** The 400 that building a guide for `req` throws. */
function refusal(req: GuideRequest): KeelHttpError {
  let err: unknown;
  try {
    buildGuide(req);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(KeelHttpError);
  expect((err as KeelHttpError).status).toBe(400);
  return err as KeelHttpError;
}

const enumOf = (n: number, width = 1) => ({ enum: Array.from({ length: n }, (_, i) => `v${i}`.padEnd(width, "x")) });
const propsOf = (n: number) => ({ type: "object", properties: Object.fromEntries(Array.from({ length: n }, (_, i) => [`p${i}`, { type: "integer" }])), required: Array.from({ length: n }, (_, i) => `p${i}`) });

describe("schema size limits", () => {
  it("enum values: the limit passes, one more is refused naming the limit and the pointer", () => {
    expect(() => schemaToGbnf(enumOf(MAX_ENUM_VALUES), { param: "p" })).not.toThrow();
    const err = refusal(rfRequest({ type: "object", properties: { a: enumOf(MAX_ENUM_VALUES + 1) } }));
    expect(err.message).toMatch(new RegExp(`limit ${MAX_ENUM_VALUES}`));
    expect(err.message).toContain("'#/properties/a'");
    expect(err.param).toBe("response_format.json_schema.schema");
  });

  it("enum values are counted over all tools of a request", () => {
    const half = Math.ceil((MAX_ENUM_VALUES + 1) / 2);
    const tool = (name: string) => ({ name, parameters: { type: "object", properties: { a: enumOf(half) } } });
    const err = refusal({ ...rfRequest({}), responseFormat: { kind: "text" }, toolChoice: { kind: "required" }, tools: [tool("f"), tool("g")] });
    expect(err.param).toBe("tools[1].function.parameters");
  });

  it("enum/const string characters are capped", () => {
    expect(() => schemaToGbnf(enumOf(100, MAX_ENUM_CHARS / 100), { param: "p" })).not.toThrow();
    expect(refusal(rfRequest(enumOf(100, MAX_ENUM_CHARS / 100 + 1))).message).toMatch(/limit 15000/);
    expect(refusal(rfRequest({ const: "x".repeat(MAX_ENUM_CHARS + 1) })).message).toMatch(/characters/);
  });

  it("properties: the limit passes the limits, one more is refused", () => {
    expect(() => checkSchemaLimits(propsOf(MAX_PROPERTIES), "p", newTotals())).not.toThrow();
    const err = refusal(rfRequest(propsOf(MAX_PROPERTIES + 1)));
    expect(err.message).toMatch(/limit 5000/);
    expect(err.message).toContain("'#/properties'");
  });

  it("deep schemas and deep values (even in `default`) are a 400, never a stack overflow", () => {
    let deepObj: Record<string, unknown> = { type: "integer" };
    for (let i = 0; i < 5000; i++) deepObj = { type: "object", properties: { a: deepObj } };
    expect(refusal(rfRequest(deepObj)).message).toMatch(new RegExp(`limit ${MAX_JSON_DEPTH}`));
    let deepAny: Record<string, unknown> = { type: "integer" };
    for (let i = 0; i < 100_000; i++) deepAny = { anyOf: [deepAny] };
    expect(refusal(rfRequest(deepAny)).message).toMatch(/deeper than/);
    let deepJson: unknown = [];
    for (let i = 0; i < 100_000; i++) deepJson = [deepJson];
    expect(refusal(rfRequest({ type: "array", default: deepJson })).message).toMatch(/deeper than/);
    // Unguided tools (auto without guidance) get the same 400.
    const unguided = { ...rfRequest({}), responseFormat: { kind: "text" as const }, guideAuto: false, tools: [{ name: "f", parameters: { type: "object", default: deepJson } }] };
    expect(refusal(unguided).param).toBe("tools[0].function.parameters");
  });

  it("tuples: the limit passes, one more is refused", () => {
    const tuple = (n: number) => ({ type: "array", prefixItems: Array.from({ length: n }, () => ({ type: "integer" })) });
    expect(() => schemaToGbnf(tuple(MAX_PREFIX_ITEMS), { param: "p" })).not.toThrow();
    expect(refusal(rfRequest(tuple(MAX_PREFIX_ITEMS + 1))).message).toContain("'#/prefixItems'");
  });

  it("the emitted grammar is capped per request; 50 tools of 5 parameters stay far below the cap", () => {
    const tools = (n: number) =>
      Array.from({ length: n }, (_, i) => ({
        name: `tool_${i}`,
        parameters: {
          type: "object",
          properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] }, days: { type: "integer", minimum: 1, maximum: 14 }, detailed: { type: "boolean" }, note: { type: "string", maxLength: 40 } },
          required: ["city"],
        },
      }));
    const req = (n: number): GuideRequest => ({ ...rfRequest({}), responseFormat: { kind: "text" }, toolChoice: { kind: "required" }, tools: tools(n) });
    for (const toolParser of ["hermes3", "qwen3coder", "llama3"] as const) {
      expect(buildGuide({ ...req(50), toolParser })!.grammar.length).toBeLessThan(MAX_GBNF_CHARS / 3);
    }
    // Many tools within every schema limit still hit the grammar cap: a 400 naming it.
    expect(refusal(req(400)).message).toMatch(new RegExp(`limit ${MAX_GBNF_CHARS}`));
  });

  it("a long chain of $refs (shallow JSON, deep walk) is a 400, never a stack overflow", () => {
    const n = 20_000;
    const defs = Object.fromEntries(Array.from({ length: n }, (_, i) => [`d${i}`, i + 1 < n ? { anyOf: [{ $ref: `#/$defs/d${i + 1}` }] } : { type: "integer" }]));
    const err = refusal(rfRequest({ $ref: "#/$defs/d0", $defs: defs }));
    expect(err.message).toMatch(/too complex|deeper than 64/);
  });
});

