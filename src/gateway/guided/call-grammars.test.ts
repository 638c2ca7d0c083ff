/**
 * Call grammars accept the exact call texts the output parsers read, and reject wrong names, missing required
 * parameters, unknown parameters and out-of-schema values.
 */
import { describe, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import type { ToolSpec } from "../tools.js";
import { addCallRules, type CallFormat } from "./call-grammars.js";
import { GbnfGrammar } from "./gbnf-recognizer.js";
import { GbnfBuilder } from "./json-schema-gbnf.js";
import { NO_ARGS, SEARCH, TOOLS, TREE, WEATHER } from "./samples.js";

function grammarFor(format: CallFormat, tools: readonly ToolSpec[] = TOOLS) {
  const b = new GbnfBuilder();
  const rules = addCallRules(b, format, tools, (t) => tools.indexOf(t));
  const g = new GbnfGrammar(b.text());
  return { accepts: (text: string) => g.accepts(rules.call, text), one: (name: string, text: string) => g.accepts(rules.byTool.get(name)!, text) };
}

const hermes = (name: string, args: string) => `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`;
const qwen = (name: string, params: Array<[string, string]>) =>
  `<tool_call>\n<function=${name}>\n${params.map(([p, v]) => `<parameter=${p}>\n${v}\n</parameter>\n`).join("")}</function>\n</tool_call>`;

describe("hermes3", () => {
  const { accepts, one } = grammarFor("hermes3");
  it("accepts the canonical calls", () => {
    expect(accepts(hermes("get_weather", '{"city": "Paris"}'))).toBe(true);
    expect(accepts(hermes("get_weather", '{"city": "Paris", "unit": "c", "days": 14, "detailed": false}'))).toBe(true);
    expect(accepts(hermes("get_time", "{}"))).toBe(true);
    expect(accepts(hermes("search", '{"q": "x", "filters": {"since": "2026-12-01"}, "ids": [1, 2]}'))).toBe(true);
    expect(accepts(hermes("save_tree", '{"root": {"label": "a", "children": [{"label": "b"}]}, "mode": "fast"}'))).toBe(true);
    // Flexible bounded space inside the JSON.
    expect(accepts(`<tool_call>\n{\n  "name":"get_weather",\n  "arguments":{"city":"P"}\n}\n</tool_call>`)).toBe(true);
    expect(one("get_weather", hermes("get_weather", '{"city": "Paris"}'))).toBe(true);
  });
  it("rejects wrong names, missing required, unknown keys, bad values and inexact tags", () => {
    expect(accepts(hermes("get_weathe", '{"city": "Paris"}'))).toBe(false);
    expect(accepts(hermes("get_weather", "{}"))).toBe(false);
    expect(accepts(hermes("get_weather", '{"city": "Paris", "country": "FR"}'))).toBe(false);
    expect(accepts(hermes("get_weather", '{"city": "Paris", "days": 15}'))).toBe(false);
    expect(accepts(hermes("get_weather", '{"city": "Paris", "unit": "k"}'))).toBe(false);
    expect(accepts(hermes("save_tree", '{"root": {"label": "A1"}}'))).toBe(false);
    expect(accepts(hermes("get_time", '{"x": 1}'))).toBe(false);
    expect(accepts(`<tool_call>{"name": "get_time", "arguments": {}}</tool_call>`)).toBe(false);
    expect(one("get_time", hermes("get_weather", '{"city": "Paris"}'))).toBe(false);
  });
});

describe("bare JSON hermes and llama3", () => {
  it("bare hermes object", () => {
    const { accepts } = grammarFor("hermes3-bare");
    expect(accepts('{"name": "get_weather", "arguments": {"city": "Paris"}}')).toBe(true);
    expect(accepts('{"name": "get_weather", "parameters": {"city": "Paris"}}')).toBe(false);
    expect(accepts('{"name": "nope", "arguments": {}}')).toBe(false);
  });
  it("llama3 object", () => {
    const { accepts } = grammarFor("llama3");
    expect(accepts('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}')).toBe(true);
    expect(accepts('{"name": "get_time", "parameters": {}}')).toBe(true);
    expect(accepts('{"name": "get_weather", "arguments": {"city": "Paris"}}')).toBe(false);
    expect(accepts('{"name": "get_weather", "parameters": {"days": 2}}')).toBe(false);
  });
});

describe("qwen3coder", () => {
  const { accepts } = grammarFor("qwen3coder");
  it("accepts the canonical calls, raw string values and Python booleans", () => {
    expect(accepts(qwen("get_weather", [["city", "Paris"]]))).toBe(true);
    expect(accepts(qwen("get_weather", [["city", "New York"], ["unit", "f"], ["days", "3"], ["detailed", "True"]]))).toBe(true);
    expect(accepts(qwen("get_weather", [["city", "Paris"], ["detailed", "false"]]))).toBe(true);
    expect(accepts(qwen("get_time", []))).toBe(true);
    // Raw text: quotes, backslashes, newlines and partial tags are all plain text.
    expect(accepts(qwen("get_weather", [["city", 'a "b" \\ c\nline2 </paramete x\n</param <parameter </functio']]))).toBe(true);
    // `<parameter=` and `</function>` inside a value: the parser would end the value there and read what follows as
    // other parameters (the breaker's `{"city": "<value>Paris</value>", "unit": "<f>"}`), so the grammar refuses them.
    expect(accepts(qwen("get_weather", [["city", "<value>Paris</value>\n<parameter=unit>\n<f>"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "x <parameter=y"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "x</function>"]]))).toBe(false);
    // No `</parameter>` at all: followed by another tag, the parser would end the value there (`a</parameter>\n</function>`).
    expect(accepts(qwen("get_weather", [["city", "line2 </parameter> x"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "a</parameter>\n</function>"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", ""]]))).toBe(true);
    expect(accepts(qwen("search", [["q", "x"], ["filters", '{"lang": "en"}'], ["note", "None"], ["ids", "[1, 2]"], ["extra", "anything at all"]]))).toBe(true);
    expect(accepts(qwen("search", [["q", "x"], ["filters", "{}"], ["note", "a note"]]))).toBe(true);
    expect(accepts(qwen("save_tree", [["root", '{"label": "abc"}'], ["mode", "7"]]))).toBe(true);
  });
  it("constrained raw strings hold no newline, so the terminator cannot hide inside them", () => {
    const t: ToolSpec = { name: "note", parameters: { type: "object", properties: { s: { type: "string", pattern: "^[^x]*$" }, n: { type: "string", maxLength: 30 } } } };
    const g = grammarFor("qwen3coder", [t]);
    expect(g.accepts(qwen("note", [["s", "ab c"], ["n", "short"]]))).toBe(true);
    expect(g.accepts(qwen("note", [["s", "a\n</parameter>b"]]))).toBe(false);
    expect(g.accepts(qwen("note", [["n", "a\nb"]]))).toBe(false);
  });
  it("up to 4 parameters in any order (each once); more in declaration order", () => {
    expect(accepts(qwen("get_weather", [["days", "2"], ["city", "Oslo"], ["detailed", "False"], ["unit", "c"]]))).toBe(true);
    expect(accepts(qwen("get_weather", [["unit", "c"], ["city", "Oslo"]]))).toBe(true);
    expect(accepts(qwen("get_weather", [["unit", "c"], ["days", "2"]]))).toBe(false); // city missing
    expect(accepts(qwen("get_weather", [["unit", "c"], ["city", "Oslo"], ["unit", "f"]]))).toBe(false); // unit twice
    // SEARCH declares 5: declaration order only.
    expect(accepts(qwen("search", [["q", "x"], ["filters", "{}"], ["ids", "[]"]]))).toBe(true);
    expect(accepts(qwen("search", [["filters", "{}"], ["q", "x"]]))).toBe(false);
  });
  it("rejects wrong names, missing or unknown parameters, bad values and a terminator inside a value", () => {
    expect(accepts(qwen("get_weathr", [["city", "Paris"]]))).toBe(false);
    expect(accepts(qwen("get_weather", []))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "Paris"], ["country", "FR"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "Paris"], ["days", "0"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "Paris"], ["unit", "k"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "Paris"], ["detailed", "yes"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "Paris"], ["city", "Rome"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "Pa\n</parameter>ris"]]))).toBe(false);
    expect(accepts(qwen("search", [["q", ""], ["filters", "{}"]]))).toBe(false);
    expect(accepts(qwen("search", [["q", "x"], ["filters", "not json"]]))).toBe(false);
    expect(accepts(qwen("get_time", [["x", "1"]]))).toBe(false);
    expect(accepts(qwen("get_weather", [["city", "Paris"]]).replace("</function>\n</tool_call>", "</function></tool_call>"))).toBe(false);
  });
  it("free-form parameters (no properties / additionalProperties) take any parameter names", () => {
    const free: ToolSpec = { name: "free", parameters: { type: "object" } };
    const typed: ToolSpec = { name: "typed", parameters: { type: "object", properties: { a: { type: "integer" } }, additionalProperties: { type: "boolean" } } };
    const g = grammarFor("qwen3coder", [free, typed]);
    expect(g.accepts(qwen("free", [["anything", "x y"], ["n", "1"]]))).toBe(true);
    expect(g.accepts(qwen("free", []))).toBe(true);
    expect(g.accepts(qwen("typed", [["a", "1"], ["flag", "True"]]))).toBe(true);
    expect(g.accepts(qwen("typed", [["a", "1"], ["flag", "maybe"]]))).toBe(false);
    expect(g.accepts(qwen("typed", [["flag", "true"], ["a", "1"]]))).toBe(false);
  });
  it("a root $ref is followed; a root anyOf is refused for this format", () => {
    const viaRef: ToolSpec = {
      name: "r",
      parameters: { $ref: "#/$defs/Args", $defs: { Args: { type: "object", properties: { p: { $ref: "#/$defs/P" } }, required: ["p"] }, P: { enum: ["x", "y"] } } },
    };
    const g = grammarFor("qwen3coder", [viaRef]);
    expect(g.accepts(qwen("r", [["p", "x"]]))).toBe(true);
    expect(g.accepts(qwen("r", [["p", "z"]]))).toBe(false);
    expect(g.accepts(qwen("r", []))).toBe(false);
    const alt: ToolSpec = { name: "alt", parameters: { anyOf: [{ type: "object", properties: { a: {} } }, { type: "object", properties: { b: {} } }] } };
    expect(() => grammarFor("qwen3coder", [alt])).toThrow(/root 'anyOf'/);
    expect(grammarFor("hermes3", [alt]).accepts(hermes("alt", '{"b": 1}'))).toBe(true);
  });

  it("an enum/const value holding a closing tag of the format is a 400 naming the value; JSON formats carry it", () => {
    const cases: Array<[unknown, string]> = [
      [{ enum: ["ok", "a</parameter>"] }, "#/properties/p/enum/1"],
      [{ const: "x\n</function>" }, "#/properties/p/const"],
      [{ type: "string", enum: ["</tool_call>"] }, "#/properties/p/enum/0"],
      [{ enum: [["a</parameter></function>"]] }, "#/properties/p/enum/0"],
    ];
    for (const [schema, pointer] of cases) {
      const tool: ToolSpec = { name: "t", parameters: { type: "object", properties: { p: schema }, required: ["p"] } };
      let err: unknown;
      try {
        grammarFor("qwen3coder", [tool]);
      } catch (e) {
        err = e;
      }
      expect(err, JSON.stringify(schema)).toBeInstanceOf(KeelHttpError);
      expect((err as KeelHttpError).message).toContain(`'${pointer}'`);
      expect(() => grammarFor("hermes3", [tool])).not.toThrow();
    }
    // Near misses are carried raw.
    const fine: ToolSpec = { name: "t", parameters: { type: "object", properties: { p: { enum: ["</param>", "<parameter=x>"] } }, required: ["p"] } };
    expect(grammarFor("qwen3coder", [fine]).accepts(qwen("t", [["p", "</param>"]]))).toBe(true);
  });
});

it("a bad parameters schema is a 400 naming the tool's index", () => {
  const bad: ToolSpec = { name: "bad", parameters: { type: "object", properties: { p: { type: "string", pattern: "(" } } } };
  for (const format of ["hermes3", "qwen3coder", "llama3"] as const) {
    let err: unknown;
    try {
      grammarFor(format, [NO_ARGS, SEARCH, bad, TREE]);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(KeelHttpError);
    expect((err as KeelHttpError).param).toBe("tools[2].function.parameters");
    expect((err as KeelHttpError).message).toMatch(/#\/properties\/p\/pattern/);
  }
});

describe("one call of any tool", () => {
  // llama.cpp keeps one parse stack per live alternative: a head repeated per tool costs (tools x vocabulary) per
  // masked token, so the shared head is spelled once and only the tool-specific parts alternate.
  it.each(["hermes3", "hermes3-bare", "llama3", "qwen3coder"] as const)("%s: the shared head appears once in the call rule, every tool still parses", (format) => {
    const many: ToolSpec[] = Array.from({ length: 50 }, (_, i) => ({ ...WEATHER, name: `tool_${i}` }));
    const b = new GbnfBuilder();
    const rules = addCallRules(b, format, many, (t) => many.indexOf(t));
    const text = b.text();
    const callLine = text.split("\n").find((l) => l.startsWith(`${rules.call} ::= `))!;
    const head = format === "qwen3coder" || format === "hermes3" ? "<tool_call>" : '\\"name\\"';
    expect(callLine.split(head).length - 1).toBe(1);
    expect(callLine.split(" | ").length).toBe(50);
    const g = new GbnfGrammar(text);
    const call = (name: string): string =>
      format === "qwen3coder" ? qwen(name, [["city", "Paris"]])
        : format === "llama3" ? `{"name": "${name}", "parameters": {"city": "Paris"}}`
          : format === "hermes3" ? hermes(name, '{"city": "Paris"}') : `{"name": "${name}", "arguments": {"city": "Paris"}}`;
    for (const i of [0, 7, 49]) expect(g.accepts(rules.call, call(`tool_${i}`)), `tool_${i}`).toBe(true);
    expect(g.accepts(rules.call, call("tool_50"))).toBe(false);
  });
});
