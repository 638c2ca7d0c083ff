/**
 * The generation pipeline (generate.ts + the response writer) driven through the chat route with a real registry
 * and a fake engine channel: the stream backpressure bound (a client that stops reading is dropped past
 * `maxUnreadBytes` — loopback buffers absorb more than the tiny model generates, so this is tested here), `n`
 * children released together when the client leaves, `n` counted by the queue bound, a stop string's engine abort,
 * and a pipelined request (whose response has no socket yet) not taken for a disconnect. Then runGeneration driven
 * directly with a fake registry and a recording encoder: admission refusals (503/429 with retry-after, the `n`
 * bound, an isolated prompt), children of a prompt list, a submit refused midway, failures streaming vs unary,
 * the logprobs flag, a client already gone at the start, and the disconnect counted once.
 */
import { EventEmitter } from "node:events";
import pino from "pino";
import { describe, expect, it } from "vitest";
import type { FastifyReply, FastifyRequest } from "fastify";
import { PROTOCOL_VERSION, type EngineCapabilities, type FinishInfo, type GatewayMessage, type SamplingParams, type StepMessage } from "../../protocol/messages.js";
import { CHATML_TEMPLATE } from "../../model/chat-templates.js";
import { handleChat } from "../api/chat.js";
import type { RouteContext } from "../http/route-context.js";
import type { AgentSettings } from "../models/agent-config.js";
import { ChatTemplate } from "../models/chat-template.js";
import { engineFault, notReady, type KeelHttpError } from "../http/errors.js";
import { admissionError, childIds, runGeneration, type Encoder, type GenerationPlan } from "./generate.js";
import type { SessionEvent } from "./session/events.js";
import type { FinishReason, Phase } from "./lifecycle.js";
import { ModelRequests } from "./model-requests.js";
import type { ObservedEvent } from "./events.js";
import { markReceived } from "../http/received-at.js";

/** A response whose client never reads: every write stays in the unsent buffer. */
class StalledResponse extends EventEmitter {
  writableLength = 0;
  destroyed = false;
  socket = { destroyed: false };
  writableCorked = 0;
  writeHead(): this {
    return this;
  }
  cork(): void {
    this.writableCorked += 1;
  }
  uncork(): void {
    this.writableCorked = Math.max(0, this.writableCorked - 1);
  }
  write(chunk: string): boolean {
    this.writableLength += Buffer.byteLength(chunk);
    return false;
  }
  end(): void {
    this.emit("close");
  }
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    this.socket.destroyed = true;
    this.emit("close");
  }
}

/** The server's answers a test may change, one field each (built into a {@link RouteContext} by {@link contextOf}). */
interface Server {
  requests: ModelRequests;
  vocabSize: number;
  capabilities: EngineCapabilities;
  isReady: () => boolean;
  maxNumSeqs: number;
  maxQueuedRequests: number;
  maxUnreadBytes: number;
  isKnownCulprit: (prompt: string) => boolean;
  rejected: (why: "queue_full" | "not_ready") => void;
  agents: () => AgentSettings;
  /** The first-token phases the route recorded, in order. */
  ttftPhases: { phase: string; seconds: number }[];
}

/** The route context of a model named "m" whose engine answers as `s` says. */
function contextOf(s: Server): RouteContext {
  const template = new ChatTemplate(CHATML_TEMPLATE, { bosToken: "", eosToken: "" });
  return {
    model: { name: "m", aliases: [], created: 0, served: () => ["m"], agents: s.agents, requests: s.requests, maxQueuedRequests: s.maxQueuedRequests, maxUnreadBytes: s.maxUnreadBytes, isKnownCulprit: s.isKnownCulprit },
    engine: () => (s.isReady() ? { template, capabilities: s.capabilities, maxModelLen: 1000, maxNumSeqs: s.maxNumSeqs, vocabSize: s.vocabSize, tokenize: async () => [] } : null),
    unavailable: () => notReady(),
    rejected: (why) => s.rejected(why),
    ttftPhase: (phase, seconds) => s.ttftPhases.push({ phase, seconds }),
    log: pino({ level: "silent" }),
  };
}

