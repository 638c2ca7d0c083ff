/**
 * The output processor and the one place its outcomes are applied (model-requests.ts), with a fake engine channel:
 * events are delivered per HTTP request after the step, aborts decided in the step (a stop string) and during its
 * delivery (a client found gone) are applied once each, after every event was delivered; a session that throws
 * fails only its own request.
 */
import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION, type GatewayMessage, type SamplingParams } from "../../protocol/messages.js";
import { notReady } from "../http/errors.js";
import type { OutputParser } from "../parsers/types.js";
import type { ObservedEvent } from "./events.js";
import { ModelRequests } from "./model-requests.js";
import { GenerationSession } from "./session/session.js";
import { out, step } from "../../../test/support/step-messages.js";
import type { SessionEvent } from "./session/events.js";

const params: SamplingParams = { maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: false };
const admitted = { promptTokens: [1, 2], cachedTokens: 0 };

/** A request path whose engine records what it is sent, in one log with what each writer was given. */
function setup() {
  const log: string[] = [];
  const sent: GatewayMessage[] = [];
  const observed: ObservedEvent[] = [];
  const requests = new ModelRequests(
    (m) => {
      sent.push(m);
      if (m.type === "abort") log.push(`abort ${m.ids.join(",")}`);
      return true;
    },
    (ev) => void observed.push(ev),
  );
  const delivered = new Map<string, SessionEvent[]>();
  /** Open HTTP request `id` with `n` children; `onDeliver` runs inside its writer (e.g. it finds the client gone). */
  const open = (id: string, n: number, opts: { stop?: string[]; parser?: () => OutputParser; onDeliver?: () => void } = {}) => {
    const ids = n === 1 ? [id] : Array.from({ length: n }, (_, i) => `${id}-${i}`);
    const session = new GenerationSession({ childIds: ids, stop: opts.stop ?? [], includeStopStr: false, logprobs: false, ...(opts.parser ? { parser: opts.parser } : {}) });
    const children = ids.map((c) => ({ id: c, prompt: { text: id }, params }));
    return requests.open(
      id,
      session,
      children,
      (events) => {
        log.push(`deliver ${id} ${events.map((e) => e.type).join(",")}`);
        delivered.set(id, [...(delivered.get(id) ?? []), ...events]);
        opts.onDeliver?.();
      },
      () => notReady(),
      "/v3/chat/completions",
    );
  };
  const cancels = () => observed.flatMap((e) => (e.type === "cancelled" ? [`${e.id} ${e.cause}`] : []));
  return { requests, log, sent, observed, delivered, open, cancels };
}

describe("aborts are applied after the step", () => {
  it("a stop-string abort and a client disconnect in the same step are both applied once, after the step's events were delivered", () => {
    const t = setup();
    // x: two choices, one of which hits a stop string this step; x's client is found gone while that step's events
    // are written (its write fails). y: one choice, also stopped by a stop string in the same step.
    let gone = false;
    expect(t.open("x", 2, { stop: ["!"], onDeliver: () => void (gone || ((gone = true), t.requests.clientGone("x"), t.requests.clientGone("x"))) })).toBe(true);
    expect(t.open("y", 1, { stop: ["!"] })).toBe(true);
    t.log.length = 0;
    t.requests.handleStep(step(out("x-0", { admitted, tokens: [5], text: "hi!" }), out("x-1", { admitted, tokens: [6], text: "ho" }), out("y", { admitted, tokens: [7], text: "yes!" })));
    // 1. Every event of the step was delivered before any abort went out; 2. one abort message per engine request.
    expect(t.log).toEqual(["deliver x started,delta,choice_finished,delta", "deliver y started,delta,choice_finished,finished", "abort x-0", "abort y", "abort x-1"]);
    expect(t.cancels()).toEqual(["x-0 stop_string", "y stop_string", "x-1 client_disconnect"]);
    // Nothing more for x: its client left (no `finished` was delivered to it).
    expect(t.delivered.get("x")!.map((e) => e.type)).toEqual(["started", "delta", "choice_finished", "delta"]);
    // The engine confirms the releases: the disconnect is counted once, in the furthest phase.
    t.requests.handleStep(step(out("x-0", { finish: { reason: "abort", promptTokens: 2, completionTokens: 1 } }), out("x-1", { finish: { reason: "abort", promptTokens: 2, completionTokens: 1 } })));
    expect(t.observed.filter((e) => e.type === "client_disconnect_released")).toEqual([{ type: "client_disconnect_released", requestId: "x", phase: "decode" }]);
    expect(t.sent.filter((m) => m.type === "abort")).toHaveLength(3);
    expect(t.requests.size).toBe(1); // y waits for its own release
  });

  it("a client that leaves between steps is aborted at once, each child once", () => {
    const t = setup();
    t.open("z", 2);
    t.requests.clientGone("z");
    t.requests.clientGone("z");
    expect(t.sent.filter((m) => m.type === "abort")).toEqual([
      { v: PROTOCOL_VERSION, type: "abort", ids: ["z-0"] },
      { v: PROTOCOL_VERSION, type: "abort", ids: ["z-1"] },
    ]);
    expect(t.observed.filter((e) => e.type === "client_disconnect")).toEqual([{ type: "client_disconnect", requestId: "z", children: 2 }]);
  });
});

