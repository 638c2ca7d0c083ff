/**
 * The terminal record of an HTTP request (request-record.ts), as the output processor makes it when it forgets the
 * request: exactly one per request — finished, failed, or left by its client —, with its route, usage, TTFT, decode
 * rate and finish reason. The clock is faked (Date only), so the timings are exact.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { PROTOCOL_VERSION, type SamplingParams } from "../../protocol/messages.js";
import { notReady } from "../http/errors.js";
import type { ObservedEvent } from "./events.js";
import { ModelRequests } from "./model-requests.js";
import { GenerationSession } from "./session/session.js";
import { currentStep, out, step } from "../../../test/support/step-messages.js";

const params: SamplingParams = { maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: false };
const admitted = { promptTokens: [1, 2, 3], cachedTokens: 0 };
const T0 = Date.UTC(2026, 0, 1);

beforeEach(() => {
  vi.useFakeTimers({ toFake: ["Date"] });
  vi.setSystemTime(T0);
});
afterEach(() => vi.useRealTimers());

/** A request path with a fake engine; `at(ms)` moves the clock to T0 + ms. */
function setup() {
  const observed: ObservedEvent[] = [];
  const requests = new ModelRequests(() => true, (ev) => void observed.push(ev), currentStep);
  const open = (id: string, n: number, opts: { stop?: string[]; prompts?: string[] } = {}) => {
    const ids = n === 1 ? [id] : Array.from({ length: n }, (_, i) => `${id}-${i}`);
    const session = new GenerationSession({ childIds: ids, stop: opts.stop ?? [], includeStopStr: false, logprobs: false });
    const children = ids.map((c, i) => ({ id: c, prompt: { text: opts.prompts?.[i] ?? id }, params }));
    return requests.open(id, session, children, () => undefined, () => notReady(), "/v3/chat/completions");
  };
  const records = () => observed.filter((e) => e.type === "request_done");
  const at = (ms: number) => vi.setSystemTime(T0 + ms);
  return { requests, observed, open, records, at };
}

