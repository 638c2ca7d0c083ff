/**
 * The one response writer every generation route uses: a plain JSON answer (unary, or an error before streaming
 * began) or a server-sent-events stream — data-only events (`data: {...}`, chat and completions, ending with
 * `data: [DONE]`) and named events (`event: x\ndata: {...}`, the Responses API).
 *
 * It owns the three things each route used to re-implement:
 *  - disconnect detection from the response's `close` event (not from a failed write: Ollama #11889), reported once
 *    through `onGone`;
 *  - the backpressure bound: a client that stops reading may leave at most `maxUnreadBytes` unsent; past that it is
 *    treated as gone (socket destroyed) instead of buffering without limit;
 *  - nothing is ever written after the response ended or the client left;
 *  - a client that half-closes (its FIN after a complete request) is asked whether it still reads: a FIN is how most
 *    clients leave, but HTTP/1.1 also lets a client shut its sending side and wait, and only a write tells the two apart.
 *    Before the answer starts, `100 Continue` probes go out at {@link HALF_CLOSE_PROBES_MS}: a departed client's
 *    kernel answers the first with a reset, the next write fails and the connection closes (gone); a half-closed
 *    client reads them as interim responses and gets its answer. Once streaming, the stream's own writes are the
 *    probes. HTTP/1.0 has no interim responses: there a FIN is the client leaving.
 */
import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { Logger } from "pino";

/**
 * Writer state: `idle` (nothing sent), `streaming` (SSE headers sent), `ended` (we completed the response) or
 * `gone` (the client left first).
 */
type WriterState = "idle" | "streaming" | "ended" | "gone";

/**
 * When the half-close probes go out, in ms after the client's FIN (the last delay then repeats while nothing was
 * written): at once, then soon enough that a reset already came back on a local network, then spaced out.
 */
export const HALF_CLOSE_PROBES_MS = [0, 2, 20, 200, 2000] as const;

export class ResponseWriter {
  /** Where the response is (see {@link WriterState}). */
  #state: WriterState = "idle";
  /** Called once when the client leaves before we ended the response. */
  #onGone: (() => void) | null = null;

  /** The request's connection, watched while the response is open (see the constructor). */
  readonly #socket: Socket | null;
  /** Listener on the connection's `close`, removed once the response is over (keep-alive connections are reused). */
  readonly #onSocketClose = (): void => this.#closed();
  /** Listener on the connection's `end` (the client's FIN), removed with the `close` one. */
  readonly #onSocketEnd = (): void => this.#halfClosed();
  /** The next half-close probe, while one is scheduled. */
  #probe: NodeJS.Timeout | null = null;

