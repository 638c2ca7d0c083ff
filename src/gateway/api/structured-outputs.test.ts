/**
 * The output-constraint fields on chat and completions (vLLM's `structured_outputs`, its `guided_*` aliases,
 * llama.cpp's `grammar`, `response_format`), the one-constraint rule, unknown fields on completions, and
 * `reasoning_effort` as the template's thinking switch.
 */
import { describe, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import { parseChatRequest } from "./chat-request.js";
import { parseCompletionRequest } from "./completions.js";
import { templateKwargsFor } from "./reasoning-effort.js";

const chat = (extra: Record<string, unknown>) => parseChatRequest({ model: "m", messages: [{ role: "user", content: "Hi" }], ...extra });
const completion = (extra: Record<string, unknown>) => parseCompletionRequest({ model: "m", prompt: "Hi", ...extra });

/** The 400 `f` throws. */
function refusal(f: () => unknown): KeelHttpError {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(KeelHttpError);
    expect((e as KeelHttpError).status).toBe(400);
    return e as KeelHttpError;
  }
  throw new Error("expected a 400");
}

describe("structured_outputs and its aliases", () => {
  it.each([
    [{ structured_outputs: { regex: "[a-z]+" } }, { kind: "regex", pattern: "[a-z]+", field: "structured_outputs.regex" }],
    [{ structured_outputs: { choice: ["a", "b"] } }, { kind: "choice", choices: ["a", "b"], field: "structured_outputs.choice" }],
    [{ structured_outputs: { grammar: 'root ::= "x"' } }, { kind: "grammar", grammar: 'root ::= "x"', field: "structured_outputs.grammar" }],
    [{ structured_outputs: { json: { type: "object" } } }, { kind: "json_schema", name: "structured_output", schema: { type: "object" }, strict: true, field: "structured_outputs.json" }],
    [{ structured_outputs: { json: '{"type": "integer"}' } }, { kind: "json_schema", name: "structured_output", schema: { type: "integer" }, strict: true, field: "structured_outputs.json" }],
    [{ structured_outputs: { json_object: true } }, { kind: "json_object", field: "structured_outputs.json_object" }],
    [{ structured_outputs: { json_object: false, regex: null } }, { kind: "text" }],
    [{ structured_outputs: { regex: "a", disable_fallback: false, disable_any_whitespace: false, disable_additional_properties: false } }, { kind: "regex", pattern: "a", field: "structured_outputs.regex" }],
    [{ guided_regex: "a|b" }, { kind: "regex", pattern: "a|b", field: "guided_regex" }],
    [{ guided_choice: ["x"] }, { kind: "choice", choices: ["x"], field: "guided_choice" }],
    [{ guided_grammar: 'root ::= "x"' }, { kind: "grammar", grammar: 'root ::= "x"', field: "guided_grammar" }],
    [{ guided_json: { type: "string" } }, { kind: "json_schema", name: "structured_output", schema: { type: "string" }, strict: true, field: "guided_json" }],
    [{ grammar: 'root ::= "x"' }, { kind: "grammar", grammar: 'root ::= "x"', field: "grammar" }],
    [{ json_schema: { type: "boolean" } }, { kind: "json_schema", name: "structured_output", schema: { type: "boolean" }, strict: true, field: "json_schema" }],
    [{ response_format: { type: "json_object" }, structured_outputs: null }, { kind: "json_object" }],
  ])("%j → %j on chat and completions", (fields, expected) => {
    expect(chat(fields).responseFormat).toEqual(expected);
    expect(completion(fields).responseFormat).toEqual(expected);
  });

  it.each([
    [{ structured_outputs: { regex: "a", choice: ["b"] } }, "structured_outputs", /only one kind of constraint may be set, but 'regex' and 'choice' are/],
    [{ response_format: { type: "json_object" }, grammar: 'root ::= "x"' }, "grammar", /one output constraint, but 'response_format' and 'grammar' are both set/],
    [{ guided_regex: "a", structured_outputs: { choice: ["b"] } }, "guided_regex", /'structured_outputs' and 'guided_regex' are both set/],
    [{ structured_outputs: { whitespace_pattern: " " } }, "structured_outputs.whitespace_pattern", /applies only 'json', 'regex', 'choice', 'grammar', 'json_object'/],
    [{ structured_outputs: { regex: "a", disable_any_whitespace: true } }, "structured_outputs.disable_any_whitespace", /applies only/],
    [{ structured_outputs: { choice: [] } }, "structured_outputs.choice", /non-empty array of strings, but got an empty array/],
    [{ structured_outputs: { choice: ["a", 1] } }, "structured_outputs.choice", /holding a non-string/],
    [{ structured_outputs: { regex: "" } }, "structured_outputs.regex", /non-empty string, but got an empty string/],
    [{ structured_outputs: { json: "{not json" } }, "structured_outputs.json", /the string is not JSON/],
    [{ structured_outputs: { json: [1] } }, "structured_outputs.json", /expected a JSON schema object/],
    [{ structured_outputs: "regex" }, "structured_outputs", /expected an object/],
    [{ grammar: 42 }, "grammar", /non-empty string/],
  ])("%j is a 400 naming %s", (fields, param, message) => {
    for (const parse of [chat, completion]) {
      const e = refusal(() => parse(fields));
      expect(e.param).toBe(param);
      expect(e.message).toMatch(message);
    }
  });
});

