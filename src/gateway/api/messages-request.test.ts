/**
 * Anthropic Messages request mapping: system, text / tool_use / tool_result / thinking blocks into chat-template
 * messages, tools and tool_choice into Keel's vocabulary, thinking and sampling fields with Anthropic's ranges, and
 * the refusals (400 naming the field) for unknown, unsupported and malformed input.
 */
import { describe, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import { parseCountTokensRequest, parseMessagesRequest } from "./messages-request.js";
import { thinkingKwargs } from "./messages.js";

function reject(fn: () => unknown): KeelHttpError {
  try {
    fn();
  } catch (err) {
    if (err instanceof KeelHttpError) return err;
    throw err;
  }
  throw new Error("expected a rejection");
}

const base = { model: "m", max_tokens: 64 };
const weather = { name: "get_weather", description: "Weather of a city", input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } };

describe("Messages request: the conversation", () => {
  it("a string system prompt and string contents; Anthropic's defaults", () => {
    const r = parseMessagesRequest({ ...base, system: "Be brief.", messages: [{ role: "user", content: "Hi" }] });
    expect(r.messages).toEqual([{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }]);
    expect(r).toMatchObject({ maxTokens: 64, temperature: 1, topP: 1, topK: -1, stream: false, stopSequences: [], tools: [], toolChoice: { kind: "none" }, parallelToolCalls: true, thinking: { kind: "default" } });
  });

  it("an empty system prompt (\"\" or []) is no system turn", () => {
    for (const system of ["", []]) expect(parseMessagesRequest({ ...base, system, messages: [{ role: "user", content: "Hi" }] }).messages).toEqual([{ role: "user", content: "Hi" }]);
  });

  it("system text blocks and user text blocks are joined with newlines (cache_control accepted)", () => {
    const r = parseMessagesRequest({
      ...base,
      system: [{ type: "text", text: "A" }, { type: "text", text: "B", cache_control: { type: "ephemeral" } }],
      messages: [{ role: "user", content: [{ type: "text", text: "x" }, { type: "text", text: "y" }] }],
    });
    expect(r.messages).toEqual([{ role: "system", content: "A\nB" }, { role: "user", content: "x\ny" }]);
  });

  it("a tool loop: assistant tool_use → tool calls (input as JSON text), tool_result → tool messages, in order", () => {
    const r = parseMessagesRequest({
      ...base,
      tools: [weather],
      messages: [
        { role: "user", content: "Weather in Paris and Rome?" },
        {
          role: "assistant",
          content: [
            { type: "thinking", thinking: "Two cities.", signature: "" },
            { type: "text", text: "Checking." },
            { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } },
            { type: "tool_use", id: "toolu_2", name: "get_weather", input: { city: "Rome" } },
          ],
        },
        {
          role: "user",
          content: [
            { type: "tool_result", tool_use_id: "toolu_1", content: "14°C" },
            { type: "tool_result", tool_use_id: "toolu_2", content: [{ type: "text", text: "no data" }], is_error: true },
            { type: "text", text: "Thanks" },
          ],
        },
      ],
    });
    expect(r.messages).toEqual([
      { role: "user", content: "Weather in Paris and Rome?" },
      {
        role: "assistant",
        content: "Checking.",
        reasoningContent: "Two cities.",
        toolCalls: [
          { id: "toolu_1", name: "get_weather", arguments: '{"city":"Paris"}' },
          { id: "toolu_2", name: "get_weather", arguments: '{"city":"Rome"}' },
        ],
      },
      { role: "tool", content: "14°C", toolCallId: "toolu_1" },
      { role: "tool", content: "Error: no data", toolCallId: "toolu_2" },
      { role: "user", content: "Thanks" },
    ]);
    expect(r.tools).toEqual([{ name: "get_weather", description: "Weather of a city", parameters: weather.input_schema }]);
    expect(r.toolChoice).toEqual({ kind: "auto" });
  });
});

describe("Messages request: tools, tool_choice, thinking, sampling", () => {
  it.each([
    [{ type: "auto" }, { kind: "auto" }, true],
    [{ type: "any" }, { kind: "required" }, true],
    [{ type: "tool", name: "get_weather", disable_parallel_tool_use: true }, { kind: "function", name: "get_weather" }, false],
    [{ type: "none" }, { kind: "none" }, true],
  ])("tool_choice %j → %j (parallel %s)", (tool_choice, kind, parallel) => {
    const r = parseMessagesRequest({ ...base, tools: [weather], tool_choice, messages: [{ role: "user", content: "x" }] });
    expect(r.toolChoice).toEqual(kind);
    expect(r.parallelToolCalls).toBe(parallel);
  });

  it("sampling and stop sequences as given; thinking enabled with its budget", () => {
    const r = parseMessagesRequest({ ...base, max_tokens: 4096, temperature: 0, top_p: 0.5, top_k: 7, stop_sequences: ["END"], stream: true, metadata: { user_id: "u1" }, thinking: { type: "enabled", budget_tokens: 2048 }, messages: [{ role: "user", content: "x" }] });
    expect(r).toMatchObject({ maxTokens: 4096, temperature: 0, topP: 0.5, topK: 7, stopSequences: ["END"], stream: true, thinking: { kind: "enabled", budgetTokens: 2048 } });
    expect(parseMessagesRequest({ ...base, thinking: { type: "disabled" }, messages: [{ role: "user", content: "x" }] }).thinking).toEqual({ kind: "disabled" });
  });

  it("count_tokens takes the prompt fields only", () => {
    const r = parseCountTokensRequest({ model: "m", system: "S", tools: [weather], messages: [{ role: "user", content: "x" }] });
    expect(r.messages).toEqual([{ role: "system", content: "S" }, { role: "user", content: "x" }]);
    expect(r.tools.map((t) => t.name)).toEqual(["get_weather"]);
    const e = reject(() => parseCountTokensRequest({ model: "m", max_tokens: 5, messages: [{ role: "user", content: "x" }] }));
    expect({ code: e.code, param: e.param }).toEqual({ code: "unknown_field", param: "max_tokens" });
  });

  it("thinking → the template's switch when it has one; enabled without a reasoning parser is refused", () => {
    const qwen3 = "{% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}";
    expect(thinkingKwargs({ kind: "enabled", budgetTokens: 2048 }, { reasoningParser: "qwen3" }, qwen3)).toEqual({ enable_thinking: true });
    expect(thinkingKwargs({ kind: "disabled" }, { reasoningParser: null }, qwen3)).toEqual({ enable_thinking: false });
    expect(thinkingKwargs({ kind: "disabled" }, { reasoningParser: null }, "{{ messages }}")).toEqual({});
    expect(thinkingKwargs({ kind: "default" }, { reasoningParser: "qwen3" }, qwen3)).toEqual({});
    const e = reject(() => thinkingKwargs({ kind: "enabled", budgetTokens: null }, { reasoningParser: null }, qwen3));
    expect({ status: e.status, code: e.code, param: e.param }).toEqual({ status: 400, code: "unsupported_field", param: "thinking" });
    expect(e.message).toContain("--reasoning_parser");
  });
});