  constructor(
    private readonly res: ServerResponse,
    private readonly opts: { requestId: string; maxUnreadBytes: number; log: Logger; isSocketGone: () => boolean; socket?: Socket | null },
  ) {
    res.once("close", () => this.#closed());
    // A pipelined response queued behind an earlier one on the same connection gets no `close` of its own when the
    // connection drops (Node emits it only for the response being written), so the connection is watched too.
    this.#socket = opts.socket ?? null;
    this.#socket?.on("close", this.#onSocketClose);
    this.#socket?.on("end", this.#onSocketEnd);
    // The FIN may have come while the body was parsed, before this listener existed.
    if (this.#socket?.readableEnded) this.#halfClosed();
  }

  /** True while the response can still be written (not ended, client present). */
  get open(): boolean {
    return this.#state === "idle" || this.#state === "streaming";
  }

  /** True once SSE headers went out (later errors must be stream events, not a status). */
  get streaming(): boolean {
    return this.#state === "streaming";
  }

  /**
   * Register the disconnect handler. Called at once when the client already left (it may leave while the body is
   * parsed, before any listener existed; the request's own socket tells — the response's socket is null while an
   * earlier pipelined response on the same connection is still being written, which is not a disconnect).
   */
  onGone(fn: () => void): void {
    this.#onGone = fn;
    if (this.#state === "gone") return fn();
    if (this.opts.isSocketGone()) this.#closed();
  }

  /** Send SSE headers (idempotent). */
  startStream(): void {
    if (this.#state !== "idle") return;
    this.#state = "streaming";
    this.res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", "x-request-id": this.opts.requestId });
  }

  /**
   * Write everything `fn` writes as one send: the response is corked meanwhile, so the events of one engine step
   * (e.g. the role chunk and the first token, or the last token, the usage and `[DONE]`) leave in one system call
   * and reach the client together.
   */
  batch(fn: () => void): void {
    this.res.cork();
    try {
      fn();
    } finally {
      if (this.res.writableCorked > 0) this.res.uncork();
    }
  }

  /** One data-only event: `data: <json>`. */
  data(payload: unknown): void {
    this.#write(`data: ${JSON.stringify(payload)}\n\n`);
  }

  /** One named event: `event: <name>\ndata: <json>`. */
  event(name: string, payload: unknown): void {
    this.#write(`event: ${name}\ndata: ${JSON.stringify(payload)}\n\n`);
  }

  /** End the stream, with `data: [DONE]` first when `done` is set. */
  endStream(done: boolean): void {
    if (this.#state !== "streaming") return;
    if (done) this.#write("data: [DONE]\n\n");
    if (this.#state !== "streaming") return;
    this.#state = "ended";
    this.#detach();
    this.res.end();
  }

  /** A complete JSON answer (unary result, or an error before any stream event). */
  json(status: number, payload: unknown): void {
    if (this.#state !== "idle") return;
    this.#state = "ended";
    this.#detach();
    const text = JSON.stringify(payload);
    this.res.writeHead(status, {
      "content-type": "application/json; charset=utf-8",
      "content-length": Buffer.byteLength(text),
      "x-request-id": this.opts.requestId,
      ...(status === 503 || status === 429 ? { "retry-after": "1" } : {}),
    });
    this.res.end(text);
  }

  #write(s: string): void {
    if (this.#state !== "streaming" || this.res.destroyed) return;
    this.res.write(s);
    if (this.res.writableLength > this.opts.maxUnreadBytes) {
      this.opts.log.warn({ event: "slow_client", unreadBytes: this.res.writableLength }, "client is not reading its stream; aborting it");
      this.res.destroy();
    }
  }

  #closed(): void {
    this.#detach();
    if (this.#state === "ended" || this.#state === "gone") return;
    this.#state = "gone";
    this.#onGone?.();
  }

  /** The client sent its FIN while the response is open: HTTP/1.0 leaves; HTTP/1.1 is probed (see the file's doc). */
  #halfClosed(): void {
    if (!this.open || this.#probe !== null) return;
    if (this.res.req?.httpVersionMinor === 0 && this.res.req.httpVersionMajor === 1) {
      this.#socket?.destroy();
      return;
    }
    this.#sendProbe(0);
  }

  /** Probe `k` (see {@link HALF_CLOSE_PROBES_MS}); none once the answer started (its writes probe) or ended. */
  #sendProbe(k: number): void {
    this.#probe = null;
    if (this.#state !== "idle" || this.res.destroyed) return;
    this.res.writeContinue();
    const last = HALF_CLOSE_PROBES_MS.length - 1;
    const delay = k < last ? HALF_CLOSE_PROBES_MS[k + 1]! - HALF_CLOSE_PROBES_MS[k]! : HALF_CLOSE_PROBES_MS[last];
    this.#probe = setTimeout(() => this.#sendProbe(k + 1), delay);
    this.#probe.unref();
  }

  /** Stop watching the connection (keep-alive connections are reused) and cancel a scheduled probe. */
  #detach(): void {
    this.#socket?.off("close", this.#onSocketClose);
    this.#socket?.off("end", this.#onSocketEnd);
    if (this.#probe !== null) clearTimeout(this.#probe);
    this.#probe = null;
  }
}
