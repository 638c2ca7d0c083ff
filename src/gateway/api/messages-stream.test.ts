/**
 * The Anthropic Messages encoder driven with session events directly: the streamed event sequence (message_start,
 * ping, sequential content blocks with thinking / text / input_json deltas, message_delta, message_stop), tool-call
 * argument fragments (several, or whole in one) streamed as input_json_delta whose concatenation is the unary
 * `input`, stop reasons, the unary message and the error envelope.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { createOutputParser } from "../parsers/index.js";
import { engineError, invalidValue, queueFull } from "../http/errors.js";
import { toAnthropicErrorBody } from "../http/error-envelope.js";
import type { ResponseWriter } from "../http/sse.js";
import type { ChoiceResult, SessionEvent } from "../requests/session/events.js";
import { GenerationSession } from "../requests/session/session.js";
import { messagesEncoder, stopReasonOf } from "./messages-stream.js";
import { recordingParser } from "../parsers/recording.js";
import type { ParsedDelta } from "../parsers/types.js";

function recorder() {
  const out: { event: string; data: Record<string, unknown> }[] = [];
  const w = {
    data: () => {
      throw new Error("the Messages stream has named events only");
    },
    event: (event: string, d: unknown) => void out.push({ event, data: d as Record<string, unknown> }),
  } as unknown as ResponseWriter;
  return { out, w };
}

const delta = (over: Partial<Extract<SessionEvent, { type: "delta" }>>): SessionEvent => ({ type: "delta", index: 0, content: "", logprobs: [], ...over });
const finished = (c: Partial<ChoiceResult>): SessionEvent => ({
  type: "finished",
  usage: { promptTokens: 11, completionTokens: 7 },
  choices: [{ index: 0, text: "", reasoning: null, toolCalls: [], reason: "stop", logprobs: [], completionTokens: 7, ...c }],
});

function play(events: SessionEvent[]) {
  const enc = messagesEncoder("msg_1", "m");
  const { out, w } = recorder();
  for (const ev of events) if (ev.type !== "failed") enc.stream(ev, w);
  return { enc, out };
}

describe("Messages stream", () => {
  it("thinking, text, then a tool call with argument fragments: sequential blocks and Anthropic's event order", () => {
    const { out } = play([
      { type: "started" },
      delta({ reasoning: "Need " }),
      delta({ reasoning: "weather." }),
      delta({ content: "Let me check." }),
      delta({ toolCalls: [{ index: 0, id: "call_abc", name: "get_weather" }] }),
      delta({ toolCalls: [{ index: 0, arguments: '{"city": ' }] }),
      delta({ toolCalls: [{ index: 0, arguments: '"Paris"}' }] }),
      { type: "choice_finished", index: 0, reason: "tool_calls" },
      finished({ text: "Let me check.", reasoning: "Need weather.", toolCalls: [{ id: "call_abc", name: "get_weather", arguments: '{"city": "Paris"}' }], reason: "tool_calls" }),
    ]);
    expect(out.map((e) => e.event)).toEqual([
      "message_start", "ping",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_stop",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
      "message_delta", "message_stop",
    ]);
    // Every payload carries its own type, as Anthropic's events do.
    expect(out.every((e) => e.data.type === e.event)).toBe(true);
    expect(out[0]!.data.message).toEqual({ id: "msg_1", type: "message", role: "assistant", model: "m", content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 0, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: 0 } });
    expect(out[2]!.data).toEqual({ type: "content_block_start", index: 0, content_block: { type: "thinking", thinking: "", signature: "" } });
    expect(out[4]!.data).toEqual({ type: "content_block_delta", index: 0, delta: { type: "thinking_delta", thinking: "weather." } });
    expect(out[7]!.data).toEqual({ type: "content_block_delta", index: 1, delta: { type: "text_delta", text: "Let me check." } });
    expect(out[9]!.data).toEqual({ type: "content_block_start", index: 2, content_block: { type: "tool_use", id: "toolu_abc", name: "get_weather", input: {} } });
    const json = out.filter((e) => (e.data.delta as { type?: string } | undefined)?.type === "input_json_delta").map((e) => (e.data.delta as { partial_json: string }).partial_json);
    expect(json).toEqual(['{"city": ', '"Paris"}']);
    expect(out.at(-2)!.data).toEqual({ type: "message_delta", delta: { stop_reason: "tool_use", stop_sequence: null }, usage: { input_tokens: 11, output_tokens: 7 } });
  });

  it("a call whose arguments come whole with its first fragment, then a second call: one block each", () => {
    const { out } = play([
      { type: "started" },
      delta({ toolCalls: [{ index: 0, id: "call_a", name: "f", arguments: '{"x":1}' }, { index: 1, id: "call_b", name: "g", arguments: "{}" }] }),
      finished({ reason: "tool_calls" }),
    ]);
    expect(out.slice(2, -2).map((e) => [e.event, e.data.index])).toEqual([
      ["content_block_start", 0], ["content_block_delta", 0], ["content_block_stop", 0],
      ["content_block_start", 1], ["content_block_delta", 1], ["content_block_stop", 1],
    ]);
    expect(out[3]!.data.delta).toEqual({ type: "input_json_delta", partial_json: '{"x":1}' });
  });

  it("text after a call opens a new text block after it", () => {
    const { out } = play([{ type: "started" }, delta({ content: "a" }), delta({ toolCalls: [{ index: 0, id: "call_a", name: "f", arguments: "{}" }] }), delta({ content: "b" }), finished({})]);
    const starts = out.filter((e) => e.event === "content_block_start").map((e) => [e.data.index, (e.data.content_block as { type: string }).type]);
    expect(starts).toEqual([[0, "text"], [1, "tool_use"], [2, "text"]]);
  });

  it("an empty answer has no block; the stream still closes with message_delta and message_stop", () => {
    const { out } = play([{ type: "started" }, finished({ reason: "length" })]);
    expect(out.map((e) => e.event)).toEqual(["message_start", "ping", "message_delta", "message_stop"]);
    expect(out[2]!.data.delta).toEqual({ stop_reason: "max_tokens", stop_sequence: null });
  });

  it("an error after the stream began is an `error` event in Anthropic's envelope; before it, the same envelope", () => {
    const enc = messagesEncoder("msg_1", "m");
    const { out, w } = recorder();
    enc.streamError(engineError("boom"), w);
    expect(out).toEqual([{ event: "error", data: { type: "error", error: { type: "api_error", message: "The inference engine failed: boom" } } }]);
    expect(enc.doneAtEnd).toBe(false);
    expect(enc.errorBody!(invalidValue("x", "bad x"))).toEqual({ type: "error", error: { type: "invalid_request_error", message: "bad x" } });
  });
});

describe("Messages unary answer", () => {
  it("content is [thinking, text, tool_use…] with input objects; usage in Anthropic's names", () => {
    const enc = messagesEncoder("msg_1", "m");
    const ev = finished({ text: "Checking.", reasoning: "hmm", toolCalls: [{ id: "call_x", name: "get_weather", arguments: '{"city":"Paris"}' }], reason: "tool_calls" });
    expect(enc.unary(ev as Extract<SessionEvent, { type: "finished" }>)).toEqual({
      id: "msg_1",
      type: "message",
      role: "assistant",
      model: "m",
      content: [
        { type: "thinking", thinking: "hmm", signature: "" },
        { type: "text", text: "Checking." },
        { type: "tool_use", id: "toolu_x", name: "get_weather", input: { city: "Paris" } },
      ],
      stop_reason: "tool_use",
      stop_sequence: null,
      usage: { input_tokens: 11, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: 7 },
    });
  });

  it.each([
    [{ reason: "stop" as const }, { stop_reason: "end_turn", stop_sequence: null }],
    [{ reason: "stop" as const, stopSequence: "END" }, { stop_reason: "stop_sequence", stop_sequence: "END" }],
    [{ reason: "length" as const }, { stop_reason: "max_tokens", stop_sequence: null }],
    [{ reason: "tool_calls" as const }, { stop_reason: "tool_use", stop_sequence: null }],
    // A stop sequence that cut a call short is said (the call may be incomplete).
    [{ reason: "tool_calls" as const, stopSequence: "World" }, { stop_reason: "stop_sequence", stop_sequence: "World" }],
  ])("%j → %j", (c, expected) => {
    expect(stopReasonOf(c)).toEqual(expected);
  });
});

describe("stop sequences through the session", () => {
  it("the session reports which stop sequence ended the answer; an end without one reports none", () => {
    const s = new GenerationSession({ childIds: ["r"], stop: ["STOP", "END"], includeStopStr: false, logprobs: false });
    s.admitted("r", 3);
    s.output("r", [1], "one EN");
    const fin = s.output("r", [2], "D two").events.at(-1) as Extract<SessionEvent, { type: "finished" }>;
    expect(fin.choices[0]).toMatchObject({ text: "one ", reason: "stop", stopSequence: "END" });
    expect(messagesEncoder("msg_1", "m").unary(fin)).toMatchObject({ content: [{ type: "text", text: "one " }], stop_reason: "stop_sequence", stop_sequence: "END" });
    const eos = new GenerationSession({ childIds: ["r"], stop: ["END"], includeStopStr: false, logprobs: false });
    eos.admitted("r", 3);
    eos.output("r", [1], "one EN");
    const end = eos.finish("r", "stop", { promptTokens: 3, completionTokens: 1 }).events.at(-1) as Extract<SessionEvent, { type: "finished" }>;
    expect(end.choices[0]!.stopSequence).toBeUndefined();
    expect(messagesEncoder("msg_1", "m").unary(end)).toMatchObject({ content: [{ type: "text", text: "one EN" }], stop_reason: "end_turn", stop_sequence: null });
  });
});

describe("the real parsers through the session and the encoder", () => {
  const tools = [{ name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } }];
  const output = '<think>need weather</think>\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

  /** A bare call then text (Qwen2.5-Coder echoing the tool result after its call, seen in the SDK tool loop). */
  const textAfter = '{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"temperature_c": 14}';

  /** Run `text` split at `cuts` through a session (qwen3 reasoning + hermes3 calls); the stream and unary bodies. */
  function run(cuts: number[], text = output) {
    const log: ParsedDelta[] = [];
    const s = new GenerationSession({
      childIds: ["r"],
      stop: [],
      includeStopStr: false,
      logprobs: false,
      parser: () => recordingParser(createOutputParser({ toolParser: "hermes3", tools, reasoningParser: "qwen3", reasoningOpen: false, newId: () => "call_1" }), log),
    });
    const events: SessionEvent[] = [...s.admitted("r", 5).events];
    let at = 0;
    for (const cut of [...cuts, text.length]) {
      events.push(...s.output("r", [1], text.slice(at, cut)).events);
      at = cut;
    }
    events.push(...s.finish("r", "stop", { promptTokens: 5, completionTokens: cuts.length + 1 }).events);
    const { out } = play(events);
    const unary = messagesEncoder("msg_1", "m", log).unary(events.at(-1) as Extract<SessionEvent, { type: "finished" }>);
    return { out, unary: unary as { content: Record<string, unknown>[]; stop_reason: string } };
  }

  /** The content blocks a client assembles from the stream (as the SDKs do). */
  function assemble(out: { event: string; data: Record<string, unknown> }[]): Record<string, unknown>[] {
    const blocks: Record<string, unknown>[] = [];
    const json = new Map<number, string>();
    for (const { event, data } of out) {
      const i = data.index as number;
      if (event === "content_block_start") blocks[i] = { ...(data.content_block as Record<string, unknown>) };
      if (event !== "content_block_delta") continue;
      const d = data.delta as Record<string, string>;
      if (d.type === "text_delta") blocks[i]!.text += d.text!;
      if (d.type === "thinking_delta") blocks[i]!.thinking += d.thinking!;
      if (d.type === "input_json_delta") json.set(i, (json.get(i) ?? "") + d.partial_json);
    }
    for (const [i, j] of json) blocks[i]!.input = JSON.parse(j);
    return blocks;
  }

  it("thinking, text and a hermes3 call become [thinking, text, tool_use] with stop_reason tool_use", () => {
    const { out, unary } = run([]);
    expect(unary.content).toEqual([
      { type: "thinking", thinking: "need weather", signature: "" },
      // The text is the chat content as the parser keeps it (newlines touching text are text).
      { type: "text", text: "\nLet me check.\n" },
      { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } },
    ]);
    expect(unary.stop_reason).toBe("tool_use");
    expect(out.at(-2)!.data.delta).toEqual({ stop_reason: "tool_use", stop_sequence: null });
  });

  it("text after a call stays after it in the unary content too (the stream's block order)", () => {
    // Token by token, as an engine reports it (within one delta the session has no order between text and calls).
    const { out, unary } = run(Array.from({ length: textAfter.length - 1 }, (_, i) => i + 1), textAfter);
    expect(unary.content).toEqual([
      { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } },
      { type: "text", text: '{"temperature_c": 14}' },
    ]);
    expect(assemble(out)).toEqual(unary.content);
  });

  it.each([["think, text, call", output], ["call, then text", textAfter]])("%s: for any split of the model's text, the blocks a client assembles from the stream equal the unary content", (_, text) => {
    fc.assert(
      fc.property(fc.uniqueArray(fc.integer({ min: 1, max: text.length - 1 }), { maxLength: 12 }), (raw) => {
        const cuts = [...raw].sort((a, b) => a - b);
        const { out, unary } = run(cuts, text);
        expect(assemble(out)).toEqual(unary.content);
        // One block open at a time: each start follows the previous block's stop.
        const order = out.filter((e) => e.event === "content_block_start" || e.event === "content_block_stop").map((e) => `${e.event === "content_block_start" ? "+" : "-"}${String(e.data.index)}`);
        expect(order).toEqual(unary.content.flatMap((_, i) => [`+${i}`, `-${i}`]));
      }),
      { numRuns: 200 },
    );
  });
});

describe("Anthropic error envelope", () => {
  it.each([
    [invalidValue("x", "m"), "invalid_request_error"],
    [queueFull(), "rate_limit_error"],
    [engineError(), "api_error"],
  ])("%s → %s", (err, type) => {
    expect(toAnthropicErrorBody(err)).toEqual({ type: "error", error: { type, message: err.message } });
  });

  it("anything thrown that is not catalogued is an api_error with the fixed message", () => {
    expect(toAnthropicErrorBody(new Error("secret path /x"))).toEqual({ type: "error", error: { type: "api_error", message: "The server had an internal error while processing your request." } });
  });
});
