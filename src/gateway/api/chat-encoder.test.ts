/**
 * The chat encoder's shapes with reasoning and tool calls (issue #9): stream chunks `{reasoning_content}`,
 * `{content}`, a call's first `{tool_calls:[{index, id, type, function:{name, arguments}}]}` then argument fragments;
 * unary `message` with `content` null only when empty with calls, `reasoning_content`/`tool_calls` only when present.
 */
import { describe, expect, it } from "vitest";
import type { SessionEvent } from "../requests/session/events.js";
import type { ResponseWriter } from "../http/sse.js";
import { chatEncoder } from "./chat.js";

function record() {
  const out: unknown[] = [];
  const w = { data: (d: unknown) => void out.push(d) } as unknown as ResponseWriter;
  return { out, w };
}

const enc = () => chatEncoder({ n: 1, includeUsage: false, logprobs: null }, "chatcmpl-1", "m", 7);
const choiceOf = (chunk: unknown) => (chunk as { choices: { delta: Record<string, unknown>; finish_reason: string | null }[] }).choices[0]!;

describe("chat encoder with reasoning and tool calls", () => {
  it("streams reasoning, content and tool-call fragments as separate OpenAI deltas", () => {
    const { out, w } = record();
    const e = enc();
    const events: SessionEvent[] = [
      { type: "delta", index: 0, content: "", logprobs: [], reasoning: "hmm" },
      { type: "delta", index: 0, content: "Sure. ", logprobs: [], toolCalls: [{ index: 0, id: "call_a", name: "get_weather" }, { index: 0, arguments: '{"city":' }] },
      { type: "delta", index: 0, content: "", logprobs: [], toolCalls: [{ index: 0, arguments: '"Paris"}' }, { index: 1, id: "call_b", name: "now", arguments: "{}" }] },
      { type: "choice_finished", index: 0, reason: "tool_calls" },
    ];
    for (const ev of events) if (ev.type !== "failed") e.stream(ev, w);
    expect(out.map((c) => choiceOf(c).delta)).toEqual([
      { reasoning_content: "hmm" },
      { content: "Sure. " },
      { tool_calls: [{ index: 0, id: "call_a", type: "function", function: { name: "get_weather", arguments: "" } }] },
      { tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] },
      { tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] },
      { tool_calls: [{ index: 1, id: "call_b", type: "function", function: { name: "now", arguments: "{}" } }] },
      {},
    ]);
    expect(choiceOf(out.at(-1)).finish_reason).toBe("tool_calls");
    // Argument fragments of each call concatenate to its arguments.
    const args = (i: number) =>
      out
        .flatMap((c) => (choiceOf(c).delta.tool_calls as { index: number; function: { arguments?: string } }[] | undefined) ?? [])
        .filter((t) => t.index === i)
        .map((t) => t.function.arguments ?? "")
        .join("");
    expect([args(0), args(1)]).toEqual(['{"city":"Paris"}', "{}"]);
  });

  it("unary: content null when empty with calls; reasoning_content and tool_calls only when present", () => {
    const e = enc();
    const body = e.unary({
      type: "finished",
      usage: { promptTokens: 3, completionTokens: 5 },
      choices: [
        { index: 0, text: "", reasoning: "r", toolCalls: [{ id: "call_a", name: "f", arguments: '{"x":1}' }], reason: "tool_calls", logprobs: [], completionTokens: 5 },
      ],
    }) as { choices: { message: unknown; finish_reason: string }[] };
    expect(body.choices[0]).toMatchObject({
      finish_reason: "tool_calls",
      message: { role: "assistant", content: null, reasoning_content: "r", tool_calls: [{ id: "call_a", type: "function", function: { name: "f", arguments: '{"x":1}' } }] },
    });
    const plain = e.unary({
      type: "finished",
      usage: { promptTokens: 3, completionTokens: 1 },
      choices: [{ index: 0, text: "", reasoning: null, toolCalls: [], reason: "stop", logprobs: [], completionTokens: 1 }],
    }) as { choices: { message: unknown }[] };
    expect(plain.choices[0]!.message).toEqual({ role: "assistant", content: "" });
  });
});
