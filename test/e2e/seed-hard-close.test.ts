/**
 * The seed's reproducer (openvinotoolkit/model_server#4428) end to end against the real server process and the embedded
 * model: streaming greedy chats run concurrently; one client hard-closes its socket mid-generation (FIN or RST),
 * during a long prefill, while queued, or leaves a unary request. Every time: the same server process is alive,
 * readiness is 200, every other stream ends with [DONE] and exactly the text of its control run alone, the
 * running/waiting/active counts return to 0, and a fresh request succeeds. On both engines (llama.cpp, OpenVINO).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PROMPTS as ALL_PROMPTS } from "../support/prompts.js";
import { chat, type ChatResult, type CloseMode } from "../support/chat-client.js";
import { ENGINES_UNDER_TEST, get, metrics, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

const MAX_TOKENS = 40;
const PROMPTS = ALL_PROMPTS.slice(0, 5);
/** A prompt long enough that its prefill spans many steps at a 16-token budget. */
const LONG_PROMPT = Array.from({ length: 60 }, (_, i) => `line ${i}: the scheduler admits requests and prefills prompts in chunks;`).join("\n");

const body = (content: string, extra: Record<string, unknown> = {}) => ({
  model: "keel-tiny",
  messages: [{ role: "user", content }],
  temperature: 0,
  max_tokens: MAX_TOKENS,
  ignore_eos: true,
  stream: true,
  ...extra,
});

