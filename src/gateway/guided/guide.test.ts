/**
 * buildGuide: which phases, rules and triggers each request shape gets, that the named rules accept the texts the
 * engine will feed them, and the 400s.
 */
import { describe, expect, it } from "vitest";
import type { GuidePhase, GuideSpec } from "../../protocol/messages.js";
import { KeelHttpError } from "../http/errors.js";
import type { ToolSpec } from "../tools.js";
import { GbnfGrammar } from "./gbnf-recognizer.js";
import { buildGuide } from "./guide.js";
import { NO_ARGS, TOOLS, WEATHER } from "./samples.js";
import type { GuideRequest } from "./types.js";

const base: GuideRequest = {
  toolParser: "hermes3",
  tools: TOOLS,
  toolChoice: { kind: "auto" },
  parallelToolCalls: true,
  responseFormat: { kind: "text" },
  guideAuto: true,
  reasoning: null,
};

function guide(over: Partial<GuideRequest>): GuideSpec {
  const g = buildGuide({ ...base, ...over });
  expect(g).not.toBeNull();
  return g!;
}

function ruleOf(p: GuidePhase | undefined): string {
  if (p?.kind !== "rule") throw new Error(`not a rule phase: ${JSON.stringify(p)}`);
  return p.rule;
}

function refused(over: Partial<GuideRequest>, param: string, words: RegExp) {
  let err: unknown;
  try {
    buildGuide({ ...base, ...over });
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(KeelHttpError);
  expect((err as KeelHttpError).status).toBe(400);
  expect((err as KeelHttpError).param).toBe(param);
  expect((err as KeelHttpError).message).toMatch(words);
}

const hermesCall = (name: string, args: string) => `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`;

describe("no guide", () => {
  it("tool_choice none, tools without parameters, auto without guidance, nothing asked", () => {
    expect(buildGuide({ ...base, toolChoice: { kind: "none" } })).toBeNull();
    expect(buildGuide({ ...base, tools: [NO_ARGS], toolChoice: { kind: "required" } })).toBeNull();
    expect(buildGuide({ ...base, guideAuto: false })).toBeNull();
    expect(buildGuide({ ...base, toolParser: null })).toBeNull();
    expect(buildGuide({ ...base, tools: [] })).toBeNull();
  });
});

describe("structured output", () => {
  it("json_object: one rule for the whole output, then end", () => {
    const g = guide({ tools: [], responseFormat: { kind: "json_object" } });
    expect(g.start).toEqual({ kind: "rule", rule: ruleOf(g.start), then: "end" });
    const r = new GbnfGrammar(g.grammar);
    expect(r.accepts(ruleOf(g.start), '{"a": [1, {"b": null}]}')).toBe(true);
    expect(r.accepts(ruleOf(g.start), "[1]")).toBe(false);
    expect(r.accepts(ruleOf(g.start), "Sure! {}")).toBe(false);
    expect(g.triggers).toBeUndefined();
  });

  it("json_schema with reasoning: a gate admits <think> or the body; reasoning then hands over to the body", () => {
    const schema = { type: "object", properties: { n: { type: "integer", minimum: 1, maximum: 3 } }, required: ["n"] };
    const g = guide({ tools: [], responseFormat: { kind: "json_schema", name: "x", schema, strict: true }, reasoning: { parser: "qwen3", open: false } });
    const r = new GbnfGrammar(g.grammar);
    const gate = ruleOf(g.start);
    expect(r.accepts(gate, "<think>")).toBe(true);
    expect(r.accepts(gate, '{"n": 2}')).toBe(true);
    expect(r.accepts(gate, '{"n": 4}')).toBe(false);
    expect(g.reasoning).toMatchObject({ open: "<think>", close: "</think>" });
    expect(r.accepts(ruleOf(g.reasoning!.after), '{"n": 3}')).toBe(true);
    expect(r.accepts(ruleOf(g.reasoning!.after), "<think>")).toBe(false);
    expect(g.specialTokens).toEqual(expect.arrayContaining(["<think>", "</think>"]));
    // Prompt already inside reasoning: start there.
    const open = guide({ tools: [], responseFormat: { kind: "json_schema", name: "x", schema, strict: true }, reasoning: { parser: "qwen3", open: true } });
    expect(open.start).toEqual({ kind: "reasoning" });
    expect(new GbnfGrammar(open.grammar).accepts(ruleOf(open.reasoning!.after), '{"n": 1}')).toBe(true);
  });

  it("a bad response schema is a 400 on response_format.json_schema.schema", () => {
    refused(
      { tools: [], responseFormat: { kind: "json_schema", name: "x", schema: { $ref: "#" }, strict: false } },
      "response_format.json_schema.schema",
      /refers back to itself/,
    );
  });

  it("response_format with active tools is refused", () => {
    refused({ responseFormat: { kind: "json_object" }, toolChoice: { kind: "required" } }, "response_format", /tool_choice is 'none'/);
    refused({ responseFormat: { kind: "json_object" } }, "response_format", /cannot be combined/);
    expect(buildGuide({ ...base, responseFormat: { kind: "json_object" }, toolChoice: { kind: "none" } })).not.toBeNull();
  });
});

describe("forced calls", () => {
  it("required (hermes3): one or more calls over all tools, then end", () => {
    const g = guide({ toolChoice: { kind: "required" } });
    const r = new GbnfGrammar(g.grammar);
    const rule = ruleOf(g.start);
    expect(g.start).toMatchObject({ then: "end" });
    const one = hermesCall("get_weather", '{"city": "Oslo"}');
    const two = `${one}\n${hermesCall("get_time", "{}")}`;
    expect(r.accepts(rule, one)).toBe(true);
    expect(r.accepts(rule, `\n\n${two}`)).toBe(true);
    expect(r.accepts(rule, "")).toBe(false);
    expect(r.accepts(rule, `I will call: ${one}`)).toBe(false);
    expect(g.specialTokens).toEqual(["<tool_call>", "</tool_call>"]);
    // parallel_tool_calls false: exactly one call.
    const single = guide({ toolChoice: { kind: "required" }, parallelToolCalls: false });
    const rs = new GbnfGrammar(single.grammar);
    expect(rs.accepts(ruleOf(single.start), one)).toBe(true);
    expect(rs.accepts(ruleOf(single.start), two)).toBe(false);
  });

  it("named function: only that tool, exactly once, in each format", () => {
    const named = { kind: "function", name: "get_weather" } as const;
    const h = guide({ toolChoice: named });
    const hr = new GbnfGrammar(h.grammar);
    expect(hr.accepts(ruleOf(h.start), hermesCall("get_weather", '{"city": "Oslo"}'))).toBe(true);
    expect(hr.accepts(ruleOf(h.start), hermesCall("get_time", "{}"))).toBe(false);
    const twice = `${hermesCall("get_weather", '{"city": "Oslo"}')}\n${hermesCall("get_weather", '{"city": "Rome"}')}`;
    expect(hr.accepts(ruleOf(h.start), twice)).toBe(false);
    const q = guide({ toolChoice: named, toolParser: "qwen3coder" });
    const qr = new GbnfGrammar(q.grammar);
    expect(qr.accepts(ruleOf(q.start), "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>")).toBe(true);
    expect(qr.accepts(ruleOf(q.start), "<tool_call>\n<function=get_time>\n</function>\n</tool_call>")).toBe(false);
    const l = guide({ toolChoice: named, toolParser: "llama3" });
    const lr = new GbnfGrammar(l.grammar);
    expect(lr.accepts(ruleOf(l.start), '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}')).toBe(true);
    expect(lr.accepts(ruleOf(l.start), '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_weather", "parameters": {"city": "Rome"}}')).toBe(false);
    expect(lr.accepts(ruleOf(l.start), '{"name": "get_time", "parameters": {}}')).toBe(false);
    expect(l.specialTokens).toEqual(["<|python_tag|>"]);
  });

  it("required after reasoning: the gate, then the calls", () => {
    const g = guide({ toolChoice: { kind: "required" }, toolParser: "qwen3coder", reasoning: { parser: "qwen3", open: false } });
    const r = new GbnfGrammar(g.grammar);
    expect(r.accepts(ruleOf(g.start), "<think>")).toBe(true);
    const call = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
    expect(r.accepts(ruleOf(g.start), call)).toBe(true);
    expect(r.accepts(ruleOf(g.reasoning!.after), `\n\n${call}`)).toBe(true);
    expect(g.specialTokens).toEqual(["<tool_call>", "</tool_call>", "<think>", "</think>"]);
  });

  it("400s: named tool missing, no tool parser, bad parameters", () => {
    refused({ toolChoice: { kind: "function", name: "nope" } }, "tool_choice", /no tool named 'nope'/);
    refused({ tools: [NO_ARGS], toolChoice: { kind: "function", name: "nope" } }, "tool_choice", /no tool named 'nope'/);
    refused({ toolChoice: { kind: "required" }, toolParser: null }, "tool_choice", /--tool_parser/);
    const notObject = { name: "x", parameters: "object" } as unknown as ToolSpec;
    refused({ tools: [WEATHER, notObject], toolChoice: { kind: "required" } }, "tools[1].function.parameters", /JSON schema of type .object./);
    const recursive: ToolSpec = { name: "r", parameters: { $defs: { a: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" } };
    refused({ tools: [recursive], toolChoice: { kind: "required" } }, "tools[0].function.parameters", /refers back to itself/);
    refused({ tools: [WEATHER, NO_ARGS, { ...WEATHER, parameters: {} }], toolChoice: { kind: "required" } }, "tools[2].function.name", /already the name of tools\[0\]/);
  });
});

describe("unguided auto still refuses invalid schemas (recipe M2)", () => {
  const unguided = { guideAuto: false } as const;
  it("invalid schemas → 400; valid ones with keywords a grammar cannot honour pass", () => {
    const badRegex: ToolSpec = { name: "r", parameters: { type: "object", properties: { p: { type: "string", pattern: "[" } } } };
    refused({ ...unguided, tools: [WEATHER, badRegex] }, "tools[1].function.parameters", /invalid regular expression/);
    const cycle: ToolSpec = { name: "c", parameters: { type: "object", properties: { p: { $ref: "#/properties/p" } } } };
    refused({ ...unguided, tools: [cycle] }, "tools[0].function.parameters", /refers back to itself/);
    const notObject = { name: "s", parameters: { type: "string" } } as ToolSpec;
    refused({ ...unguided, tools: [notObject] }, "tools[0].function.parameters", /type 'object'/);
    const multipleOf: ToolSpec = { name: "m", parameters: { type: "object", properties: { n: { type: "integer", multipleOf: 5 } } } };
    expect(buildGuide({ ...base, ...unguided, tools: [multipleOf] })).toBeNull();
    // …but guiding it is refused, naming the keyword.
    refused({ tools: [multipleOf], toolChoice: { kind: "required" } }, "tools[0].function.parameters", /'multipleOf'/);
  });
});

describe("auto with guidance: triggers", () => {
  it("hermes3: <tool_call> and an atStart bare JSON call", () => {
    const g = guide({});
    expect(g.start).toEqual({ kind: "free" });
    const r = new GbnfGrammar(g.grammar);
    const [tag, bare] = g.triggers!;
    expect(tag).toMatchObject({ text: "<tool_call>", then: "free" });
    expect(tag!.atStart).toBeUndefined();
    expect(r.accepts(tag!.rule, hermesCall("get_weather", '{"city": "Oslo"}'))).toBe(true);
    // A bare call is the whole answer (what the hermes3 parser takes): only end-of-generation after it.
    expect(bare).toMatchObject({ text: "{", atStart: true, then: "end" });
    expect(r.accepts(bare!.rule, '{"name": "get_weather", "arguments": {"city": "Oslo"}}')).toBe(true);
    expect(r.accepts(bare!.rule, '{"answer": 42}')).toBe(false);
    expect(guide({ parallelToolCalls: false }).triggers!.every((t) => t.then === "end")).toBe(true);
  });

  it("qwen3coder: <tool_call> and <function=NAME> per tool, never a bare <function=", () => {
    const g = guide({ toolParser: "qwen3coder", reasoning: { parser: "qwen3", open: true } });
    expect(g.start).toEqual({ kind: "reasoning" });
    expect(g.reasoning!.after).toEqual({ kind: "free" });
    const texts = g.triggers!.map((t) => t.text);
    expect(texts).toEqual(["<tool_call>", ...TOOLS.map((t) => `<function=${t.name}>`)]);
    const r = new GbnfGrammar(g.grammar);
    const fn = g.triggers!.find((t) => t.text === "<function=get_weather>")!;
    expect(r.accepts(fn.rule, "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>")).toBe(true);
    expect(r.accepts(fn.rule, "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>")).toBe(true);
    expect(r.accepts(fn.rule, "<function=get_time>\n</function>")).toBe(false);
  });

  it("llama3: <|python_tag|> and an atStart {", () => {
    const g = guide({ toolParser: "llama3" });
    expect(g.triggers!.map((t) => [t.text, t.atStart ?? false])).toEqual([
      ["<|python_tag|>", false],
      ["{", true],
    ]);
    const r = new GbnfGrammar(g.grammar);
    expect(r.accepts(g.triggers![0]!.rule, '<|python_tag|>{"name": "get_time", "parameters": {}}')).toBe(true);
    expect(r.accepts(g.triggers![1]!.rule, '{"name": "get_time", "parameters": {}}')).toBe(true);
  });
});

it("guides are cached by request and frozen (shared safely between requests)", () => {
  const req: GuideRequest = { ...base, toolChoice: { kind: "required" } };
  const a = buildGuide(req)!;
  const b = buildGuide({ ...req, tools: [...TOOLS] })!;
  expect(b).toBe(a);
  expect(Object.isFrozen(a) && Object.isFrozen(a.start)).toBe(true);
  expect(() => {
    (a as { grammar: string }).grammar = "";
  }).toThrow(TypeError);
  const c = buildGuide({ ...req, parallelToolCalls: false })!;
  expect(c).not.toBe(a);
  expect(c.grammar).not.toBe(a.grammar);
});