describe("Messages request: refusals name the field", () => {
  const msgs = [{ role: "user", content: "x" }];
  it.each([
    [{ model: "m", messages: msgs }, "missing_field", "max_tokens"],
    [{ ...base, messages: msgs, max_token: 5 }, "unknown_field", "max_token"],
    [{ ...base, messages: msgs, temprature: 0 }, "unknown_field", "temprature"],
    [{ ...base, messages: [] }, "invalid_value", "messages"],
    [{ ...base, messages: [{ role: "tool", content: "x" }] }, "invalid_value", "messages[0].role"],
    [{ ...base, messages: [{ role: "user", content: "x", name: "n" }] }, "invalid_value", "messages[0].name"],
    [{ ...base, messages: [{ role: "user", content: [{ type: "image", source: {} }] }] }, "unsupported_field", "messages[0].content[0].type"],
    [{ ...base, messages: [{ role: "user", content: [{ type: "tool_use", id: "a", name: "b", input: {} }] }] }, "invalid_value", "messages[0].content[0].type"],
    [{ ...base, messages: [{ role: "user", content: [{ type: "text", text: "x", extra: 1 }] }] }, "invalid_value", "messages[0].content[0].extra"],
    [{ ...base, messages: [{ role: "user", content: "x" }, { role: "assistant", content: "The answer is" }] }, "unsupported_field", "messages[1].role"],
    [{ ...base, messages: [{ role: "user", content: "x" }, { role: "assistant", content: [{ type: "tool_use", id: "t", name: "f", input: "x" }] }, { role: "user", content: "y" }] }, "invalid_value", "messages[1].content[0].input"],
    [{ ...base, messages: msgs, temperature: 1.5 }, "invalid_value", "temperature"],
    [{ ...base, messages: msgs, top_k: 0 }, "invalid_value", "top_k"],
    [{ ...base, messages: msgs, top_p: 0 }, "invalid_value", "top_p"],
    [{ ...base, messages: msgs, stop_sequences: "END" }, "invalid_value", "stop_sequences"],
    [{ ...base, messages: msgs, metadata: { user_id: "u", x: 1 } }, "invalid_value", "metadata.x"],
    [{ ...base, messages: msgs, tools: [{ name: "f", input_schema: { type: "string" } }] }, "invalid_value", "tools[0].input_schema.type"],
    [{ ...base, messages: msgs, tools: [{ name: "f" }] }, "missing_field", "tools[0].input_schema"],
    [{ ...base, messages: msgs, tools: [{ type: "web_search_20250305", name: "web_search" }] }, "unsupported_field", "tools[0].type"],
    [{ ...base, messages: msgs, tools: [weather, weather] }, "invalid_value", "tools[1].name"],
    [{ ...base, messages: msgs, tool_choice: { type: "any" } }, "invalid_value", "tool_choice"],
    [{ ...base, messages: msgs, tools: [weather], tool_choice: { type: "tool", name: "nope" } }, "invalid_value", "tool_choice"],
    [{ ...base, messages: msgs, tools: [weather], tool_choice: { type: "sometimes" } }, "invalid_value", "tool_choice.type"],
    [{ ...base, messages: msgs, thinking: { type: "enabled" } }, "missing_field", "thinking.budget_tokens"],
    [{ ...base, messages: msgs, thinking: { type: "enabled", budget_tokens: 100 } }, "invalid_value", "thinking.budget_tokens"],
    [{ ...base, max_tokens: 2000, messages: msgs, thinking: { type: "enabled", budget_tokens: 4000 } }, "invalid_value", "thinking.budget_tokens"],
    [{ ...base, messages: msgs, mcp_servers: [{ type: "url", url: "http://x" }] }, "unsupported_field", "mcp_servers"],
    [{ ...base, messages: msgs, cache_control: { type: "forever" } }, "invalid_value", "cache_control.type"],
  ])("%j → 400 %s on %s", (body, code, param) => {
    const e = reject(() => parseMessagesRequest(body));
    expect({ status: e.status, code: e.code, param: e.param }).toEqual({ status: 400, code, param });
  });

  it("the unknown field is named in the message", () => {
    expect(reject(() => parseMessagesRequest({ ...base, messages: msgs, max_token: 5 })).message).toContain("'max_token'");
  });
});
