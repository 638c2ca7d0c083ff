/**
 * The response writer: SSE framing (data-only and named events, [DONE]), JSON answers, nothing written after the
 * end or after the client left, one disconnect report (also when the client left before the handler registered),
 * and the backpressure bound.
 */
import { EventEmitter } from "node:events";
import http, { type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import pino from "pino";
import { describe, expect, it } from "vitest";
import { ResponseWriter } from "./sse.js";

class FakeResponse extends EventEmitter {
  written: string[] = [];
  head: { status: number; headers: Record<string, unknown> } | null = null;
  writableLength = 0;
  destroyed = false;
  ended = false;
  /** When false, writes stay unsent (a client that does not read). */
  reads = true;
  writeHead(status: number, headers: Record<string, unknown>): this {
    this.head = { status, headers };
    return this;
  }
  write(s: string): boolean {
    this.written.push(s);
    if (!this.reads) this.writableLength += Buffer.byteLength(s);
    return this.reads;
  }
  end(s?: string): void {
    if (s) this.written.push(s);
    this.ended = true;
  }
  destroy(): void {
    this.destroyed = true;
    this.emit("close");
  }
}

function make(maxUnreadBytes = 1 << 20, socketGone = false) {
  const res = new FakeResponse();
  const w = new ResponseWriter(res as unknown as ServerResponse, { requestId: "r1", maxUnreadBytes, log: pino({ level: "silent" }), isSocketGone: () => socketGone });
  return { res, w };
}

describe("ResponseWriter", () => {
  it("frames data-only and named events, then [DONE]; nothing after the end", () => {
    const { res, w } = make();
    w.startStream();
    w.data({ a: 1 });
    w.event("response.created", { b: 2 });
    w.endStream(true);
    w.data({ late: true });
    expect(res.head?.status).toBe(200);
    expect(res.head?.headers["content-type"]).toMatch(/^text\/event-stream/);
    expect(res.written.join("")).toBe('data: {"a":1}\n\nevent: response.created\ndata: {"b":2}\n\ndata: [DONE]\n\n');
    expect(res.ended).toBe(true);
    expect(w.open).toBe(false);
  });

  it("a JSON answer has its length and request id; a 429/503 carries Retry-After; a second answer is ignored", () => {
    const { res, w } = make();
    w.json(503, { error: "x" });
    w.json(200, { ok: true });
    expect(res.head).toEqual({ status: 503, headers: { "content-type": "application/json; charset=utf-8", "content-length": 13, "x-request-id": "r1", "retry-after": "1" } });
    expect(res.written).toEqual([JSON.stringify({ error: "x" })]);
  });

  it("reports the client leaving once, and not after the response ended", () => {
    const a = make();
    let gone = 0;
    a.w.onGone(() => gone++);
    a.w.startStream();
    a.res.emit("close");
    a.res.emit("close");
    expect(gone).toBe(1);
    a.w.data({ x: 1 });
    expect(a.res.written).toEqual([]);
    const b = make();
    let goneB = 0;
    b.w.onGone(() => goneB++);
    b.w.json(200, {});
    b.res.emit("close");
    expect(goneB).toBe(0);
  });

  it("a client that left before the handler was registered is reported at registration", () => {
    const early = make();
    early.res.emit("close");
    let gone = 0;
    early.w.onGone(() => gone++);
    expect(gone).toBe(1);
    const socketGone = make(1 << 20, true);
    let gone2 = 0;
    socketGone.w.onGone(() => gone2++);
    expect(gone2).toBe(1);
  });

  it("a client that stops reading is dropped once its unsent bytes pass the bound", () => {
    const { res, w } = make(100);
    let gone = 0;
    w.onGone(() => gone++);
    w.startStream();
    res.reads = false;
    for (let i = 0; i < 10 && !res.destroyed; i++) w.data({ chunk: "x".repeat(30) });
    expect(res.destroyed).toBe(true);
    expect(res.writableLength).toBeGreaterThan(100);
    expect(res.writableLength).toBeLessThan(200);
    expect(gone).toBe(1);
  });
});

describe("ResponseWriter.batch on a real response", () => {
  /** Serve one request with `handle`, return what the client received and whether the response ended. */
  async function serve(handle: (w: ResponseWriter, res: ServerResponse) => void): Promise<string> {
    const server = http.createServer((req, res) => {
      const w = new ResponseWriter(res, { requestId: "r1", maxUnreadBytes: 1 << 20, log: pino({ level: "silent" }), isSocketGone: () => false, socket: req.socket });
      handle(w, res);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const { port } = server.address() as AddressInfo;
    try {
      const body = await new Promise<string>((resolve, reject) => {
        http.get({ host: "127.0.0.1", port, path: "/" }, (res) => {
          let b = "";
          res.setEncoding("utf8");
          res.on("data", (d: string) => (b += d));
          res.on("end", () => resolve(b));
          res.on("error", reject);
        }).on("error", reject);
      });
      return body;
    } finally {
      server.close();
    }
  }

  it("holds the writes of one batch until it ends, then sends them; an end inside a batch completes the response", async () => {
    const corked: number[] = [];
    const body = await serve((w, res) => {
      w.startStream();
      w.batch(() => {
        w.data({ role: "assistant" });
        w.data({ content: "a" });
        corked.push(res.writableCorked);
      });
      corked.push(res.writableCorked);
      w.batch(() => {
        w.data({ content: "b" });
        w.endStream(true);
      });
      corked.push(res.writableCorked);
    });
    expect(corked).toEqual([1, 0, 0]);
    expect(body).toBe('data: {"role":"assistant"}\n\ndata: {"content":"a"}\n\ndata: {"content":"b"}\n\ndata: [DONE]\n\n');
  });
});
