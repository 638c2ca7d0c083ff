/**
 * The Responses API without a server: request parsing (input items → chat turns, text.format, reasoning, refusals
 * naming the field, unknown fields) and the encoder driven with session events (item order, one item at a time, no
 * empty message before a call, reasoning items, argument fragments, consecutive sequence numbers, and the unary
 * answer holding the same items as the stream's response.completed), and the whole path from a Qwen3 model's raw
 * text through the real reasoning and hermes3 parsers and the generation session to the items.
 */
import { describe, expect, it } from "vitest";
import { engineError, KeelHttpError } from "../http/errors.js";
import type { ResponseWriter } from "../http/sse.js";
import type { ChoiceResult, SessionEvent } from "../requests/session/events.js";
import type { ToolCallDelta } from "../parsers/types.js";
import { parseResponsesRequest, responsesEncoder } from "./responses.js";
import { recordingParser } from "../parsers/recording.js";
import type { ParsedDelta } from "../parsers/types.js";
import { createOutputParser } from "../parsers/index.js";
import { GenerationSession } from "../requests/session/session.js";

function reject(fn: () => unknown): KeelHttpError {
  try {
    fn();
  } catch (err) {
    if (err instanceof KeelHttpError) return err;
    throw err;
  }
  throw new Error("expected a rejection");
}

type Finished = Extract<SessionEvent, { type: "finished" }>;
type Payload = Record<string, unknown> & { type: string; sequence_number: number };

/** One parsed delta of choice 0. */
const delta = (content: string, extra: { reasoning?: string; toolCalls?: ToolCallDelta[] } = {}): SessionEvent => ({ type: "delta", index: 0, content, logprobs: [], ...extra });

const finished = (c: Partial<ChoiceResult>, completionTokens = 5): Finished => ({
  type: "finished",
  usage: { promptTokens: 3, completionTokens },
  choices: [{ index: 0, text: "", reason: "stop", logprobs: [], completionTokens, reasoning: null, toolCalls: [], ...c }],
});

/** Stream `deltas` then `fin` through a fresh encoder; returns the events and the unary body of the same finish. */
function run(deltas: SessionEvent[], fin: Finished, request: Record<string, unknown> = {}) {
  const body = parseResponsesRequest({ model: "m", input: "hi", stream: true, ...request });
  const enc = responsesEncoder(body, "resp_abc", "m", 1);
  const events: Payload[] = [];
  const w = { event: (event: string, d: Payload) => void events.push({ ...d, event }) } as unknown as ResponseWriter;
  for (const ev of [{ type: "started" } as SessionEvent, ...deltas, { type: "choice_finished", index: 0, reason: fin.choices[0]!.reason } as SessionEvent, fin]) {
    if (ev.type !== "failed") enc.stream(ev, w);
  }
  const unary = responsesEncoder(body, "resp_abc", "m", 1).unary(fin) as { output: unknown[]; output_text: string; status: string };
  const last = events.at(-1)! as Payload & { response: { status: string; output: Record<string, unknown>[] } };
  return { events, types: events.map((e) => e.type), final: last.response, unary, enc };
}

