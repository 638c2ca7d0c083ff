import fc from "fast-check";
/**
 * Request parsing and encoders of the completions and Responses APIs, driven with session events directly: field
 * rules and refusals (400 naming the field), the legacy logprobs shape, echo, the Responses event order with
 * consecutive sequence numbers and its failure event.
 */
import { describe, expect, it } from "vitest";
import { engineError, KeelHttpError } from "../http/errors.js";
import type { Encoder } from "../requests/generate.js";
import type { SessionEvent } from "../requests/session/events.js";
import type { ResponseWriter } from "../http/sse.js";
import { completionEncoder, parseCompletionRequest } from "./completions.js";
import { completionLogprobs, TextOffsets } from "./logprobs.js";
import { parseResponsesRequest, responsesEncoder } from "./responses.js";

function reject(fn: () => unknown): KeelHttpError {
  try {
    fn();
  } catch (err) {
    if (err instanceof KeelHttpError) return err;
    throw err;
  }
  throw new Error("expected a rejection");
}

/** A writer that records what an encoder writes. */
function recorder() {
  const out: { event?: string; data: unknown }[] = [];
  const w = { data: (d: unknown) => void out.push({ data: d }), event: (event: string, d: unknown) => void out.push({ event, data: d }) } as unknown as ResponseWriter;
  return { out, w };
}

function play(enc: Encoder, events: SessionEvent[], w: ResponseWriter): void {
  for (const ev of events) if (ev.type !== "failed") enc.stream(ev, w);
}

const view = (token: string, logprob: number) => ({ token, logprob, bytes: [...Buffer.from(token)], top: [{ token, logprob, bytes: [...Buffer.from(token)] }, { token: "zz", logprob: logprob - 1, bytes: [122, 122] }] });

describe("completions request", () => {
  it("defaults: max_tokens 16, one prompt, no echo", () => {
    const r = parseCompletionRequest({ model: "m", prompt: "hi" });
    expect(r).toMatchObject({ prompts: ["hi"], maxTokens: 16, echo: false, n: 1, logprobs: null, stream: false });
    expect(parseCompletionRequest({ model: "m", prompt: ["a", "b"], n: 2, best_of: 2, logprobs: 3 })).toMatchObject({ prompts: ["a", "b"], n: 2, logprobs: 3 });
  });

  it.each([
    [{ model: "m" }, "missing_field", "prompt"],
    [{ model: "m", prompt: [] }, "invalid_value", "prompt"],
    [{ model: "m", prompt: [1, 2, 3] }, "unsupported_field", "prompt"],
    [{ model: "m", prompt: "x", suffix: "y" }, "unsupported_field", "suffix"],
    [{ model: "m", prompt: "x", best_of: 3 }, "unsupported_field", "best_of"],
    [{ model: "m", prompt: "x", echo: true, logprobs: 1 }, "unsupported_field", "logprobs"],
    [{ model: "m", prompt: "x", logprobs: true }, "invalid_value", "logprobs"],
    [{ model: "m", prompt: "x", logprobs: 21 }, "invalid_value", "logprobs"],
    [{ model: "m", prompt: "x", stream_options: { include_usage: true } }, "invalid_value", "stream_options"],
    // The default budget (16) is below min_tokens.
    [{ model: "m", prompt: "x", min_tokens: 17 }, "invalid_value", "min_tokens"],
  ])("%j → 400 %s on %s", (body, code, param) => {
    const e = reject(() => parseCompletionRequest(body));
    expect({ status: e.status, code: e.code, param: e.param }).toEqual({ status: 400, code, param });
  });
});