function setup(maxUnreadBytes: number, body: Record<string, unknown> = {}, over: Partial<Server> = {}, refuseSubmitOf: string | null = null) {
  const sent: GatewayMessage[] = [];
  /** What metrics read: disconnects counted (in their phase), guides dropped, and every cancel with its cause. */
  const disconnects: string[] = [];
  const observed: ObservedEvent[] = [];
  const res = new StalledResponse();
  /** Bytes the client had been sent when metrics saw each event (the writes go first). */
  const writtenWhenObserved: { type: string; bytes: number }[] = [];
  const registry = new ModelRequests(
    (m) => {
      if (m.type === "add" && m.id === refuseSubmitOf) return false;
      sent.push(m);
      return true;
    },
    (ev) => {
      observed.push(ev);
      writtenWhenObserved.push({ type: ev.type, bytes: res.writableLength });
      if (ev.type === "client_disconnect_released" && ev.phase) disconnects.push(ev.phase);
    },
  );
  const server: Server = {
    requests: registry,
    vocabSize: 100,
    capabilities: { exactSeededResume: true, maxTopLogprobs: 5, extendedSampling: true, grammars: false, sharedPrefill: false },
    isReady: () => true,
    maxNumSeqs: 4,
    maxQueuedRequests: 10,
    maxUnreadBytes,
    isKnownCulprit: () => false,
    rejected: () => undefined,
    ttftPhases: [],
    agents: () => ({ toolParser: null, reasoningParser: null, guideAuto: false, toolParserSource: "none" }),
    ...over,
  };
  const ctx = contextOf(server);
  const reply = { hijack() {}, raw: res, header() { return reply; } } as unknown as FastifyReply;
  const reqSocket = Object.assign(new EventEmitter(), { destroyed: false });
  const req = { body: { model: "m", messages: [{ role: "user", content: "hi" }], stream: true, temperature: 0, ...body }, raw: { socket: reqSocket, destroyed: false }, routeOptions: { url: "/v3/chat/completions" } } as unknown as FastifyRequest;
  // Received (the app's first hook) 5 ms before the route runs.
  const realNow = performance.now.bind(performance);
  const before = realNow() - 5;
  performance.now = () => before;
  markReceived(req.raw);
  performance.now = realNow;
  return { ctx, server, res, reply, req, sent, disconnects, observed, writtenWhenObserved, registry };
}

const step = (n: number, outputs: StepMessage["outputs"]): StepMessage => ({
  v: PROTOCOL_VERSION, type: "step", step: n, batchTokens: 1, outputs,
  stats: { waiting: 0, running: 1, activeSequences: 1, cachedSequences: 0, prefixCacheHitTokens: 0 },
});

describe("stream backpressure bound", () => {
  it("a client that stops reading is dropped once its unsent output passes maxUnreadBytes, and its request aborted", async () => {
    const t = setup(4096);
    await handleChat(t.ctx, t.req, t.reply);
    const add = t.sent.find((m) => m.type === "add")!;
    const id = (add as { id: string }).id;
    t.registry.handleStep(step(1, [{ id, admitted: { promptTokens: [1, 2], cachedTokens: 0 }, tokens: [], text: "" }]));
    let n = 1;
    while (!t.res.destroyed && n < 1000) t.registry.handleStep(step(++n, [{ id, tokens: [65], text: "some text " }]));
    expect(t.res.destroyed).toBe(true);
    // Dropped as soon as the bound was passed, not at the end: about 4 KiB of ~200-byte chunks.
    expect(n).toBeLessThan(60);
    expect(t.res.writableLength).toBeGreaterThan(4096);
    expect(t.sent.filter((m) => m.type === "abort")).toEqual([{ v: PROTOCOL_VERSION, type: "abort", ids: [id] }]);
    // Counted once the engine confirms the release.
    expect(t.disconnects).toEqual([]);
    t.registry.handleStep(step(++n, [{ id, tokens: [], text: "", finish: { reason: "abort", promptTokens: 2, completionTokens: n } }]));
    expect(t.disconnects).toEqual(["decode"]);
    // Its one terminal record names its route and says its client went away.
    expect(t.observed.filter((e) => e.type === "request_done")).toEqual([expect.objectContaining({ requestId: id, route: "/v3/chat/completions", finishReason: "abort", clientGone: true })]);
  });

  it("a client that reads keeps its stream however long it is", async () => {
    const t = setup(4096);
    // Every write is flushed at once (the client reads).
    t.res.write = (chunk: string): boolean => chunk.length >= 0;
    await handleChat(t.ctx, t.req, t.reply);
    const id = (t.sent.find((m) => m.type === "add") as { id: string }).id;
    t.registry.handleStep(step(1, [{ id, admitted: { promptTokens: [1, 2], cachedTokens: 0 }, tokens: [], text: "" }]));
    for (let n = 2; n < 500; n++) t.registry.handleStep(step(n, [{ id, tokens: [65], text: "some text " }]));
    expect(t.res.destroyed).toBe(false);
    expect(t.disconnects).toEqual([]);
    expect(t.sent.some((m) => m.type === "abort")).toBe(false);
  });
});

const idsOf = (sent: GatewayMessage[]): string[] => sent.flatMap((m) => (m.type === "add" ? [m.id] : []));
const aborted = (sent: GatewayMessage[]): string[] => sent.flatMap((m) => (m.type === "abort" ? m.ids : []));
const admit = (id: string) => ({ id, admitted: { promptTokens: [1, 2], cachedTokens: 0 }, tokens: [], text: "" });