describe("a gateway-side failure serving one request", () => {
  const throwing = (): OutputParser => ({
    push: () => {
      throw new Error("socket write failed");
    },
    finish: () => ({}),
    result: () => ({ content: "", reasoning: null, toolCalls: [] }),
  });

  it("fails only its own request: one abort, an error answer, other requests unaffected, released as error", () => {
    const t = setup();
    t.open("bad", 1, { parser: throwing });
    t.open("good", 1);
    expect(() => t.requests.handleStep(step(out("bad", { admitted, tokens: [2], text: "b" }), out("good", { admitted, tokens: [3], text: "g" })))).not.toThrow();
    expect(t.delivered.get("good")!.map((e) => e.type)).toEqual(["started", "delta"]);
    expect(t.sent.filter((m) => m.type === "abort")).toEqual([{ v: PROTOCOL_VERSION, type: "abort", ids: ["bad"] }]);
    const failed = t.delivered.get("bad")!.filter((e) => e.type === "failed");
    expect(failed).toHaveLength(1);
    expect(failed[0]).toMatchObject({ error: { status: 500, message: expect.stringContaining("socket write failed") } });
    expect(t.observed.some((e) => e.type === "internal_error" && e.id === "bad" && e.message.includes("socket write failed"))).toBe(true);
    expect(t.cancels()).toEqual(["bad internal_error"]);
    // The entry stays until the engine confirms; then it ends as error, and its client is told nothing more.
    expect(t.requests.size).toBe(2);
    t.requests.handleStep(step(out("bad", { finish: { reason: "abort", promptTokens: 1, completionTokens: 1 } })));
    expect(t.requests.size).toBe(1);
    expect(t.delivered.get("bad")!.filter((e) => e.type === "failed")).toHaveLength(1);
    expect(t.observed.find((e) => e.type === "finished" && e.id === "bad")).toMatchObject({ reason: "error", phase: "decode", released: true });
  });

  it("a request being cancelled is not given its output, so nothing throws and nothing is reported", () => {
    const t = setup();
    t.open("a", 1, { parser: throwing });
    t.requests.clientGone("a");
    t.requests.handleStep(step(out("a", { tokens: [1], text: "x" })));
    expect(t.delivered.get("a")).toBeUndefined();
    expect(t.observed.filter((e) => e.type === "internal_error")).toEqual([]);
  });

  it("a writer that throws fails its own request alone: its children are aborted after the step, the others go on", () => {
    const t = setup();
    const given: SessionEvent[][] = [];
    t.requests.open("w", new GenerationSession({ childIds: ["w-0", "w-1"], stop: [], includeStopStr: false, logprobs: false }), ["w-0", "w-1"].map((id) => ({ id, prompt: { text: "w" }, params })), (evs) => {
      given.push([...evs]);
      throw new Error("EPIPE");
    }, () => notReady(), "/v3/chat/completions");
    t.open("ok", 1);
    t.log.length = 0;
    t.requests.handleStep(step(out("w-0", { admitted }), out("ok", { admitted })));
    expect(t.delivered.get("ok")!.map((e) => e.type)).toEqual(["started"]);
    expect(t.observed).toContainEqual({ type: "internal_error", id: "w", message: "internal error while serving the request: EPIPE" });
    // The writer was offered the failure once, then dropped; both children were released after the step.
    expect(given.map((evs) => evs.map((e) => e.type))).toEqual([["started"], ["failed"]]);
    expect(t.log).toEqual(["deliver ok started", "abort w-0", "abort w-1"]);
    expect(t.cancels()).toEqual(["w-0 internal_error", "w-1 internal_error"]);
    t.requests.handleStep(step(out("w-0", { tokens: [1], text: "late" })));
    expect(given).toHaveLength(2);
  });
});