describe("responses request", () => {
  it("input string or message items; instructions become a system message", () => {
    const r = parseResponsesRequest({ model: "m", instructions: "Be brief.", input: [{ role: "user", content: [{ type: "input_text", text: "a" }, { type: "input_text", text: "b" }] }, { type: "message", role: "assistant", content: "ok" }], max_output_tokens: 5 });
    expect(r.messages).toEqual([{ role: "system", content: "Be brief." }, { role: "user", content: "a\nb" }, { role: "assistant", content: "ok" }]);
    expect(r.maxOutputTokens).toBe(5);
    expect(parseResponsesRequest({ model: "m", input: "hi", store: false }).messages).toEqual([{ role: "user", content: "hi" }]);
  });

  it.each([
    [{ model: "m" }, "missing_field", "input"],
    [{ model: "m", input: [] }, "invalid_value", "input"],
    [{ model: "m", input: "x", previous_response_id: "resp_1" }, "unsupported_field", "previous_response_id"],
    // Chat fields sent to /responses are refused, not accepted and ignored.
    [{ model: "m", input: "x", seed: 5 }, "unsupported_field", "seed"],
    [{ model: "m", input: "x", stop: ["a"] }, "unsupported_field", "stop"],
    [{ model: "m", input: "x", n: 2 }, "unsupported_field", "n"],
    [{ model: "m", input: "x", logit_bias: { "1": 5 } }, "unsupported_field", "logit_bias"],
    [{ model: "m", input: "x", response_format: { type: "json_object" } }, "unsupported_field", "response_format"],
    [{ model: "m", input: "x", reasoning_effort: "low" }, "unsupported_field", "reasoning_effort"],
    [{ model: "m", input: "x", store: true }, "unsupported_field", "store"],
    [{ model: "m", input: "x", include: ["reasoning.encrypted_content"] }, "unsupported_field", "include"],
    [{ model: "m", input: "x", stream_options: { include_obfuscation: true } }, "unsupported_field", "stream_options"],
    [{ model: "m", input: "x", max_tool_calls: 2 }, "unsupported_field", "max_tool_calls"],
    [{ model: "m", input: "x", max_output_tokens: 0 }, "invalid_value", "max_output_tokens"],
    // Unknown top-level fields: a typo is named, never ignored.
    [{ model: "m", input: "x", temprature: 0 }, "unknown_field", "temprature"],
    [{ model: "m", input: "x", max_token: 5 }, "unknown_field", "max_token"],
    // reasoning and text: what cannot be applied is refused by its path.
    [{ model: "m", input: "x", reasoning: { summary: "detailed" } }, "unsupported_field", "reasoning.summary"],
    [{ model: "m", input: "x", reasoning: { effort: "extreme" } }, "invalid_value", "reasoning.effort"],
    [{ model: "m", input: "x", text: { verbosity: "low" } }, "unsupported_field", "text.verbosity"],
    [{ model: "m", input: "x", text: { format: { type: "xml" } } }, "invalid_value", "text.format.type"],
    [{ model: "m", input: "x", text: { format: { type: "json_schema", schema: { type: "object" } } } }, "missing_field", "text.format.name"],
    [{ model: "m", input: "x", text: { format: { type: "json_schema", name: "a b", schema: {} } } }, "invalid_value", "text.format.name"],
    [{ model: "m", input: "x", text: { format: { type: "json_schema", name: "r", schema: "{}" } } }, "invalid_value", "text.format.schema"],
    // Input items.
    [{ model: "m", input: [{ type: "web_search_call", id: "x" }] }, "unsupported_field", "input[0].type"],
    [{ model: "m", input: [{ type: "item_reference", id: "msg_1" }] }, "unsupported_field", "input[0].type"],
    [{ model: "m", input: [{ type: "function_call_output", output: "x" }] }, "missing_field", "input[0].call_id"],
    [{ model: "m", input: [{ type: "function_call_output", call_id: "c" }] }, "missing_field", "input[0].output"],
    [{ model: "m", input: [{ type: "function_call", call_id: "c", arguments: "{}" }] }, "missing_field", "input[0].name"],
    [{ model: "m", input: [{ type: "function_call", call_id: "c", name: "f", arguments: { a: 1 } }] }, "invalid_value", "input[0].arguments"],
    [{ model: "m", input: [{ type: "reasoning", id: "rs_1", summary: [], encrypted_content: "gAAA" }] }, "unsupported_field", "input[0].encrypted_content"],
    [{ model: "m", input: [{ type: "reasoning", id: "rs_1", content: [{ type: "text", text: "x" }] }] }, "invalid_value", "input[0].content[0]"],
    [{ model: "m", input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] }, "unsupported_field", "input[0].content[0].type"],
    [{ model: "m", input: "x", tools: [{ type: "web_search" }] }, "unsupported_field", "tools[0].type"],
    [{ model: "m", input: "x", tools: [{ type: "function", name: "f" }], tool_choice: { type: "function", name: "g" } }, "invalid_value", "tool_choice"],
  ])("%j → 400 %s on %s", (body, code, param) => {
    const e = reject(() => parseResponsesRequest(body));
    expect({ status: e.status, code: e.code, param: e.param }).toEqual({ status: 400, code, param });
  });

  it("an unknown field's message names it", () => {
    expect(reject(() => parseResponsesRequest({ model: "m", input: "x", temprature: 0 })).message).toBe("Unrecognized request argument supplied: 'temprature'. Did you mean 'temperature'?");
  });

  it("text.format maps to chat's response_format; reasoning effort and the identifiers are read", () => {
    const schema = { type: "object", properties: { a: { type: "integer" } }, required: ["a"] };
    const r = parseResponsesRequest({ model: "m", input: "x", text: { format: { type: "json_schema", name: "r", schema, strict: true }, verbosity: "medium" }, reasoning: { effort: "low", summary: "auto" }, user: "u1", prompt_cache_key: "k" });
    expect(r.responseFormat).toEqual({ kind: "json_schema", name: "r", schema, strict: true });
    expect([r.reasoningEffort, r.reasoningSummary]).toEqual(["low", "auto"]);
    expect(parseResponsesRequest({ model: "m", input: "x", text: { format: { type: "json_object" } } }).responseFormat).toEqual({ kind: "json_object" });
    expect(parseResponsesRequest({ model: "m", input: "x", text: { format: { type: "text" } } }).responseFormat).toEqual({ kind: "text" });
    expect(parseResponsesRequest({ model: "m", input: "x" })).toMatchObject({ responseFormat: { kind: "text" }, reasoningEffort: null, reasoningSummary: null });
  });
});