describe("unknown fields on completions", () => {
  it("are refused, naming the field; OpenAI's `user` and the fields Keel applies are known", () => {
    const e = refusal(() => completion({ max_token: 5 }));
    expect({ code: e.code, param: e.param }).toEqual({ code: "unknown_field", param: "max_token" });
    expect(e.message).toMatch(/Unrecognized request argument supplied: 'max_token'\. Did you mean 'max_tokens'\?/);
    expect(refusal(() => completion({ messages: [] })).param).toBe("messages");
    expect(completion({ user: "u", echo: false, suffix: "", top_k: 3, min_tokens: 1, include_stop_str_in_output: true }).topK).toBe(3);
  });
});

describe("reasoning_effort", () => {
  const withParser = { reasoningParser: "qwen3" as const };
  /** A template with the switch, as Qwen3's (the source is only searched for it). */
  const qwen3 = "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{%- endif %}";
  it("maps none/minimal to enable_thinking false and low/medium/high/xhigh to true, keeping the other kwargs", () => {
    const kw = (effort: string) => templateKwargsFor(chat({ reasoning_effort: effort, chat_template_kwargs: { other: 1 } }), withParser, qwen3);
    expect(kw("none")).toEqual({ other: 1, enable_thinking: false });
    expect(kw("minimal")).toEqual({ other: 1, enable_thinking: false });
    for (const e of ["low", "medium", "high", "xhigh"]) expect(kw(e)).toEqual({ other: 1, enable_thinking: true });
  });

  it("leaves the kwargs alone when absent, agrees with a matching enable_thinking and refuses a contradicting one", () => {
    expect(templateKwargsFor(chat({ chat_template_kwargs: { enable_thinking: true } }), { reasoningParser: null }, qwen3)).toEqual({ enable_thinking: true });
    expect(templateKwargsFor(chat({ reasoning_effort: "high", chat_template_kwargs: { enable_thinking: true } }), withParser, qwen3)).toEqual({ enable_thinking: true });
    const e = refusal(() => templateKwargsFor(chat({ reasoning_effort: "none", chat_template_kwargs: { enable_thinking: true } }), withParser, qwen3));
    expect({ code: e.code, param: e.param }).toEqual({ code: "invalid_value", param: "reasoning_effort" });
    expect(e.message).toMatch(/'none' turns thinking off, but chat_template_kwargs\.enable_thinking is true/);
  });

  it("is refused for a template without the switch", () => {
    const e = refusal(() => templateKwargsFor(chat({ reasoning_effort: "high" }), withParser, "{{ messages[0].content }}"));
    expect({ code: e.code, param: e.param }).toEqual({ code: "unsupported_field", param: "reasoning_effort" });
    expect(e.message).toMatch(/no thinking switch \(enable_thinking\)/);
  });

  it("is refused without a reasoning parser", () => {
    const e = refusal(() => templateKwargsFor(chat({ reasoning_effort: "low" }), { reasoningParser: null }, qwen3));
    expect({ code: e.code, param: e.param }).toEqual({ code: "unsupported_field", param: "reasoning_effort" });
    expect(e.message).toMatch(/--reasoning_parser/);
  });
});