describe("n > 1", () => {
  it("submits one engine request per choice with distinct deterministic seeds, and a client that leaves releases every child", async () => {
    const t = setup(1 << 20, { n: 3, seed: 7 });
    await handleChat(t.ctx, t.req, t.reply);
    const adds = t.sent.filter((m) => m.type === "add");
    const ids = idsOf(t.sent);
    expect(ids).toHaveLength(3);
    expect(ids.map((id) => id.slice(-2))).toEqual(["-0", "-1", "-2"]);
    const seeds = adds.map((m) => (m.type === "add" ? m.params.seed : -1));
    expect(seeds[0]).toBe(7);
    expect(new Set(seeds).size).toBe(3);
    // Same request again: the same seeds.
    const again = setup(1 << 20, { n: 3, seed: 7 });
    await handleChat(again.ctx, again.req, again.reply);
    expect(again.sent.filter((m) => m.type === "add").map((m) => (m.type === "add" ? m.params.seed : -1))).toEqual(seeds);
    // Child 1 is admitted and decoding, the others queued; the client leaves.
    t.registry.handleStep(step(1, [admit(ids[1]!), { id: ids[1]!, tokens: [5], text: "x" }]));
    t.res.destroy();
    expect(aborted(t.sent).sort()).toEqual([...ids].sort());
    // One disconnect, counted when the last child is released, in the furthest phase reached.
    const release = (id: string) => ({ id, tokens: [], text: "", finish: { reason: "abort" as const, promptTokens: 2, completionTokens: 0 } });
    t.registry.handleStep(step(2, [release(ids[0]!), release(ids[1]!)]));
    expect(t.disconnects).toEqual([]);
    t.registry.handleStep(step(3, [release(ids[2]!)]));
    expect(t.disconnects).toEqual(["decode"]);
  });

  it("the queue bound counts every choice", async () => {
    // 4 sequences, none running, queue bound 10: 14 choices fit.
    const fits = setup(1 << 20, { n: 14 }, { maxQueuedRequests: 10 });
    await expect(handleChat(fits.ctx, fits.req, fits.reply)).resolves.toBeUndefined();
    // With those 14 waiting, one more request of 1 choice is over the bound: 429 (a retry can get in later).
    const sentBefore = fits.sent.length;
    const next = setup(1 << 20, { n: 1 }, { maxQueuedRequests: 10, requests: fits.registry });
    await expect(handleChat(next.ctx, next.req, next.reply)).rejects.toMatchObject({ status: 429, code: "queue_full" });
    expect(fits.sent.length).toBe(sentBefore);
    // 15 choices can never be held at once (4 sequences + 10 queued): a 400 naming n, not a 429 forever.
    const over = setup(1 << 20, { n: 15 }, { maxQueuedRequests: 10 });
    await expect(handleChat(over.ctx, over.req, over.reply)).rejects.toMatchObject({ status: 400, param: "n" });
    expect(over.sent).toEqual([]);
  });

  it("refuses logprobs beyond the engine's maxTopLogprobs and extended sampling the engine does not apply", async () => {
    const t = setup(1 << 20, { logprobs: true, top_logprobs: 6 });
    await expect(handleChat(t.ctx, t.req, t.reply)).rejects.toMatchObject({ status: 400, param: "top_logprobs" });
    const caps = { exactSeededResume: true, maxTopLogprobs: -1, extendedSampling: false, grammars: false, sharedPrefill: false };
    const u = setup(1 << 20, { min_p: 0.1 }, { capabilities: caps });
    await expect(handleChat(u.ctx, u.req, u.reply)).rejects.toMatchObject({ status: 400, code: "unsupported_field", param: "min_p" });
    const v = setup(1 << 20, { logit_bias: { "100": 1 } });
    await expect(handleChat(v.ctx, v.req, v.reply)).rejects.toMatchObject({ status: 400, param: "logit_bias" });
    expect([...t.sent, ...u.sent, ...v.sent]).toEqual([]);
  });
});

describe("stop strings and pipelining", () => {
  it("a stop string ends the stream and aborts the request in the engine", async () => {
    const t = setup(1 << 20, { stop: ["STOP"] });
    const chunks: string[] = [];
    t.res.write = (c: string): boolean => chunks.push(c) >= 0;
    await handleChat(t.ctx, t.req, t.reply);
    const [id] = idsOf(t.sent);
    t.registry.handleStep(step(1, [admit(id!), { id: id!, tokens: [5], text: "ab ST" }]));
    expect(aborted(t.sent)).toEqual([]);
    t.registry.handleStep(step(2, [{ id: id!, tokens: [6], text: "OP cd" }]));
    expect(aborted(t.sent)).toEqual([id]);
    const text = chunks.join("");
    expect(text).toContain('"content":"ab "');
    expect(text).toContain('"finish_reason":"stop"');
    expect(text.endsWith("data: [DONE]\n\n")).toBe(true);
    expect(t.disconnects).toEqual([]);
  });

  it("the connection closing releases a request whose own response never got a close (queued behind another)", async () => {
    const t = setup(1 << 20, { n: 2 });
    await handleChat(t.ctx, t.req, t.reply);
    const socket = t.req.raw.socket as unknown as EventEmitter;
    expect(socket.listenerCount("close")).toBe(1);
    socket.emit("close");
    expect(aborted(t.sent).sort()).toEqual(idsOf(t.sent).sort());
    expect(socket.listenerCount("close")).toBe(0);
  });

  it("a finished response stops watching its connection (a keep-alive connection is reused)", async () => {
    const t = setup(1 << 20, { stream: false, max_tokens: 1 });
    await handleChat(t.ctx, t.req, t.reply);
    const socket = t.req.raw.socket as unknown as EventEmitter;
    const [id] = idsOf(t.sent);
    t.registry.handleStep(step(1, [admit(id!), { id: id!, tokens: [5], text: "a", finish: { reason: "length", promptTokens: 2, completionTokens: 1 } }]));
    expect(socket.listenerCount("close")).toBe(0);
    socket.emit("close");
    expect(aborted(t.sent)).toEqual([]);
  });

  it("a pipelined request whose response has no socket yet is not taken for a disconnect", async () => {
    const t = setup(1 << 20);
    (t.res as unknown as { socket: null }).socket = null;
    await handleChat(t.ctx, t.req, t.reply);
    expect(t.disconnects).toEqual([]);
    expect(aborted(t.sent)).toEqual([]);
  });
});

