/**
 * qwen3coder parameter values are guided as the parser will read them back (qwen-values.ts vs
 * parsers/parameter-values.ts): the grammar accepts a text only when the parser turns it into a schema-valid value.
 */
import { describe, expect, it } from "vitest";
import { createOutputParser } from "../parsers/index.js";
import type { ToolSpec } from "../tools.js";
import { addCallRules } from "./call-grammars.js";
import { GbnfGrammar } from "./gbnf-recognizer.js";
import { GbnfBuilder } from "./json-schema-gbnf.js";
import { parserTypes } from "./qwen-values.js";

/** One tool `t` with parameter `p` of schema `p` (required), plus `$defs`. */
function tool(p: unknown, defs: Record<string, unknown> = {}): ToolSpec {
  return { name: "t", parameters: { type: "object", properties: { p }, required: ["p"], $defs: defs } };
}

/** Whether the guide accepts value `v` for `p`, and what the parser reads back from the same text. */
function check(t: ToolSpec, v: string): { accepted: boolean; read: unknown } {
  const b = new GbnfBuilder();
  const call = addCallRules(b, "qwen3coder", [t], () => 0).call;
  const text = `<tool_call>\n<function=t>\n<parameter=p>\n${v}\n</parameter>\n</function>\n</tool_call>`;
  const parser = createOutputParser({ toolParser: "qwen3coder", tools: [t], reasoningParser: null, reasoningOpen: false });
  parser.push(text);
  parser.finish("stop");
  const args = parser.result().toolCalls[0]?.arguments;
  return { accepted: new GbnfGrammar(b.text()).accepts(call, text), read: args === undefined ? undefined : (JSON.parse(args) as { p: unknown }).p };
}

describe("qwen3coder values as the parser reads them", () => {
  it("parserTypes reads type and anyOf/oneOf branches, not $ref", () => {
    expect([...parserTypes({ type: ["string", "null"] })]).toEqual(["string", "null"]);
    expect([...parserTypes({ anyOf: [{ type: "integer" }, { oneOf: [{ type: "string" }] }] })]).toEqual(["integer", "string"]);
    expect(parserTypes({ $ref: "#/$defs/S" }).size).toBe(0);
  });

  it("string or null, maxLength 3: `None` is read as a 4-character string, so only `null` writes null", () => {
    const t = tool({ type: ["string", "boolean", "null"], maxLength: 3 });
    expect(check(t, "None")).toEqual({ accepted: false, read: "None" });
    expect(check(t, "null")).toEqual({ accepted: true, read: null });
    expect(check(t, "abc")).toEqual({ accepted: true, read: "abc" });
    // A boolean would be read back as the string "true" (4 characters, too long): only strings are written.
    expect(check(t, "true")).toEqual({ accepted: false, read: "true" });
    expect(check(t, "False")).toEqual({ accepted: false, read: "False" });
  });

  it("a number or a string: only strings are written (the parser reads any text as the string)", () => {
    const t = tool({ type: ["number", "string"], minLength: 2 });
    expect(check(t, "61")).toEqual({ accepted: true, read: "61" });
    expect(check(t, "6")).toEqual({ accepted: false, read: "6" });
  });

  it("a $ref to a string schema: written as JSON, since raw `61` would be read as the number 61", () => {
    const t = tool({ $ref: "#/$defs/S" }, { S: { type: "string", pattern: "^[0-9]+$" } });
    expect(check(t, "61")).toEqual({ accepted: false, read: 61 });
    expect(check(t, '"61"')).toEqual({ accepted: true, read: "61" });
  });

  it("an untyped enum of words stays raw (the parser keeps non-JSON text as the string); one of JSON-looking strings is quoted", () => {
    expect(check(tool({ enum: ["fast", "slow"] }), "fast")).toEqual({ accepted: true, read: "fast" });
    const t = tool({ enum: ["1", "true"] });
    expect(check(t, "1")).toEqual({ accepted: false, read: 1 });
    expect(check(t, '"1"')).toEqual({ accepted: true, read: "1" });
  });

  it("types that exclude strings next to a string branch: refused (nothing can be written unambiguously)", () => {
    expect(() => check(tool({ type: "integer", anyOf: [{ type: "string" }, { type: "integer" }] }), "1")).toThrow(/mixes a string type/);
  });
});
