/**
 * Graceful drain: on SIGTERM/SIGINT readiness turns 503, new requests get 503 with Retry-After, in-flight requests
 * finish (up to --shutdown_timeout, then they end with an error and are aborted), the engine stops, exit code 0.
 * A terminal's Ctrl-C signals the whole foreground process group: the engine runs in its own group, so it is the
 * gateway that stops it, in order.
 */
import net from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { chat } from "../support/chat-client.js";
import { get, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

/** Servers started by a test; stopped afterwards even when the test failed before its own shutdown. */
const started: ServerHandle[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((s) => s.stop()));
});

const req = (maxTokens: number) => ({
  model: "keel-tiny",
  messages: [{ role: "user", content: "drain me" }],
  temperature: 0,
  ignore_eos: true,
  max_tokens: maxTokens,
  stream: true,
});

function exited(proc: import("node:child_process").ChildProcess): Promise<number | null> {
  return new Promise((resolve) => {
    if (proc.exitCode !== null) resolve(proc.exitCode);
    else proc.once("exit", (code) => resolve(code));
  });
}

describe("graceful drain", () => {
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    it(`${signal} under load: in-flight streams complete, new requests get 503, exit 0`, async () => {
      const server = await startServer(["--max_num_seqs", "2"]);
      started.push(server);
      const control = await chat(server.baseUrl, req(300));
      let signalled = false;
      const streams = [0, 1].map(() =>
        chat(server.baseUrl, req(300), {
          onEvent: (_e, i) => {
            if (i === 3 && !signalled) {
              signalled = true;
              // SIGINT goes to the whole process group, as a terminal's Ctrl-C does.
              if (signal === "SIGINT") process.kill(-server.proc.pid!, "SIGINT");
              else server.proc.kill("SIGTERM");
            }
          },
        }),
      );
      await waitForMetrics(server.baseUrl, () => signalled);
      // Readiness turns 503 and new requests are refused while the drain runs.
      let refused: Awaited<ReturnType<typeof chat>> | null = null;
      for (let i = 0; i < 100 && !refused; i++) {
        const r = await chat(server.baseUrl, req(2));
        if (r.status === 503) refused = r;
      }
      expect(refused?.status).toBe(503);
      expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(503);
      expect((await get(server.baseUrl, "/health")).status).toBe(503);
      const results = await Promise.all(streams);
      for (const r of results) {
        expect(r.done).toBe(true);
        expect(r.text).toBe(control.text);
      }
      expect(await exited(server.proc)).toBe(0);
    });
  }

  it("the same Ctrl-C delivered twice within a few ms (npm forwards it) counts once: the drain is honoured", async () => {
    const server = await startServer(["--max_num_seqs", "1"]);
    started.push(server);
    const control = await chat(server.baseUrl, req(300));
    const stream = chat(server.baseUrl, req(300), {
      onEvent: (_e, i) => {
        if (i === 3) {
          // What `npm run serve` does on Ctrl-C: the terminal signals the group, and npm forwards the same signal a
          // few ms later (20 ms here: two signals at once would be merged into one by the kernel).
          process.kill(-server.proc.pid!, "SIGINT");
          setTimeout(() => server.proc.kill("SIGINT"), 20);
        }
      },
    });
    const r = await stream;
    expect(r.done).toBe(true);
    expect(r.text).toBe(control.text);
    expect(await exited(server.proc)).toBe(0);
    const lines = server.logs.map((l) => {
      try {
        return JSON.parse(l) as { event?: string };
      } catch {
        return {};
      }
    });
    expect(lines.filter((l) => l.event === "shutdown")).toHaveLength(1);
    expect(lines.filter((l) => l.event === "shutdown_signal_repeated")).toHaveLength(1);
  });

  it("a connection that never sent a byte neither blocks the drain nor outlives --request_timeout", async () => {
    const server = await startServer(["--request_timeout", "1"]);
    started.push(server);
    // 1. --request_timeout drops a silent connection.
    const first = net.connect(server.port, "127.0.0.1");
    first.on("error", () => undefined);
    const firstClosed = new Promise<number>((r) => first.once("close", () => r(Date.now())));
    const openedAt = await new Promise<number>((r) => first.once("connect", () => r(Date.now())));
    expect((await firstClosed) - openedAt).toBeLessThan(5000);
    // 2. A drain finishes with a silent connection open.
    const silent = net.connect(server.port, "127.0.0.1");
    silent.on("error", () => undefined);
    const silentClosed = new Promise<void>((r) => silent.once("close", () => r()));
    await new Promise<void>((r) => silent.once("connect", () => r()));
    server.proc.kill("SIGTERM");
    expect(await exited(server.proc)).toBe(0);
    await silentClosed;
  });

  it("a client half-way through sending its request does not hold the exit past --shutdown_timeout", async () => {
    // --request_timeout far beyond the test's own limit: only the shutdown can end this connection in time.
    const server = await startServer(["--request_timeout", "600", "--shutdown_timeout", "1"]);
    started.push(server);
    const half = net.connect(server.port, "127.0.0.1");
    half.on("error", () => undefined);
    await new Promise<void>((r) => half.once("connect", () => r()));
    const halfClosed = new Promise<void>((r) => half.once("close", () => r()));
    half.write('POST /v3/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"mo');
    server.proc.kill("SIGTERM");
    // Without the drop the process waits for the client (600 s): a bound far above a normal drain tells the two apart
    // with a clear failure instead of the test runner's timeout.
    let bound: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([exited(server.proc), new Promise<"still running">((r) => (bound = setTimeout(() => r("still running"), 20_000)))]);
    clearTimeout(bound);
    expect(outcome).toBe(0);
    await halfClosed;
  });

  it("a 503 while draining is logged at info with the request id, not as an error", async () => {
    const server = await startServer(["--max_num_seqs", "1", "--shutdown_timeout", "5"]);
    started.push(server);
    let refused: Awaited<ReturnType<typeof chat>> | null = null;
    const stream = chat(server.baseUrl, req(400), { onEvent: (_e, i) => i === 2 && server.proc.kill("SIGTERM") });
    await waitForMetrics(server.baseUrl, () => server.logs.some((l) => l.includes('"event":"drain_started"')));
    refused = await chat(server.baseUrl, req(2));
    expect(refused.status).toBe(503);
    await stream;
    expect(await exited(server.proc)).toBe(0);
    const unavailable = server.jsonLines().map((l) => JSON.parse(l) as { level: number; event?: string; requestId?: string; code?: string }).filter((l) => l.event === "unavailable");
    expect(unavailable.length).toBeGreaterThanOrEqual(1);
    for (const l of unavailable) {
      expect(l.level).toBe(30);
      expect(l.requestId).toMatch(/\S/);
      expect(l.code).toBe("shutting_down");
    }
    expect(server.jsonLines().some((l) => (JSON.parse(l) as { level: number }).level >= 50 && l.includes("shutting down"))).toBe(false);
  });

  it("a second signal, well after the first, ends the wait at once: logged as hurried, one shutdown wording", async () => {
    const server = await startServer(["--max_num_seqs", "1", "--shutdown_timeout", "60", "--max_num_batched_tokens", "8"]);
    started.push(server);
    let firstAt = 0;
    const stream = chat(server.baseUrl, req(1900), {
      onEvent: (_e, i) => {
        if (i === 2) {
          firstAt = Date.now();
          server.proc.kill("SIGTERM");
        }
      },
    });
    await waitForMetrics(server.baseUrl, () => server.logs.some((l) => l.includes('"event":"drain_started"')));
    // "Well after" is the condition under test (a repeat within 100 ms counts as the same signal), so wait it out.
    await new Promise((r) => setTimeout(r, Math.max(0, firstAt + 250 - Date.now())));
    server.proc.kill("SIGTERM");
    const r = await stream;
    expect(r.done).toBe(false);
    const last = r.events.at(-1) as { error?: { code?: string; message?: string } };
    expect(last.error?.code).toBe("shutting_down");
    expect(last.error?.message).toBe("The server is shutting down.");
    expect(await exited(server.proc)).toBe(0);
    const events = server.jsonLines().map((l) => (JSON.parse(l) as { event?: string }).event);
    expect(events).toContain("drain_hurried");
    expect(events).not.toContain("drain_timeout");
  });

  it("--shutdown_timeout ends what is still running with an error event, then exits 0", async () => {
    const server = await startServer(["--max_num_seqs", "1", "--shutdown_timeout", "0", "--max_num_batched_tokens", "8"]);
    started.push(server);
    const stream = chat(server.baseUrl, req(1900), { onEvent: (_e, i) => i === 2 && server.proc.kill("SIGTERM") });
    const r = await stream;
    expect(r.done).toBe(false);
    const last = r.events.at(-1) as { error?: { code?: string } };
    expect(last.error?.code).toBe("shutting_down");
    expect(await exited(server.proc)).toBe(0);
  });
});