describe("disconnect phase", () => {
  it("a client that leaves during the step that began its prefill is counted in prefill, not queued", async () => {
    const t = setup(1 << 20);
    await handleChat(t.ctx, t.req, t.reply);
    const [id] = idsOf(t.sent);
    // The client leaves while the engine runs a long first prefill chunk: the gateway still sees it queued.
    expect(t.registry.phase(id!)).toBe("queued");
    t.res.destroy();
    expect(aborted(t.sent)).toEqual([id]);
    // That step's output reports the admission, then the abort is applied at the next boundary.
    t.registry.handleStep(step(1, [admit(id!)]));
    t.registry.handleStep(step(2, [{ id: id!, tokens: [], text: "", finish: { reason: "abort", promptTokens: 2, completionTokens: 0, stepsAfterAbort: 1 } }]));
    expect(t.disconnects).toEqual(["prefill"]);
  });

  it("a client that leaves while truly queued is counted in queued", async () => {
    const t = setup(1 << 20);
    await handleChat(t.ctx, t.req, t.reply);
    const [id] = idsOf(t.sent);
    t.res.destroy();
    t.registry.handleStep(step(1, [{ id: id!, tokens: [], text: "", finish: { reason: "abort", promptTokens: 0, completionTokens: 0 } }]));
    expect(t.disconnects).toEqual(["queued"]);
  });
});

// ---------------------------------------------------------------- runGeneration driven directly
//
// The model's real request path with a fake engine channel: each child is driven by engine step outputs (admitted,
// output, finish, guide dropped), every submit and cancel (with its cause) is recorded, a submit can be refused (the
// engine went away); a recording encoder shows which events reach the wire and how.

let stepNo = 0;

function direct(over: Partial<Server> = {}, refuseSubmitOf: string | null = null) {
  const t = setup(1 << 20, {}, over, refuseSubmitOf);
  const submitted = (): { id: string; text: string; params: SamplingParams }[] =>
    t.sent.flatMap((m) => (m.type === "add" && "text" in m.prompt ? [{ id: m.id, text: m.prompt.text, params: m.params }] : []));
  const cancelled = (): [string, string][] => t.observed.flatMap((e): [string, string][] => (e.type === "cancelled" ? [[e.id, e.cause]] : []));
  const one = (o: StepMessage["outputs"][number]): void => t.registry.handleStep(step(++stepNo, [o]));
  /** The engine's side of child `id`. */
  const child = (id: string) => ({
    onAdmitted: () => one({ id, admitted: { promptTokens: [1, 2, 3, 4, 5], cachedTokens: 0 }, tokens: [], text: "" }),
    onOutput: (tokens: number[], text: string, logprobs?: NonNullable<StepMessage["outputs"][number]["logprobs"]>) => one({ id, tokens, text, ...(logprobs ? { logprobs } : {}) }),
    onFinish: (reason: FinishReason, u: { promptTokens: number; completionTokens: number }, error?: NonNullable<FinishInfo["error"]>) =>
      one({ id, tokens: [], text: "", finish: { reason, promptTokens: u.promptTokens, completionTokens: u.completionTokens, ...(error ? { error } : {}) } }),
    /** The engine confirms an abort; a request cancelled while queued and admitted in that step was in prefill. */
    onReleased: (phase: Phase) =>
      one({ id, ...(phase === "prefill" ? { admitted: { promptTokens: [1, 2], cachedTokens: 0 } } : {}), tokens: [], text: "", finish: { reason: "abort", promptTokens: 2, completionTokens: 0 } }),
    onGuideDropped: (reason: string) => one({ id, tokens: [], text: "", guideDropped: reason }),
  });
  const rejected: string[] = [];
  if (!over.rejected) t.server.rejected = (why) => void rejected.push(why);
  const headers: Record<string, string> = {};
  (t.reply as unknown as { header: (k: string, v: string) => unknown }).header = (k, v) => {
    headers[k] = v;
    return t.reply;
  };
  // What reaches the client: the status line, the body (JSON or SSE text) and whether the response ended.
  const wire = { status: 0, headers: {} as Record<string, unknown>, body: "", ended: false };
  t.res.writeHead = ((status: number, h: Record<string, unknown>) => {
    wire.status = status;
    wire.headers = h;
    return t.res;
  }) as StalledResponse["writeHead"];
  t.res.write = (c: string): boolean => (wire.body += c).length >= 0;
  const end = t.res.end.bind(t.res);
  t.res.end = ((c?: string) => {
    wire.body += c ?? "";
    wire.ended = true;
    end();
  }) as StalledResponse["end"];
  return { ...t, child, submitted, cancelled, rejected, headers, wire };
}

