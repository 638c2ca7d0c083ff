/**
 * Graceful drain: on SIGTERM/SIGINT readiness turns 503, new requests get 503 with Retry-After, in-flight requests
 * finish (up to --shutdown_timeout, then they end with an error and are aborted), the engine stops, exit code 0.
 * A terminal's Ctrl-C signals the whole foreground process group: the engine runs in its own group, so it is the
 * gateway that stops it, in order.
 */
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
      const results = await Promise.all(streams);
      for (const r of results) {
        expect(r.done).toBe(true);
        expect(r.text).toBe(control.text);
      }
      expect(await exited(server.proc)).toBe(0);
    });
  }

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