describe("responses request: items an agent gives back", () => {
  it("flat tools, tool_choice, and function_call / function_call_output items become the chat turns a template expects", () => {
    const r = parseResponsesRequest({
      model: "m",
      tools: [{ type: "function", name: "get_weather", parameters: { type: "object" } }],
      tool_choice: "required",
      parallel_tool_calls: false,
      input: [
        { role: "user", content: "Weather in Paris and Rome?" },
        { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
        { type: "function_call", call_id: "call_2", name: "get_weather", arguments: '{"city":"Rome"}' },
        { type: "function_call_output", call_id: "call_1", output: "sunny" },
        { type: "function_call_output", call_id: "call_2", output: [{ type: "input_text", text: "rain" }] },
      ],
    });
    expect(r.tools).toEqual([{ name: "get_weather", parameters: { type: "object" } }]);
    expect([r.toolChoice, r.parallelToolCalls]).toEqual([{ kind: "required" }, false]);
    expect(r.messages).toEqual([
      { role: "user", content: "Weather in Paris and Rome?" },
      { role: "assistant", content: "", toolCalls: [{ id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' }, { id: "call_2", name: "get_weather", arguments: '{"city":"Rome"}' }] },
      { role: "tool", content: "sunny", toolCallId: "call_1" },
      { role: "tool", content: "rain", toolCallId: "call_2" },
    ]);
    expect(parseResponsesRequest({ model: "m", input: "x" }).toolChoice).toEqual({ kind: "none" });
  });

  it("a response's own output items given back (reasoning, message with output_text, call) form one assistant turn", () => {
    const r = parseResponsesRequest({
      model: "m",
      input: [
        { role: "user", content: "Weather?" },
        { type: "reasoning", id: "rs_1", summary: [], content: [{ type: "reasoning_text", text: "Need the tool." }], status: "completed" },
        { type: "message", id: "msg_1", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Checking.", annotations: [] }] },
        { type: "function_call", id: "fc_1", call_id: "call_1", name: "w", arguments: "{}", status: "completed" },
        { type: "function_call_output", call_id: "call_1", output: "18C" },
        { type: "reasoning", id: "rs_2", summary: [{ type: "summary_text", text: "Answer it." }] },
        { type: "message", role: "assistant", content: "It is 18C." },
        { role: "user", content: "Thanks" },
      ],
    });
    expect(r.messages).toEqual([
      { role: "user", content: "Weather?" },
      { role: "assistant", content: "Checking.", reasoningContent: "Need the tool.", toolCalls: [{ id: "call_1", name: "w", arguments: "{}" }] },
      { role: "tool", content: "18C", toolCallId: "call_1" },
      { role: "assistant", content: "It is 18C.", reasoningContent: "Answer it." },
      { role: "user", content: "Thanks" },
    ]);
  });
});

describe("responses encoder", () => {
  it("text: created, in_progress, then the message item's events; consecutive sequence numbers; unary = completed", () => {
    const { events, types, final, unary } = run([delta("Hel"), delta(""), delta("lo")], finished({ text: "Hello" }));
    expect(types).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    expect(events.map((e) => e.event)).toEqual(types);
    expect(events[6]).toMatchObject({ text: "Hello", output_index: 0, content_index: 0 });
    expect(final).toMatchObject({ status: "completed", output: [{ type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Hello" }] }], usage: { input_tokens: 3, output_tokens: 5, total_tokens: 8 } });
    expect(unary.output).toEqual(final.output);
    expect(unary.output_text).toBe("Hello");
  });

  it("a call with no text (whitespace before it): only the function_call item, no empty message", () => {
    const call = { id: "call_x1", name: "f", arguments: '{"a":1}' };
    const { types, events, final, unary } = run(
      [delta("\n"), delta("", { toolCalls: [{ index: 0, id: "call_x1", name: "f" }, { index: 0, arguments: '{"a":' }] }), delta("", { toolCalls: [{ index: 0, arguments: "1}" }] })],
      finished({ text: "\n", reason: "tool_calls", toolCalls: [call] }),
    );
    expect(types).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    const item = { id: "fc_x1", type: "function_call", call_id: "call_x1", name: "f" };
    expect(events[2]).toMatchObject({ output_index: 0, item: { ...item, arguments: "", status: "in_progress" } });
    expect(events[5]).toMatchObject({ item_id: "fc_x1", output_index: 0, name: "f", arguments: '{"a":1}' });
    expect(final.output).toEqual([{ ...item, arguments: '{"a":1}', status: "completed" }]);
    expect(unary.output).toEqual(final.output);
  });

  it("text then calls: the message is closed before the first call opens; each call item in turn", () => {
    const calls = [{ id: "call_1", name: "f", arguments: "{}" }, { id: "call_2", name: "g", arguments: '{"b":2}' }];
    const { types, final, unary } = run(
      [delta("Let me check.", { toolCalls: [{ index: 0, id: "call_1", name: "f", arguments: "{}" }] }), delta("", { toolCalls: [{ index: 1, id: "call_2", name: "g", arguments: '{"b":2}' }] })],
      finished({ text: "Let me check.", reason: "tool_calls", toolCalls: calls }),
    );
    expect(types.slice(2)).toEqual([
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(final.output.map((o) => [o.type, o.call_id ?? null])).toEqual([["message", null], ["function_call", "call_1"], ["function_call", "call_2"]]);
    expect(unary.output).toEqual(final.output);
  });

  it("reasoning: a reasoning item with reasoning_text content before the message", () => {
    const { types, events, final, unary } = run([delta("", { reasoning: "Think" }), delta("", { reasoning: "ing." }), delta("Hi")], finished({ text: "Hi", reasoning: "Thinking." }));
    expect(types.slice(2)).toEqual([
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(events[2]).toMatchObject({ output_index: 0, item: { type: "reasoning", summary: [], content: [], status: "in_progress" } });
    expect(events[3]).toMatchObject({ part: { type: "reasoning_text", text: "" } });
    expect(events[6]).toMatchObject({ output_index: 0, content_index: 0, text: "Thinking." });
    expect(final.output).toMatchObject([
      { type: "reasoning", summary: [], content: [{ type: "reasoning_text", text: "Thinking." }], status: "completed" },
      { type: "message", content: [{ text: "Hi" }] },
    ]);
    expect((final.output[0]!.id as string).startsWith("rs_")).toBe(true);
    expect(unary.output).toEqual(final.output);
  });

  it("reasoning then a call: reasoning item, then only the function_call item", () => {
    const call = { id: "call_9", name: "f", arguments: "{}" };
    const { final, unary } = run([delta("", { reasoning: "Use f." }), delta("\n\n", { toolCalls: [{ index: 0, id: "call_9", name: "f", arguments: "{}" }] })], finished({ text: "\n\n", reasoning: "Use f.", reason: "tool_calls", toolCalls: [call] }));
    expect(final.output.map((o) => o.type)).toEqual(["reasoning", "function_call"]);
    expect(unary.output).toEqual(final.output);
  });

  it("no output at all is one empty message; reasoning cut by the budget is an incomplete reasoning item only", () => {
    const empty = run([], finished({ text: "" }, 0));
    expect(empty.final.output).toMatchObject([{ type: "message", status: "completed", content: [{ type: "output_text", text: "" }] }]);
    expect(empty.unary.output).toEqual(empty.final.output);
    const cut = run([delta("", { reasoning: "Hmm" })], finished({ text: "", reasoning: "Hmm", reason: "length" }));
    expect(cut.types.at(-1)).toBe("response.incomplete");
    expect(cut.final).toMatchObject({ status: "incomplete", incomplete_details: { reason: "max_output_tokens" }, output: [{ type: "reasoning", status: "incomplete" }] });
    expect(cut.final.output).toHaveLength(1);
    expect(cut.unary.output).toEqual(cut.final.output);
  });

  it("a call whose arguments were cut by the budget stays incomplete; its raw text follows as a message", () => {
    const { final } = run(
      [delta("", { toolCalls: [{ index: 0, id: "call_c", name: "f", arguments: '{"a": "lo' }] }), delta('<tool_call>{"name": "f", "arguments": {"a": "lo')],
      finished({ text: '<tool_call>{"name": "f", "arguments": {"a": "lo', reason: "length" }),
    );
    expect(final.output).toMatchObject([{ type: "function_call", status: "completed" }, { type: "message", status: "incomplete" }]);
    const open = run([delta("", { toolCalls: [{ index: 0, id: "call_c", name: "f", arguments: '{"a": "lo' }] })], finished({ text: "", reason: "length" }));
    expect(open.final.output).toMatchObject([{ type: "function_call", status: "incomplete", arguments: '{"a": "lo' }]);
  });

  it("the response echoes text.format and reasoning; a failure is response.failed with the items so far, then [DONE]", () => {
    const schema = { type: "object" };
    const { final, enc, events } = run([delta("{}")], finished({ text: "{}" }), { text: { format: { type: "json_schema", name: "r", schema } }, reasoning: { effort: "low" } });
    expect(final).toMatchObject({ text: { format: { type: "json_schema", name: "r", schema, strict: false } }, reasoning: { effort: "low", summary: null } });
    const failed: Payload[] = [];
    enc.streamError(engineError("boom"), { event: (_: string, d: Payload) => void failed.push(d) } as unknown as ResponseWriter);
    expect(failed[0]).toMatchObject({ type: "response.failed", sequence_number: events.length, response: { status: "failed", error: { code: "engine_error" } } });
    expect(enc.doneAfterError).toBe(true);
  });
});

describe("responses: a Qwen3 model's raw text through the real parsers and the session", () => {
  const tool = { type: "function", name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } };
  const raw = '<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

  /** Feed `raw` in pieces of `size` characters through a session with the real parsers; the events, streamed and unary. */
  function through(size: number, text = raw, reason: "stop" | "length" = "stop") {
    // The unary answer replays the parser's deltas in order, as the route records them.
    const parsed: ParsedDelta[] = [];
    const session = new GenerationSession({
      childIds: ["resp_q"],
      stop: [],
      includeStopStr: false,
      logprobs: false,
      parser: () => recordingParser(createOutputParser({ toolParser: "hermes3", tools: [{ name: "get_weather" }], reasoningParser: "qwen3", reasoningOpen: false }), parsed),
    });
    const evs: SessionEvent[] = [...session.admitted("resp_q", 9).events];
    for (let i = 0; i < text.length; i += size) evs.push(...session.output("resp_q", [i], text.slice(i, i + size)).events);
    evs.push(...session.finish("resp_q", reason, { promptTokens: 9, completionTokens: 30 }).events);
    const body = parseResponsesRequest({ model: "m", input: "Weather in Paris?", tools: [tool], stream: true });
    const enc = responsesEncoder(body, "resp_q", "m", 1, parsed);
    const events: Payload[] = [];
    const w = { event: (_: string, d: Payload) => void events.push(d) } as unknown as ResponseWriter;
    for (const ev of evs) if (ev.type !== "failed") enc.stream(ev, w);
    const fin = evs.find((e): e is Finished => e.type === "finished")!;
    const completed = events.at(-1) as Payload & { response: { output: Record<string, unknown>[] } };
    return { events, output: completed.response.output, unary: (enc.unary(fin) as { output: unknown[] }).output };
  }

  it.each([1, 3, 7, raw.length])("pieces of %i characters: a reasoning item, then only the function_call item (same unary)", (size) => {
    const { events, output, unary } = through(size);
    expect(output).toMatchObject([
      { type: "reasoning", status: "completed", content: [{ type: "reasoning_text", text: "\nThe user wants the weather.\n" }] },
      { type: "function_call", status: "completed", name: "get_weather", arguments: '{"city":"Paris"}' },
    ]);
    expect(output).toHaveLength(2);
    expect(unary).toEqual(output);
    const reasoning = events.flatMap((e) => (e.type === "response.reasoning_text.delta" ? [e.delta as string] : [])).join("");
    expect(reasoning).toBe("\nThe user wants the weather.\n");
    const args = events.flatMap((e) => (e.type === "response.function_call_arguments.delta" ? [e.delta as string] : [])).join("");
    expect(args).toBe('{"city":"Paris"}');
    expect(events.some((e) => e.type === "response.output_text.delta")).toBe(false);
  });

  it("reasoning cut by the budget: an incomplete reasoning item and response.incomplete, no message", () => {
    const { events, output, unary } = through(4, "<think>\nStill thinking about", "length");
    expect(events.at(-1)!.type).toBe("response.incomplete");
    expect(output).toMatchObject([{ type: "reasoning", status: "incomplete", content: [{ text: "\nStill thinking about" }] }]);
    expect(output).toHaveLength(1);
    expect(unary).toEqual(output);
  });

  it("a second call cut by the budget: the first call, then its raw text as an incomplete message (unary in the same order)", () => {
    const text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n<tool_call>\n{"name": "get_we';
    for (const size of [1, 5, text.length]) {
      const { output, unary } = through(size, text, "length");
      expect(output).toMatchObject([
        { type: "function_call", status: "completed", arguments: '{"city":"Rome"}' },
        { type: "message", status: "incomplete", content: [{ text: expect.stringContaining('{"name": "get_we') }] },
      ]);
      expect(unary).toEqual(output);
    }
  });
});