for (const engine of ENGINES_UNDER_TEST) describe(`engine: ${engine}`, () => {
  let server: ServerHandle;
  let pid: number;
  const control = new Map<string, string>();

  beforeAll(async () => {
    // On OpenVINO the F16 twin of the embedded model, served under the same name.
    server = await startServer(["--max_num_seqs", "4", "--max_num_batched_tokens", "16", ...(engine === "openvino" ? ["--model_name", "keel-tiny"] : [])], {}, { engine });
    pid = server.proc.pid!;
    // Controls: each request alone.
    for (const p of PROMPTS) {
      const r = await chat(server.baseUrl, body(p));
      expect(r.done).toBe(true);
      control.set(p, r.text);
    }
  });

  afterAll(async () => {
    await server?.stop();
  });

  /** Invariants after every scenario (docs/design-rules.md: the same process, live and ready, back to baseline, a fresh request succeeds). */
  async function expectHealthyAndIdle(): Promise<void> {
    expect(server.proc.exitCode).toBeNull();
    expect(server.proc.pid).toBe(pid);
    expect(() => process.kill(pid, 0)).not.toThrow();
    expect((await get(server.baseUrl, "/v2/health/live")).status).toBe(200);
    expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
    await waitForMetrics(
      server.baseUrl,
      (m) => m.get("keel_requests_running") === 0 && m.get("keel_requests_waiting") === 0 && m.get("keel_engine_sequences_active") === 0,
    );
    const fresh = await chat(server.baseUrl, body(PROMPTS[4]!));
    expect(fresh.done).toBe(true);
    expect(fresh.text).toBe(control.get(PROMPTS[4]!));
  }

  function expectBystander(r: ChatResult, prompt: string): void {
    expect(r.closedByClient).toBe(false);
    expect(r.status).toBe(200);
    expect(r.done).toBe(true);
    expect(r.finishReason).toBe("length");
    expect(r.text).toBe(control.get(prompt));
  }

  describe("seed reproducer: a client hard-closes mid-generation", () => {
    for (const mode of ["fin", "rst"] as CloseMode[]) {
      it(`closing one of 4 streams after its 3rd chunk (${mode.toUpperCase()}) leaves the other 3 identical to control`, async () => {
        const before = await metrics(server.baseUrl);
        const [victim, ...bystanders] = await Promise.all([
          // The victim asks for far more tokens than it will read, so it cannot end naturally before its close lands.
          chat(server.baseUrl, body(PROMPTS[0]!, { max_tokens: 1500 }), { onEvent: (_e, i, ctl) => i === 3 && ctl.close(mode) }),
          ...PROMPTS.slice(1, 4).map((p) => chat(server.baseUrl, body(p))),
        ]);
        expect(victim!.closedByClient).toBe(true);
        expect(victim!.done).toBe(false);
        bystanders.forEach((r, i) => expectBystander(r, PROMPTS[i + 1]!));
        await expectHealthyAndIdle();
        const after = await metrics(server.baseUrl);
        expect(after.get('keel_client_disconnects_total{phase="decode"}')).toBe(before.get('keel_client_disconnects_total{phase="decode"}')! + 1);
        expect(after.get('keel_requests_finished_total{finish_reason="abort"}')).toBe(before.get('keel_requests_finished_total{finish_reason="abort"}')! + 1);
      });
    }

    it("closing a stream during its long prefill leaves the others identical to control", async () => {
      const before = await metrics(server.baseUrl);
      const [victim, ...bystanders] = await Promise.all([
        // The first event (assistant role) is sent when the request is admitted: its prefill has just begun.
        chat(server.baseUrl, body(LONG_PROMPT, { max_tokens: 4 }), { onEvent: (_e, i, ctl) => i === 0 && ctl.close("rst") }),
        ...PROMPTS.slice(1, 4).map((p) => chat(server.baseUrl, body(p))),
      ]);
      expect(victim!.status).toBe(200);
      expect(victim!.closedByClient).toBe(true);
      expect(victim!.text).toBe("");
      bystanders.forEach((r, i) => expectBystander(r, PROMPTS[i + 1]!));
      await expectHealthyAndIdle();
      const after = await metrics(server.baseUrl);
      expect(after.get('keel_client_disconnects_total{phase="prefill"}')).toBe(before.get('keel_client_disconnects_total{phase="prefill"}')! + 1);
    });

    it("closing a queued stream (more requests than --max_num_seqs) never starts it and leaves the others identical", async () => {
      const before = await metrics(server.baseUrl);
      const running = PROMPTS.slice(0, 4).map((p) => chat(server.baseUrl, body(p)));
      let gotHeaders = false;
      const queued = chat(server.baseUrl, body(PROMPTS[4]!), { onHeaders: () => (gotHeaders = true), onSent: (ctl) => void closeWhenQueued(ctl) });
      async function closeWhenQueued(ctl: { close(m: CloseMode): void }): Promise<void> {
        await waitForMetrics(server.baseUrl, (m) => (m.get("keel_requests_waiting") ?? 0) >= 1, 400, 5);
        ctl.close("fin");
      }
      const results = await Promise.all(running);
      const victim = await queued;
      expect(victim.closedByClient).toBe(true);
      expect(gotHeaders).toBe(false);
      results.forEach((r, i) => expectBystander(r, PROMPTS[i]!));
      await expectHealthyAndIdle();
      const after = await metrics(server.baseUrl);
      expect(after.get('keel_client_disconnects_total{phase="queued"}')).toBe(before.get('keel_client_disconnects_total{phase="queued"}')! + 1);
    });

    it("a unary client that leaves mid-generation is aborted and the streams around it are identical", async () => {
      const before = await metrics(server.baseUrl);
      const unary = chat(server.baseUrl, body(PROMPTS[0]!, { stream: false, max_tokens: 1500 }), {
        onSent: (ctl) => {
          // Leave once the unary request is generating (engine steps advance with it running).
          void waitForMetrics(server.baseUrl, (m) => (m.get("keel_requests_running") ?? 0) >= 1 && m.get("keel_engine_steps_total")! >= before.get("keel_engine_steps_total")! + 30, 400, 5).then(() =>
            ctl.close("fin"),
          );
        },
      });
      const bystanders = await Promise.all(PROMPTS.slice(1, 4).map((p) => chat(server.baseUrl, body(p))));
      const victim = await unary;
      expect(victim.closedByClient).toBe(true);
      bystanders.forEach((r, i) => expectBystander(r, PROMPTS[i + 1]!));
      await expectHealthyAndIdle();
      const after = await metrics(server.baseUrl);
      const disconnects = (m: Map<string, number>) =>
        ["queued", "prefill", "decode"].reduce((a, p) => a + (m.get(`keel_client_disconnects_total{phase="${p}"}`) ?? 0), 0);
      expect(disconnects(after)).toBe(disconnects(before) + 1);
      expect(after.get('keel_requests_finished_total{finish_reason="abort"}')).toBe(before.get('keel_requests_finished_total{finish_reason="abort"}')! + 1);
    });
  });
});