/** An encoder that writes each event's type (and content) as one SSE data line and records what it was given. */
function recordingEncoder(doneAfterError?: boolean) {
  const streamed: SessionEvent[] = [];
  const errors: KeelHttpError[] = [];
  const unary: Extract<SessionEvent, { type: "finished" }>[] = [];
  const encoder: Encoder = {
    stream(ev, w) {
      streamed.push(ev);
      w.data({ ev: ev.type, ...(ev.type === "delta" ? { content: ev.content, logprobs: ev.logprobs.length } : {}) });
    },
    streamError(err, w) {
      errors.push(err);
      w.data({ error: err.code });
    },
    unary(ev) {
      unary.push(ev);
      return { text: ev.choices.map((c) => c.text), usage: ev.usage };
    },
    ...(doneAfterError !== undefined ? { doneAfterError } : {}),
  };
  return { encoder, streamed, errors, unary };
}

const plan = (over: Partial<GenerationPlan> = {}): GenerationPlan => ({
  id: "req",
  prompts: ["p"],
  n: 1,
  stream: true,
  params: { maxTokens: 8, temperature: 0, topP: 1, topK: -1, ignoreEos: false, seed: 7 },
  stop: [],
  includeStopStr: false,
  ...over,
});
const usage = (completionTokens: number) => ({ promptTokens: 0, completionTokens });

describe("admission", () => {
  it("not ready: 503 with retry-after, counted as not_ready, nothing submitted", () => {
    const t = direct({ isReady: () => false });
    const enc = recordingEncoder();
    expect(() => runGeneration(t.ctx, t.req, t.reply, plan(), enc.encoder)).toThrow(expect.objectContaining({ status: 503, code: "not_ready" }));
    expect(t.headers).toEqual({ "retry-after": "1" });
    expect(t.rejected).toEqual(["not_ready"]);
    expect(t.submitted()).toEqual([]);
  });

  it("the queue bound subtracts only the sequences that are free: 429 with retry-after, counted as queue_full", () => {
    // 4 sequences all running, queue bound 2: 3 choices would wait 3 > 2.
    const t = direct({ maxNumSeqs: 4, maxQueuedRequests: 2 });
    (t.ctx.model.requests as unknown as { counts: () => unknown }).counts = () => ({ waiting: 0, running: 4 });
    expect(() => runGeneration(t.ctx, t.req, t.reply, plan({ n: 3 }), recordingEncoder().encoder)).toThrow(expect.objectContaining({ status: 429, code: "queue_full" }));
    expect(t.headers).toEqual({ "retry-after": "1" });
    expect(t.rejected).toEqual(["queue_full"]);
    expect(t.submitted()).toEqual([]);
    // Two of the four sequences free: 3 choices leave 1 waiting, within the bound; exactly at the bound also fits.
    (t.ctx.model.requests as unknown as { counts: () => unknown }).counts = () => ({ waiting: 1, running: 2 });
    expect(admissionError(t.ctx, { n: 3, prompts: ["p"] })).toBeNull();
    expect(admissionError(t.ctx, { n: 4, prompts: ["p"] })).toMatchObject({ status: 429 });
  });

  it("n counts once per prompt of a prompt list: over every sequence plus the queue is a 400 naming n, without retry-after", () => {
    const t = direct({ maxNumSeqs: 4, maxQueuedRequests: 1 });
    // 3 × 2 prompts = 6 > 4 + 1.
    const err = admissionError(t.ctx, { n: 3, prompts: ["a", "b"] });
    expect(err).toMatchObject({ status: 400, param: "n" });
    expect(err?.message).toContain("needs 6 sequences");
    expect(admissionError(t.ctx, { n: 2, prompts: ["a", "b"] })).toBeNull();
    expect(() => runGeneration(t.ctx, t.req, t.reply, plan({ n: 3, prompts: ["a", "b"] }), recordingEncoder().encoder)).toThrow(expect.objectContaining({ status: 400 }));
    expect(t.headers).toEqual({});
    expect(t.rejected).toEqual([]);
  });

  it("a prompt isolated as an engine killer refuses the request (any prompt of a list), without retry-after", () => {
    const t = direct({ isKnownCulprit: (p) => p === "bad" });
    expect(admissionError(t.ctx, { n: 1, prompts: ["ok"] })).toBeNull();
    expect(() => runGeneration(t.ctx, t.req, t.reply, plan({ prompts: ["ok", "bad"] }), recordingEncoder().encoder)).toThrow(expect.objectContaining({ status: 500, code: "engine_fault", message: expect.stringContaining("isolated") }));
    expect(t.headers).toEqual({});
    expect(t.submitted()).toEqual([]);
  });
});