describe("completions encoder", () => {
  it("legacy logprobs: tokens, token_logprobs, top_logprobs as objects, text_offset advancing by token length", () => {
    const at = new TextOffsets(5);
    expect(completionLogprobs([view("ab", -0.1), view("c", -0.2)], at)).toEqual({ tokens: ["ab", "c"], token_logprobs: [-0.1, -0.2], top_logprobs: [{ ab: -0.1, zz: -1.1 }, { c: -0.2, zz: -1.2 }], text_offset: [5, 7] });
    // The same offsets carry on into the next chunk.
    expect(completionLogprobs([view("d", -0.3)], at).text_offset).toEqual([8]);
  });

  it("text_offset: a lone byte that never completes a character takes one U+FFFD, and the next token starts after it", () => {
    const part = (b: number) => ({ token: "\ufffd", logprob: -0.1, bytes: [b], top: [] });
    // "\xe2" (a 3-byte lead) followed by "y": the text is "x\ufffdy".
    const r = completionLogprobs([view("x", -0.1), part(0xe2), view("y", -0.2)], new TextOffsets(0));
    expect(r.text_offset).toEqual([0, 1, 2]);
    expect("x\ufffdy".slice(r.text_offset[2])).toBe("y");
  });

  it("text_offset of every self-contained token points at its text in the decoded whole (any split of any bytes)", () => {
    const token = fc.oneof(
      fc.string({ minLength: 1, maxLength: 4 }).map((t) => [...Buffer.from(t)]),
      fc.uint8Array({ minLength: 1, maxLength: 3 }).map((b) => [...b]),
    );
    fc.assert(
      fc.property(fc.array(token, { minLength: 1, maxLength: 12 }), (tokens) => {
        const views = tokens.map((bytes) => ({ token: new TextDecoder().decode(Uint8Array.from(bytes)), logprob: -1, bytes, top: [] }));
        const offsets = completionLogprobs(views, new TextOffsets(0)).text_offset;
        const whole = new TextDecoder().decode(Uint8Array.from(tokens.flat()));
        for (let i = 0; i < tokens.length; i++) {
          expect(offsets[i]).toBeGreaterThanOrEqual(i > 0 ? offsets[i - 1]! : 0);
          expect(offsets[i]).toBeLessThanOrEqual(whole.length);
          // A token that is valid UTF-8 on its own starts a character whatever came before (held-back bytes before
          // it decode on their own), so its text stands at its offset in the whole.
          let own: string | null = null;
          try {
            own = new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(tokens[i]!));
          } catch {
            own = null;
          }
          if (own !== null) expect(whole.slice(offsets[i]!).startsWith(own)).toBe(true);
        }
      }),
      { numRuns: 300 },
    );
  });

  it("text_offset follows the decoded text when a character is split over tokens; the sampled token is always in top_logprobs", () => {
    // "é" (c3 a9) split over two tokens, each shown as U+FFFD on its own; the text is "é x" (one char, then " x").
    const part = (b: number, logprob: number) => ({ token: "\ufffd", logprob, bytes: [b], top: [] });
    const r = completionLogprobs([part(0xc3, -0.1), part(0xa9, -0.2), view(" x", -0.3)], new TextOffsets(0));
    expect(r.text_offset).toEqual([0, 0, 1]);
    expect("é x".slice(r.text_offset[2])).toBe(" x");
    // logprobs: 0 asks for no alternatives, yet each position names its sampled token (OpenAI: up to logprobs+1).
    expect(r.top_logprobs[0]).toEqual({ "\ufffd": -0.1 });
  });

  it("streams an echo chunk per choice, deltas with offsets after the echoed prompt, a finish chunk, usage, and unary echoes", () => {
    const body = parseCompletionRequest({ model: "m", prompt: "Hey", echo: true, n: 2, stream: true, stream_options: { include_usage: true } });
    const enc = completionEncoder(body, "cmpl-1", "m", 1);
    const { out, w } = recorder();
    const fin: SessionEvent = { type: "finished", usage: { promptTokens: 2, completionTokens: 2 }, choices: [0, 1].map((i) => ({ index: i, text: "yo", reason: "length" as const, logprobs: [], completionTokens: 1, reasoning: null, toolCalls: [] })) };
    play(enc, [{ type: "started" }, { type: "delta", index: 1, content: "yo", logprobs: [] }, { type: "choice_finished", index: 1, reason: "length" }, fin], w);
    const choices = out.map((o) => (o.data as { choices: { index: number; text: string; finish_reason: string | null }[] }).choices);
    expect(choices).toEqual([
      [{ index: 0, text: "Hey", logprobs: null, finish_reason: null }],
      [{ index: 1, text: "Hey", logprobs: null, finish_reason: null }],
      [{ index: 1, text: "yo", logprobs: null, finish_reason: null }],
      [{ index: 1, text: "", logprobs: null, finish_reason: "length" }],
      [],
    ]);
    expect((out.at(-1)!.data as { usage: unknown }).usage).toEqual({ prompt_tokens: 2, completion_tokens: 2, total_tokens: 4 });
    const unary = enc.unary(fin as Extract<SessionEvent, { type: "finished" }>) as { object: string; choices: { text: string }[] };
    expect(unary.object).toBe("text_completion");
    expect(unary.choices.map((c) => c.text)).toEqual(["Heyyo", "Heyyo"]);
  });
});

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
    [{ model: "m", input: "x", store: true }, "unsupported_field", "store"],
    [{ model: "m", input: "x", reasoning: { effort: "low" } }, "unsupported_field", "reasoning"],
    [{ model: "m", input: "x", text: { format: { type: "json_object" } } }, "unsupported_field", "text"],
    [{ model: "m", input: "x", stream_options: {} }, "unsupported_field", "stream_options"],
    [{ model: "m", input: [{ type: "web_search_call", id: "x" }] }, "unsupported_field", "input[0].type"],
    [{ model: "m", input: [{ type: "function_call_output", output: "x" }] }, "missing_field", "input[0].call_id"],
    [{ model: "m", input: [{ type: "function_call", call_id: "c", arguments: "{}" }] }, "missing_field", "input[0].name"],
    [{ model: "m", input: [{ type: "function_call", call_id: "c", name: "f", arguments: { a: 1 } }] }, "invalid_value", "input[0].arguments"],
    [{ model: "m", input: "x", tools: [{ type: "web_search" }] }, "unsupported_field", "tools[0].type"],
    [{ model: "m", input: "x", tools: [{ type: "function", name: "f" }], tool_choice: { type: "function", name: "g" } }, "invalid_value", "tool_choice"],
    [{ model: "m", input: "x", max_tool_calls: 2 }, "unsupported_field", "max_tool_calls"],
    [{ model: "m", input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] }, "unsupported_field", "input[0].content[0].type"],
    [{ model: "m", input: "x", max_output_tokens: 0 }, "invalid_value", "max_output_tokens"],
  ])("%j → 400 %s on %s", (body, code, param) => {
    const e = reject(() => parseResponsesRequest(body));
    expect({ status: e.status, code: e.code, param: e.param }).toEqual({ status: 400, code, param });
  });
});

