/**
 * The chat route's stream backpressure bound, driven with a fake response whose unsent buffer grows (a client that
 * stopped reading): past `maxUnreadBytes` the client is treated as gone — socket closed, disconnect counted, abort
 * sent to the engine — instead of buffering without bound. (Loopback socket buffers absorb more than the tiny model
 * can generate, so this is tested here rather than end to end.)
 */
import { EventEmitter } from "node:events";
import pino from "pino";
import { describe, expect, it } from "vitest";
import type { FastifyReply, FastifyRequest } from "fastify";
import { PROTOCOL_VERSION, type GatewayMessage, type StepMessage } from "../protocol/messages.js";
import { CHATML_TEMPLATE } from "../model/tiny-model.js";
import { handleChat, type ChatRouteContext } from "./chat-route.js";
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

function setup(maxUnreadBytes: number) {
  const sent: GatewayMessage[] = [];
  const registry = new RequestRegistry((m) => {
    sent.push(m);
    return true;
  });
  const disconnects: string[] = [];
  const ctx: ChatRouteContext = {
    registry,
    modelName: "m",
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
  };
  const res = new StalledResponse();
  const reply = { hijack() {}, raw: res, header() { return reply; } } as unknown as FastifyReply;
  const req = { body: { model: "m", messages: [{ role: "user", content: "hi" }], stream: true, temperature: 0 }, raw: {} } as unknown as FastifyRequest;
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
    expect(t.disconnects).toEqual(["decode"]);
    expect(t.sent.filter((m) => m.type === "abort")).toEqual([{ v: PROTOCOL_VERSION, type: "abort", ids: [id] }]);
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
