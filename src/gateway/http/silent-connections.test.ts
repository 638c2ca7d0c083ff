import http from "node:http";
import net from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { SilentConnections } from "./silent-connections.js";

/** An HTTP server with the guard, on an ephemeral loopback port. */
async function serve(timeoutMs: number): Promise<{ server: http.Server; guard: SilentConnections; port: number }> {
  const server = http.createServer((_req, res) => res.end("ok"));
  const guard = new SilentConnections(server, timeoutMs);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return { server, guard, port: (server.address() as net.AddressInfo).port };
}

/** Open a TCP connection that sends nothing; resolves once connected, with a promise of its close. */
async function silentClient(port: number): Promise<{ socket: net.Socket; closed: Promise<void> }> {
  const socket = net.connect(port, "127.0.0.1");
  const closed = new Promise<void>((r) => socket.once("close", () => r()));
  socket.on("error", () => undefined);
  await new Promise<void>((r) => socket.once("connect", () => r()));
  return { socket, closed };
}

let server: http.Server | null = null;
afterEach(() => {
  server?.closeAllConnections();
  server?.close();
  server = null;
});

describe("SilentConnections", () => {
  it("drops a connection that never sends a byte after the timeout", async () => {
    const s = await serve(150);
    server = s.server;
    const c = await silentClient(s.port);
    const started = Date.now();
    await c.closed;
    expect(Date.now() - started).toBeGreaterThanOrEqual(100);
    expect(s.guard.size).toBe(0);
  });

  it("leaves a connection alone once it sent a request", async () => {
    const s = await serve(150);
    server = s.server;
    const agent = new http.Agent({ keepAlive: true });
    const body = await new Promise<string>((resolve, reject) => {
      http.get({ host: "127.0.0.1", port: s.port, path: "/", agent }, (res) => {
        let b = "";
        res.on("data", (d: Buffer) => (b += d.toString()));
        res.on("end", () => resolve(b));
      }).on("error", reject);
    });
    expect(body).toBe("ok");
    expect(s.guard.size).toBe(0);
    agent.destroy();
  });

  it("destroyAll drops every silent connection at once, so server.close() can finish", async () => {
    const s = await serve(60_000);
    server = s.server;
    // Both connections accepted by the server (its 'connection' event), not only connected on the client's side.
    let accepted = 0;
    const bothAccepted = new Promise<void>((r) => s.server.on("connection", () => ++accepted === 2 && r()));
    const a = await silentClient(s.port);
    const b = await silentClient(s.port);
    await bothAccepted;
    const closed = new Promise<void>((r) => s.server.close(() => r()));
    expect(s.guard.destroyAll()).toBe(2);
    await Promise.all([a.closed, b.closed, closed]);
    server = null;
  });
});