describe("children", () => {
  it("one choice runs under the response id itself; several under <id>-<i>", () => {
    expect(childIds("x", 1)).toEqual(["x"]);
    expect(childIds("x", 3)).toEqual(["x-0", "x-1", "x-2"]);
    const t = direct();
    runGeneration(t.ctx, t.req, t.reply, plan(), recordingEncoder().encoder);
    expect(t.submitted().map((s) => s.id)).toEqual(["req"]);
  });

  it("a prompt list with n > 1: choices in prompt order, each prompt's n seeds repeat, the logprobs flag reaches the engine", () => {
    const t = direct();
    runGeneration(t.ctx, t.req, t.reply, plan({ prompts: ["a", "b"], n: 2, params: { ...plan().params, logprobs: 2 } }), recordingEncoder().encoder);
    expect(t.submitted().map((s) => [s.id, s.text])).toEqual([
      ["req-0", "a"],
      ["req-1", "a"],
      ["req-2", "b"],
      ["req-3", "b"],
    ]);
    const seeds = t.submitted().map((s) => s.params.seed);
    expect(seeds[0]).toBe(7);
    expect(seeds[1]).not.toBe(7);
    expect(seeds.slice(2)).toEqual(seeds.slice(0, 2));
    expect(t.submitted().every((s) => s.params.logprobs === 2 && s.params.maxTokens === 8)).toBe(true);
  });

  it("a submit refused midway (the engine went away): the siblings already submitted are released and the answer is 503", () => {
    const t = direct({}, "req-1");
    const enc = recordingEncoder();
    runGeneration(t.ctx, t.req, t.reply, plan({ n: 3 }), enc.encoder);
    expect(t.submitted().map((s) => s.id)).toEqual(["req-0"]);
    // The session releases every child it started; only req-0 ever reached the engine.
    expect(t.cancelled()).toEqual([["req-0", "sibling_failed"]]);
    expect(aborted(t.sent)).toEqual(["req-0"]);
    expect(t.rejected).toEqual(["not_ready"]);
    expect(t.wire.status).toBe(503);
    expect(t.wire.headers["retry-after"]).toBe("1");
    expect(JSON.parse(t.wire.body)).toMatchObject({ error: { code: "not_ready" } });
    expect(enc.streamed).toEqual([]);
  });
});

describe("events to the wire", () => {
  it("streaming: the admission starts the stream, deltas and the finish are encoded, [DONE] ends it; a stop string aborts with its cause", () => {
    const t = direct();
    const enc = recordingEncoder();
    runGeneration(t.ctx, t.req, t.reply, plan({ stop: ["!"] }), enc.encoder);
    const sink = t.child("req")!;
    sink.onAdmitted();
    expect(t.wire.status).toBe(200);
    expect(enc.streamed).toEqual([{ type: "started" }]);
    sink.onOutput([1], "hi!");
    expect(t.cancelled()).toEqual([["req", "stop_string"]]);
    expect(enc.streamed.map((e) => e.type)).toEqual(["started", "delta", "choice_finished", "finished"]);
    expect(enc.streamed.at(-1)).toMatchObject({ usage: { promptTokens: 5, completionTokens: 1 } });
    expect(t.wire.body.endsWith("data: [DONE]\n\n")).toBe(true);
    expect(t.wire.ended).toBe(true);
    // The response end is not a client leaving.
    expect(t.disconnects).toEqual([]);
  });

  it("logprobs requested: the engine's entries reach the encoder; not requested: they are dropped", () => {
    const lp = [{ token: 1, logprob: -0.5, top: [] }];
    for (const logprobs of [2, undefined]) {
      const t = direct();
      const enc = recordingEncoder();
      runGeneration(t.ctx, t.req, t.reply, plan({ params: { ...plan().params, ...(logprobs !== undefined ? { logprobs } : {}) } }), enc.encoder);
      t.child("req").onOutput([1], "a", lp);
      const delta = enc.streamed.find((e) => e.type === "delta");
      expect(delta).toMatchObject({ logprobs: logprobs === undefined ? [] : [{ token: "token_id:1", logprob: -0.5 }] });
    }
  });

  it("unary: nothing is streamed; the finished request is one 200 JSON body", () => {
    const t = direct();
    const enc = recordingEncoder();
    runGeneration(t.ctx, t.req, t.reply, plan({ stream: false, n: 2 }), enc.encoder);
    for (const id of ["req-0", "req-1"]) t.child(id).onAdmitted();
    t.child("req-0").onOutput([1], "x");
    t.child("req-0").onFinish("stop", usage(1));
    expect(t.wire.status).toBe(0);
    t.child("req-1").onOutput([2, 3, 4], "");
    t.child("req-1").onFinish("length", usage(3));
    expect(enc.streamed).toEqual([]);
    expect(t.wire.status).toBe(200);
    expect(JSON.parse(t.wire.body)).toEqual({ text: ["x", ""], usage: { promptTokens: 5, completionTokens: 4 } });
  });

  it("unary: a failed child is an HTTP error answer and its siblings are aborted", () => {
    const t = direct();
    const enc = recordingEncoder();
    runGeneration(t.ctx, t.req, t.reply, plan({ stream: false, n: 2 }), enc.encoder);
    t.child("req-0").onAdmitted();
    t.child("req-0").onOutput([1], "x");
    t.child("req-1").onFinish("error", usage(0), { code: "engine_error", message: "boom" });
    expect(t.cancelled()).toEqual([["req-0", "sibling_failed"]]);
    expect(aborted(t.sent)).toEqual(["req-0"]);
    expect(t.wire.status).toBe(500);
    expect(JSON.parse(t.wire.body)).toMatchObject({ error: { code: "engine_error", message: expect.stringContaining("boom") } });
    expect(enc.errors).toEqual([]);
    expect(enc.streamed).toEqual([]);
  });

  it("streaming: a failure after the stream began is an error event; [DONE] follows only for encoders that ask", () => {
    for (const doneAfterError of [undefined, false, true]) {
      const t = direct();
      const enc = recordingEncoder(doneAfterError);
      runGeneration(t.ctx, t.req, t.reply, plan(), enc.encoder);
      t.child("req").onAdmitted();
      t.child("req").onFinish("error", usage(0), { code: "engine_error", message: "boom" });
      expect(enc.errors.map((e) => [e.status, e.code])).toEqual([[500, "engine_error"]]);
      expect(enc.errors[0]!.message).toContain("boom");
      expect(t.wire.status).toBe(200);
      expect(t.wire.ended).toBe(true);
      expect(t.wire.body.includes('{"error":"engine_error"}')).toBe(true);
      expect(t.wire.body.endsWith("data: [DONE]\n\n")).toBe(doneAfterError === true);
    }
  });

  it("streaming: a failure before anything was sent is still a plain HTTP error", () => {
    const t = direct();
    const enc = recordingEncoder();
    runGeneration(t.ctx, t.req, t.reply, plan(), enc.encoder);
    t.child("req").onFinish("error", usage(0), { code: "engine_error", message: "boom" });
    expect(enc.errors).toEqual([]);
    expect(t.wire.status).toBe(500);
    expect(JSON.parse(t.wire.body)).toMatchObject({ error: { code: "engine_error", message: expect.stringContaining("boom") } });
  });
});

