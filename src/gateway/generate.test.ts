/**
 * The generation pipeline (generate.ts + the response writer) driven through the chat route with a real registry
 * and a fake engine channel: the stream backpressure bound (a client that stops reading is dropped past
 * `maxUnreadBytes` — loopback buffers absorb more than the tiny model generates, so this is tested here), `n`
 * children released together when the client leaves, `n` counted by the queue bound, a stop string's engine abort,
 * and a pipelined request (whose response has no socket yet) not taken for a disconnect.
 */
import { EventEmitter } from "node:events";
import pino from "pino";
import { describe, expect, it } from "vitest";
import type { FastifyReply, FastifyRequest } from "fastify";
import { PROTOCOL_VERSION, type GatewayMessage, type StepMessage } from "../protocol/messages.js";
import { CHATML_TEMPLATE } from "../model/tiny-model.js";
import { handleChat } from "./api/chat.js";
import type { RouteContext } from "./route-context.js";
import { ChatTemplate } from "./chat-template.js";
import { notReady } from "./errors.js";
import { RequestRegistry } from "./registry.js";

/** A response whose client never reads: every write stays in the unsent buffer. */
class StalledResponse extends EventEmitter {
  writableLength = 0;
  destroyed = false;
  socket = { destroyed: false };
  writeHead(): this {
    return this;
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

function setup(maxUnreadBytes: number, body: Record<string, unknown> = {}, over: Partial<RouteContext> = {}) {
  const sent: GatewayMessage[] = [];
  const registry = new RequestRegistry((m) => {
    sent.push(m);
    return true;
  });
  const disconnects: string[] = [];
  const ctx: RouteContext = {
    registry,
    modelName: "m",
    modelCreated: 0,
    vocabSize: () => 100,
    capabilities: () => ({ exactSeededResume: true, maxTopLogprobs: 5, extendedSampling: true, grammars: false, sharedPrefill: false }),
    tokenize: async () => [],
    template: () => new ChatTemplate(CHATML_TEMPLATE, { bosToken: "", eosToken: "" }),
    isReady: () => true,
    maxModelLen: () => 1000,
    maxNumSeqs: () => 4,
    maxQueuedRequests: 10,
    maxUnreadBytes,
    unavailable: () => notReady(),
    isKnownCulprit: () => false,
    onRejected: () => undefined,
    onDisconnect: (phase) => void disconnects.push(phase),
    log: pino({ level: "silent" }),
    ...over,
  };
  const res = new StalledResponse();
  const reply = { hijack() {}, raw: res, header() { return reply; } } as unknown as FastifyReply;
  const reqSocket = { destroyed: false };
  const req = { body: { model: "m", messages: [{ role: "user", content: "hi" }], stream: true, temperature: 0, ...body }, raw: { socket: reqSocket, destroyed: false } } as unknown as FastifyRequest;
  return { ctx, res, reply, req, sent, disconnects, registry };
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
    const next = setup(1 << 20, { n: 1 }, { maxQueuedRequests: 10, registry: fits.registry });
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
    const u = setup(1 << 20, { min_p: 0.1 }, { capabilities: () => caps });
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