describe("responses request: function tools", () => {
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
        { type: "function_call_output", call_id: "call_2", output: "rain" },
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
});

describe("responses encoder", () => {
  const body = parseResponsesRequest({ model: "m", input: "hi", stream: true });

  it("streams the typed events in order with consecutive sequence numbers; the done events carry the whole text", () => {
    const enc = responsesEncoder(body, "resp_abc", "m", 1);
    const { out, w } = recorder();
    play(enc, [
      { type: "started" },
      { type: "delta", index: 0, content: "Hel", logprobs: [] },
      { type: "delta", index: 0, content: "", logprobs: [] },
      { type: "delta", index: 0, content: "lo", logprobs: [] },
      { type: "choice_finished", index: 0, reason: "stop" },
      { type: "finished", usage: { promptTokens: 3, completionTokens: 2 }, choices: [{ index: 0, text: "Hello", reason: "stop", logprobs: [], completionTokens: 2, reasoning: null, toolCalls: [] }] },
    ], w);
    expect(out.map((o) => o.event)).toEqual([
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
    const data = out.map((o) => o.data as Record<string, unknown>);
    expect(data.map((d) => d.sequence_number)).toEqual(data.map((_, i) => i));
    expect(data.map((d) => d.type)).toEqual(out.map((o) => o.event));
    expect(data[6]).toMatchObject({ text: "Hello" });
    expect(data[9]).toMatchObject({ response: { status: "completed", output: [{ content: [{ text: "Hello" }] }], usage: { input_tokens: 3, output_tokens: 2, total_tokens: 5 } } });
  });

  it("function calls: an output item per call after the message, argument deltas, done events, and the same items unary", () => {
    const tb = parseResponsesRequest({ model: "m", input: "hi", stream: true, tools: [{ type: "function", name: "f", parameters: { type: "object" } }] });
    const enc = responsesEncoder(tb, "resp_abc", "m", 1);
    const { out, w } = recorder();
    const fin: SessionEvent = {
      type: "finished",
      usage: { promptTokens: 3, completionTokens: 9 },
      choices: [{ index: 0, text: "ok", reason: "tool_calls", logprobs: [], completionTokens: 9, reasoning: null, toolCalls: [{ id: "call_x1", name: "f", arguments: '{"a":1}' }] }],
    };
    play(enc, [
      { type: "started" },
      { type: "delta", index: 0, content: "ok", logprobs: [], toolCalls: [{ index: 0, id: "call_x1", name: "f" }, { index: 0, arguments: '{"a":' }] },
      { type: "delta", index: 0, content: "", logprobs: [], toolCalls: [{ index: 0, arguments: "1}" }] },
      { type: "choice_finished", index: 0, reason: "tool_calls" },
      fin,
    ], w);
    expect(out.map((o) => o.event)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    const data = out.map((o) => o.data as Record<string, unknown>);
    expect(data.map((d) => d.sequence_number)).toEqual(data.map((_, i) => i));
    const callItem = { id: "fc_x1", type: "function_call", call_id: "call_x1", name: "f" };
    expect(data[5]).toMatchObject({ output_index: 1, item: { ...callItem, arguments: "", status: "in_progress" } });
    expect(data[11]).toMatchObject({ item_id: "fc_x1", output_index: 1, arguments: '{"a":1}' });
    const completed = data[13] as { response: { status: string; output: unknown[]; tools: unknown[] } };
    expect(completed.response.status).toBe("completed");
    expect(completed.response.output[1]).toEqual({ ...callItem, arguments: '{"a":1}', status: "completed" });
    expect(completed.response.tools).toEqual([{ type: "function", name: "f", description: null, parameters: { type: "object" }, strict: false }]);
    const unary = enc.unary(fin as Extract<SessionEvent, { type: "finished" }>) as { output: unknown[] };
    expect(unary.output).toEqual(completed.response.output);
  });

  it("a length finish is response.incomplete with reason max_output_tokens; a failure is response.failed followed by [DONE]", () => {
    const enc = responsesEncoder(body, "resp_abc", "m", 1);
    const { out, w } = recorder();
    play(enc, [{ type: "started" }, { type: "finished", usage: { promptTokens: 1, completionTokens: 4 }, choices: [{ index: 0, text: "abcd", reason: "length", logprobs: [], completionTokens: 4, reasoning: null, toolCalls: [] }] }], w);
    expect(out.at(-1)).toMatchObject({ event: "response.incomplete", data: { response: { status: "incomplete", incomplete_details: { reason: "max_output_tokens" } } } });
    const failed = recorder();
    const enc2 = responsesEncoder(body, "resp_abc", "m", 1);
    play(enc2, [{ type: "started" }], failed.w);
    enc2.streamError(engineError("boom"), failed.w);
    expect(failed.out.at(-1)).toMatchObject({ event: "response.failed", data: { sequence_number: 4, response: { status: "failed", error: { code: "engine_error" } } } });
    expect(enc2.doneAfterError).toBe(true);
  });
});
