import fc from "fast-check";
/**
 * Request parsing and encoders of the completions API, driven with session events directly: field rules and
 * refusals (400 naming the field), the legacy logprobs shape, echo. (The Responses API: responses.test.ts.)
 */
import { describe, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import type { Encoder } from "../requests/generate.js";
import type { SessionEvent } from "../requests/session/events.js";
import type { ResponseWriter } from "../http/sse.js";
import { completionEncoder, parseCompletionRequest } from "./completions.js";
import { completionLogprobs, TextOffsets } from "./logprobs.js";

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