describe("client gone", () => {
  for (const [what, leave] of [
    ["the request was destroyed", (t: ReturnType<typeof direct>) => void ((t.req.raw as { destroyed: boolean }).destroyed = true)],
    ["the request has no socket", (t: ReturnType<typeof direct>) => void ((t.req.raw as unknown as { socket: null }).socket = null)],
    ["the request's socket was destroyed", (t: ReturnType<typeof direct>) => void ((t.req.raw.socket as { destroyed: boolean }).destroyed = true)],
  ] as const) {
    it(`a client already gone when the generation starts (${what}) releases every child at once`, () => {
      const t = direct();
      leave(t);
      runGeneration(t.ctx, t.req, t.reply, plan({ n: 2 }), recordingEncoder().encoder);
      expect(t.cancelled()).toEqual([["req-0", "client_disconnect"], ["req-1", "client_disconnect"]]);
    });
  }

  it("the disconnect is counted once, after the last child is released, in the furthest phase; releases of other children do not count", () => {
    const t = direct();
    runGeneration(t.ctx, t.req, t.reply, plan({ n: 3, stop: ["!"] }), recordingEncoder().encoder);
    // Child 0 ends by a stop string (released for that reason, not the client's).
    t.child("req-0").onOutput([1], "!");
    t.res.destroy();
    expect(t.cancelled()).toEqual([["req-0", "stop_string"], ["req-1", "client_disconnect"], ["req-2", "client_disconnect"]]);
    t.child("req-0").onReleased("decode");
    t.child("req-1").onReleased("queued");
    expect(t.disconnects).toEqual([]);
    t.child("req-2").onReleased("prefill");
    expect(t.disconnects).toEqual(["prefill"]);
    // A late duplicate release is not counted again.
    t.child("req-2").onReleased("prefill");
    expect(t.disconnects).toEqual(["prefill"]);
  });

  it("a child released by an engine death while its client was gone counts the disconnect in the phase it died in", () => {
    const t = direct();
    runGeneration(t.ctx, t.req, t.reply, plan(), recordingEncoder().encoder);
    t.child("req").onAdmitted();
    t.ctx.model.requests.applyEngineExit({ kind: "restart", verdict: { reason: "signal", blame: false }, description: "killed" });
    t.res.destroy();
    // No engine held it: released at once, no abort sent.
    expect(aborted(t.sent)).toEqual([]);
    expect(t.disconnects).toEqual(["prefill"]);
  });

  it("a client leaving after the response ended releases nothing", () => {
    const t = direct();
    runGeneration(t.ctx, t.req, t.reply, plan(), recordingEncoder().encoder);
    t.child("req").onFinish("stop", usage(1));
    t.res.destroy();
    expect(t.cancelled()).toEqual([]);
  });
});

