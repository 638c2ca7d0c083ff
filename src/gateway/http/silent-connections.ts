/**
 * Connections that have not sent a request yet. Node's HTTP server times a request out only once its parser saw a
 * first byte (`headersTimeout`, `requestTimeout`), and `server.close()` waits for every open connection: a client
 * that connects and never sends a byte would hold a slot forever and keep a graceful shutdown from finishing.
 * This guard drops such a connection after the request timeout, and lets the drain drop them all at once.
 */
import type { Server } from "node:http";
import type { Socket } from "node:net";

export class SilentConnections {
  /** Connections that have not started a request yet → the timer that drops them. */
  private readonly waiting = new Map<Socket, NodeJS.Timeout>();

  constructor(server: Server, timeoutMs: number) {
    server.on("connection", (socket: Socket) => {
      const timer = setTimeout(() => {
        this.waiting.delete(socket);
        socket.destroy();
      }, timeoutMs);
      timer.unref();
      this.waiting.set(socket, timer);
      socket.once("close", () => this.settle(socket));
    });
    // The first request on a connection hands it over to Node's own request and keep-alive timeouts.
    server.on("request", (req: { socket: Socket }) => this.settle(req.socket));
  }

  /** Connections open without a request so far. */
  get size(): number {
    return this.waiting.size;
  }

  /** Drop every connection that has not sent a request (shutdown). Returns how many. */
  destroyAll(): number {
    const n = this.waiting.size;
    for (const socket of [...this.waiting.keys()]) {
      this.settle(socket);
      socket.destroy();
    }
    return n;
  }

  private settle(socket: Socket): void {
    const timer = this.waiting.get(socket);
    if (timer === undefined) return;
    clearTimeout(timer);
    this.waiting.delete(socket);
  }
}