describe("the terminal record of an HTTP request", () => {
  it("a finished request: one record with its route, usage, TTFT, decode rate and finish reason", () => {
    const t = setup();
    t.open("a", 1);
    t.at(10);
    t.requests.handleStep(step(out("a", { admitted })));
    t.at(50);
    t.requests.handleStep(step(out("a", { tokens: [7], text: "x" })));
    t.at(250);
    t.requests.handleStep(step(out("a", { tokens: [8, 9, 10, 11], text: "yyyy", finish: { reason: "length", promptTokens: 3, completionTokens: 5 } })));
    // 4 tokens after the first, in the 200 ms after it: 20 tok/s.
    expect(t.records()).toEqual([
      { type: "request_done", requestId: "a", route: "/v3/chat/completions", promptTokens: 3, completionTokens: 5, ttftMs: 50, e2eMs: 250, tokPerS: 20, finishReason: "length", clientGone: false },
    ]);
  });

  it("n choices are one record: the prompt counted once, completions summed, each reason named once", () => {
    const t = setup();
    t.open("n", 2, { stop: ["!"] });
    t.requests.handleStep(step(out("n-0", { admitted }), out("n-1", { admitted })));
    t.at(40);
    t.requests.handleStep(step(out("n-0", { tokens: [1], text: "a" }), out("n-1", { tokens: [1], text: "b" })));
    t.at(140);
    // n-0 meets its stop string (aborted by the gateway, released later); n-1 runs to its budget.
    t.requests.handleStep(step(out("n-0", { tokens: [2], text: "!" }), out("n-1", { tokens: [2, 3], text: "cd", finish: { reason: "length", promptTokens: 3, completionTokens: 3 } })));
    expect(t.records()).toEqual([]); // n-0 is not released yet: the request is not over
    t.at(160);
    t.requests.handleStep(step(out("n-0", { finish: { reason: "abort", promptTokens: 3, completionTokens: 2 } })));
    expect(t.records()).toEqual([expect.objectContaining({ requestId: "n", promptTokens: 3, completionTokens: 5, ttftMs: 40, e2eMs: 160, finishReason: "stop,length", clientGone: false })]);
  });

  it("without a finished session, usage comes from the children: each distinct prompt counted once, completions summed", () => {
    const t = setup();
    t.open("p", 2, { prompts: ["first prompt", "second prompt"] });
    t.requests.handleStep(step(out("p-0", { admitted }), out("p-1", { admitted: { promptTokens: [1, 2, 3, 4, 5], cachedTokens: 0 } })));
    t.requests.clientGone("p");
    t.requests.handleStep(step(out("p-0", { finish: { reason: "abort", promptTokens: 3, completionTokens: 0 } }), out("p-1", { finish: { reason: "abort", promptTokens: 5, completionTokens: 0 } })));
    expect(t.records()).toEqual([expect.objectContaining({ requestId: "p", promptTokens: 8, completionTokens: 0, finishReason: "abort", clientGone: true })]);
    // n choices of one prompt, left by their client: the shared prompt is counted once, the completions summed.
    t.open("q", 2);
    t.requests.handleStep(step(out("q-0", { admitted }), out("q-1", { admitted })));
    t.requests.handleStep(step(out("q-0", { tokens: [1], text: "a" }), out("q-1", { tokens: [1, 2], text: "bc" })));
    t.requests.clientGone("q");
    t.requests.handleStep(step(out("q-0", { finish: { reason: "abort", promptTokens: 3, completionTokens: 1 } }), out("q-1", { finish: { reason: "abort", promptTokens: 3, completionTokens: 2 } })));
    expect(t.records().at(-1)).toEqual(expect.objectContaining({ requestId: "q", promptTokens: 3, completionTokens: 3 }));
  });

  it("a client that went away: one record, finish abort, clientGone, the abort's latency in steps", () => {
    const t = setup();
    t.open("gone", 1);
    t.requests.handleStep(step(out("gone", { admitted })));
    t.at(30);
    t.requests.handleStep(step(out("gone", { tokens: [1], text: "a" })));
    t.requests.clientGone("gone");
    t.requests.clientGone("gone"); // a second report of the same departure changes nothing
    t.at(90);
    t.requests.handleStep(step(out("gone", { tokens: [2], text: "b", finish: { reason: "abort", promptTokens: 3, completionTokens: 2, stepsAfterAbort: 1 } })));
    expect(t.records()).toEqual([
      { type: "request_done", requestId: "gone", route: "/v3/chat/completions", promptTokens: 3, completionTokens: 2, ttftMs: 30, e2eMs: 90, tokPerS: 16.7, finishReason: "abort", clientGone: true, abortLatencySteps: 1 },
    ]);
  });

  it("a client gone before admission: the record has no first token and no rate", () => {
    const t = setup();
    t.open("early", 1);
    t.requests.clientGone("early");
    t.at(5);
    t.requests.handleStep(step(out("early", { finish: { reason: "abort", promptTokens: 0, completionTokens: 0 } })));
    expect(t.records()).toEqual([expect.objectContaining({ requestId: "early", ttftMs: null, tokPerS: null, finishReason: "abort", clientGone: true })]);
  });

  it("a failed request: one record with the error its client got; its aborted siblings add none", () => {
    const t = setup();
    t.open("f", 2);
    t.requests.handleStep(step(out("f-0", { admitted }), out("f-1", { admitted })));
    t.requests.handleStep(step(out("f-0", { finish: { reason: "error", promptTokens: 3, completionTokens: 0, error: { code: "engine_error", message: "decode failed" } } })));
    expect(t.records()).toEqual([]);
    t.requests.handleStep(step(out("f-1", { finish: { reason: "abort", promptTokens: 3, completionTokens: 0 } })));
    expect(t.records()).toEqual([expect.objectContaining({ requestId: "f", finishReason: "error", clientGone: false, error: { code: "engine_error", status: 500, message: "The inference engine failed: decode failed" } })]);
  });

  it("a request refused by the engine (context length) and one the engine was gone for are recorded too, once each", () => {
    const t = setup();
    t.open("long", 1);
    t.requests.handleRequestError({ v: PROTOCOL_VERSION, type: "request_error", id: "long", code: "context_length_exceeded", message: "too long" });
    const gone = new ModelRequests(() => false, (ev) => void t.observed.push(ev));
    gone.open("late", new GenerationSession({ childIds: ["late"], stop: [], includeStopStr: false, logprobs: false }), [{ id: "late", prompt: { text: "x" }, params }], () => undefined, () => notReady(), "/v1/completions");
    expect(t.records().map((r) => [r.requestId, r.route, r.finishReason, r.error?.status, r.error?.code])).toEqual([
      ["long", "/v3/chat/completions", "error", 400, "context_length_exceeded"],
      ["late", "/v1/completions", "error", 503, "not_ready"],
    ]);
  });

  it("an engine death does not end a request: it is resumed, and recorded once when it finishes", () => {
    const t = setup();
    t.open("r", 1);
    t.requests.handleStep(step(out("r", { admitted })));
    t.requests.handleStep(step(out("r", { tokens: [1], text: "a" })));
    t.requests.applyEngineExit({ kind: "restart", verdict: { reason: "signal", blame: false }, description: "SIGKILL" });
    t.requests.resumeRecovering();
    expect(t.records()).toEqual([]);
    t.requests.handleStep(step(out("r", { admitted }), out("r", { tokens: [2], text: "b", finish: { reason: "stop", promptTokens: 3, completionTokens: 2 } })));
    expect(t.records()).toEqual([expect.objectContaining({ requestId: "r", completionTokens: 2, finishReason: "stop" })]);
  });
});