describe("guided generation at the route", () => {
  it("the engine dropping a child's guide is counted once and the request goes on", () => {
    const t = direct();
    const enc = recordingEncoder();
    runGeneration(t.ctx, t.req, t.reply, plan({ stream: false }), enc.encoder);
    const sink = t.child("req")!;
    sink.onAdmitted();
    sink.onGuideDropped!("trigger replay rejected");
    sink.onOutput([1], "x");
    sink.onFinish("stop", usage(1));
    expect(t.observed.filter((e) => e.type === "guide_dropped")).toEqual([{ type: "guide_dropped", id: "req", reason: "trigger replay rejected", ends: false }]);
    expect(t.wire.status).toBe(200);
  });

  it("a chat request with a JSON response_format sends the guide to an engine with grammars, and is a 400 without", async () => {
    const caps = (grammars: boolean) => ({ exactSeededResume: true, maxTopLogprobs: 5, extendedSampling: true, grammars, sharedPrefill: false });
    const rf = { response_format: { type: "json_object" } };
    const yes = setup(1 << 20, rf, { capabilities: caps(true) });
    await handleChat(yes.ctx, yes.req, yes.reply);
    const add = yes.sent.find((m) => m.type === "add") as { params: SamplingParams } | undefined;
    expect(add?.params.guide?.start).toMatchObject({ kind: "rule", then: "end" });
    const no = setup(1 << 20, rf, { capabilities: caps(false) });
    await expect(handleChat(no.ctx, no.req, no.reply)).rejects.toMatchObject({ status: 400, param: "response_format" });
    expect(no.sent).toEqual([]);
  });

  it("tools without a server tool parser are a 400 before the engine; with one, the call format is parsed", async () => {
    const tools = { tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }] };
    const none = setup(1 << 20, tools);
    await expect(handleChat(none.ctx, none.req, none.reply)).rejects.toMatchObject({ status: 400, param: "tools", code: "unsupported_field" });
    expect(none.sent).toEqual([]);
    const hermes = setup(1 << 20, { ...tools, stream: false }, { agents: () => ({ toolParser: "hermes3", reasoningParser: null, guideAuto: false, toolParserSource: "flag" }) });
    const chunks: string[] = [];
    hermes.res.write = (c: string): boolean => chunks.push(c) >= 0;
    const endRes = hermes.res.end.bind(hermes.res);
    hermes.res.end = ((c?: string) => {
      chunks.push(c ?? "");
      endRes();
    }) as StalledResponse["end"];
    await handleChat(hermes.ctx, hermes.req, hermes.reply);
    const [id] = idsOf(hermes.sent);
    hermes.registry.handleStep(step(1, [admit(id!), { id: id!, tokens: [5], text: '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', finish: { reason: "stop", promptTokens: 2, completionTokens: 1 } }]));
    const body = JSON.parse(chunks.join("")) as { choices: { message: { content: unknown; tool_calls: { function: { name: string; arguments: string } }[] }; finish_reason: string }[] };
    expect(body.choices[0]).toMatchObject({ finish_reason: "tool_calls", message: { content: null, tool_calls: [{ function: { name: "f", arguments: '{"a":1}' } }] } });
  });
});

describe("time-to-first-token phases (keel_request_ttft_phase_seconds)", () => {
  it("a streamed request records accept, engine and deliver once, when its first output is written", async () => {
    const t = setup(1 << 20);
    t.res.write = (chunk: string): boolean => chunk.length >= 0;
    await handleChat(t.ctx, t.req, t.reply);
    const id = idsOf(t.sent)[0]!;
    // Admission alone writes no output: nothing recorded yet.
    t.registry.handleStep(step(1, [admit(id)]));
    expect(t.server.ttftPhases).toEqual([]);
    t.registry.handleStep(step(2, [{ id, tokens: [5], text: "x" }]));
    expect(t.server.ttftPhases.map((p) => p.phase)).toEqual(["accept", "engine", "deliver"]);
    // accept runs from the receive time (5 ms before the route) to the add's write.
    expect(t.server.ttftPhases[0]!.seconds).toBeGreaterThanOrEqual(0.005);
    for (const p of t.server.ttftPhases) expect(Number.isFinite(p.seconds) && p.seconds >= 0).toBe(true);
    t.registry.handleStep(step(3, [{ id, tokens: [6], text: "y", finish: { reason: "length", promptTokens: 2, completionTokens: 2 } }]));
    expect(t.server.ttftPhases).toHaveLength(3);
  });

  it("a step's output is written to the client before metrics and logs see its events", async () => {
    const t = setup(1 << 20);
    await handleChat(t.ctx, t.req, t.reply);
    const id = idsOf(t.sent)[0]!;
    t.registry.handleStep(step(1, [admit(id), { id, tokens: [5], text: "x" }]));
    const first = t.writtenWhenObserved.find((o) => o.type === "first_token");
    expect(first).toBeDefined();
    // The role chunk and the first token were already sent when the first_token event was observed.
    expect(first!.bytes).toBe(t.res.writableLength);
    expect(first!.bytes).toBeGreaterThan(0);
  });

  it("a unary request records none (its first token is not written on its own)", async () => {
    const t = setup(1 << 20, { stream: false });
    await handleChat(t.ctx, t.req, t.reply);
    const id = idsOf(t.sent)[0]!;
    t.registry.handleStep(step(1, [admit(id), { id, tokens: [5], text: "x", finish: { reason: "length", promptTokens: 2, completionTokens: 1 } }]));
    expect(t.server.ttftPhases).toEqual([]);
  });
});