describe("opening a request", () => {
  it("an engine that went away midway: the request fails with the 503 and the children already submitted are released", () => {
    const t = setup();
    let first = true;
    const requests = new ModelRequests((m) => {
      t.sent.push(m);
      if (m.type === "add" && !first) return false;
      first = false;
      return true;
    }, (ev) => void t.observed.push(ev));
    const got: SessionEvent[] = [];
    const session = new GenerationSession({ childIds: ["r-0", "r-1"], stop: [], includeStopStr: false, logprobs: false });
    const ok = requests.open("r", session, ["r-0", "r-1"].map((id) => ({ id, prompt: { text: "r" }, params })), (evs) => void got.push(...evs), () => notReady(), "/v3/chat/completions");
    expect(ok).toBe(false);
    expect(got).toEqual([{ type: "failed", error: expect.objectContaining({ status: 503, code: "not_ready" }) }]);
    expect(t.sent.filter((m) => m.type === "abort")).toEqual([{ v: PROTOCOL_VERSION, type: "abort", ids: ["r-0"] }]);
    expect(t.cancels()).toEqual(["r-0 sibling_failed"]);
  });
});

describe("recovery's decisions reach the clients through the same path", () => {
  const failedWith = (evs: SessionEvent[] | undefined) => evs?.filter((e) => e.type === "failed").map((e) => (e.type === "failed" ? [e.error.status, e.error.code] : []));

  it("an engine that cannot start fails every open request (500 engine_fault); the shutdown's exit answers 503 shutting_down", () => {
    const t = setup();
    t.open("a", 2);
    t.requests.applyEngineExit({ kind: "unrecoverable", verdict: { reason: "exit", blame: true }, failedStarts: 5, description: "the engine failed to start 5 times in a row" });
    expect(failedWith(t.delivered.get("a"))).toEqual([[500, "engine_fault"]]);
    expect(t.requests.size).toBe(0);
    t.open("b", 1);
    t.requests.applyEngineExit({ kind: "shutdown" });
    expect(failedWith(t.delivered.get("b"))).toEqual([[503, "shutting_down"]]);
  });

  it("a culprit isolated by group testing fails alone with engine_fault; its bystander is resumed and finishes", () => {
    const t = setup();
    t.open("killer", 1);
    const death = { kind: "restart", verdict: { reason: "signal", blame: true }, description: "SIGABRT" } as const;
    for (let i = 0; i < 3 && !t.delivered.get("killer")?.some((e) => e.type === "failed"); i++) {
      t.requests.applyEngineExit(death);
      t.requests.resumeRecovering();
    }
    expect(failedWith(t.delivered.get("killer"))).toEqual([[500, "engine_fault"]]);
    expect(t.observed.filter((e) => e.type === "culprit").map((e) => e.id)).toEqual(["killer"]);
  });

  it("a drain's end answers every open request 503 and aborts each child once, after the events", () => {
    const t = setup();
    t.open("d", 2);
    t.log.length = 0;
    expect(t.requests.endAll("The server is shutting down.")).toBe(2);
    expect(t.log).toEqual(["deliver d failed", "abort d-0", "abort d-1"]);
    expect(failedWith(t.delivered.get("d"))).toEqual([[503, "shutting_down"]]);
  });
});
