/**
 * The seed's reproducer (openvinotoolkit/model_server#4428) end to end against the real server process and the embedded
 * model: streaming greedy chats run concurrently; one client hard-closes its socket mid-generation (FIN or RST),
 * during a long prefill, while queued, or leaves a unary request. Every time: the same server process is alive,
 * readiness is 200, every other stream ends with [DONE] and exactly the text of its control run alone, the
 * running/waiting/active counts return to 0, and a fresh request succeeds. On both engines (llama.cpp, OpenVINO), and
 * on the tiny hybrid (linear-attention) IR on OpenVINO with the seed's flags and a pool the streams outgrow, so that
 * the worker preempts (whole) while clients hard-close.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PROMPTS as ALL_PROMPTS } from "../support/prompts.js";
import { chat, type ChatResult, type CloseMode } from "../support/chat-client.js";
import { hybridModel } from "../support/openvino.js";
import { ENGINES_UNDER_TEST, get, metrics, startServer, waitForMetrics, type EngineUnderTest, type ServerHandle } from "../support/server.js";

const MAX_TOKENS = 40;
const PROMPTS = ALL_PROMPTS.slice(0, 5);
/** A prompt long enough that its prefill spans many steps at a 16-token budget. */
const LONG_PROMPT = Array.from({ length: 60 }, (_, i) => `line ${i}: the scheduler admits requests and prefills prompts in chunks;`).join("\n");

/** Where the reproducer runs: an engine with its tiny model, and what the scenarios ask of it. */
interface Target {
  name: string;
  engine: EngineUnderTest;
  flags: () => Promise<string[]>;
  /** Bystanders' max_tokens. */
  maxTokens: number;
  /** The hard-closed victims' max_tokens (more than they will read). */
  victimMaxTokens: number;
  longPrompt: string;
  /** The pool is outgrown: preemptions must show in /metrics. */
  preempts: boolean;
}

const TARGETS: Target[] = [
  // On OpenVINO the F16 twin of the embedded model, served under the same name.
  ...ENGINES_UNDER_TEST.map((engine) => ({ name: `engine: ${engine}`, engine, flags: async () => (engine === "openvino" ? ["--model_name", "keel-tiny"] : []), maxTokens: MAX_TOKENS, victimMaxTokens: 1500, longPrompt: LONG_PROMPT, preempts: false })),
  {
    // The seed's flags; 16 blocks of 32 tokens: three ~165-token streams need 18 blocks, so the worker preempts.
    name: "engine: openvino, hybrid IR (seed's flags, 16-block pool)",
    engine: "openvino",
    flags: async () => ["--model_path", await hybridModel(), "--model_name", "keel-tiny", "--enable_prefix_caching", "true", "--cache_interval_multiplier", "64", "--num_kv_blocks", "16"],
    maxTokens: 120,
    victimMaxTokens: 300,
    // ~320 tokens of this model's small vocabulary: 20 steps at 16 a step, and it fits the pool.
    longPrompt: LONG_PROMPT.split("\n").slice(0, 6).join("\n"),
    preempts: true,
  },
];

for (const target of TARGETS) describe(target.name, () => {
  const body = (content: string, extra: Record<string, unknown> = {}) => ({
    model: "keel-tiny",
    messages: [{ role: "user", content }],
    temperature: 0,
    max_tokens: target.maxTokens,
    ignore_eos: true,
    stream: true,
    ...extra,
  });
  let server: ServerHandle;
  let pid: number;
  const control = new Map<string, string>();

  beforeAll(async () => {
    server = await startServer(["--max_num_seqs", "4", "--max_num_batched_tokens", "16", ...(await target.flags())], {}, { engine: target.engine });
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
          chat(server.baseUrl, body(PROMPTS[0]!, { max_tokens: target.victimMaxTokens }), { onEvent: (_e, i, ctl) => i === 3 && ctl.close(mode) }),
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
        chat(server.baseUrl, body(target.longPrompt, { max_tokens: 4 }), { onEvent: (_e, i, ctl) => i === 0 && ctl.close("rst") }),
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
      const grew = (phase: string) => after.get(`keel_client_disconnects_total{phase="${phase}"}`)! - before.get(`keel_client_disconnects_total{phase="${phase}"}`)!;
      if (!target.preempts) expect(grew("queued")).toBe(1);
      else {
        // On the 16-block pool the worker preempts: a running stream can go back to waiting and give its slot to the
        // queued one in the step before the close is applied, so the engine may have admitted it (never a chunk sent).
        expect(grew("queued") + grew("prefill")).toBe(1);
      }
    });

    it("a unary client that leaves mid-generation is aborted and the streams around it are identical", async () => {
      const before = await metrics(server.baseUrl);
      const unary = chat(server.baseUrl, body(PROMPTS[0]!, { stream: false, max_tokens: target.victimMaxTokens }), {
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

  if (target.preempts) {
    it("the streams outgrew the pool: the engine preempted, and every stream above still equalled its control", async () => {
      const m = await metrics(server.baseUrl);
      expect(m.get('keel_engine_preemptions_total{model="keel-tiny"}')!).toBeGreaterThan(0);
      expect(m.get('keel_engine_linear_attention_blocks_capacity{model="keel-tiny"}')!).toBeGreaterThan(0);
      expect(m.get('keel_engine_linear_attention_blocks_in_use{model="keel-tiny"}')).toBe(0);
      expect(m.get('keel_engine_restarts_total{reason="exit"}')).toBe(0);
      // Every preemption was the worker's own (whole): OpenVINO never had to preempt a hybrid sequence itself.
      const own = server.logs.filter((l) => l.includes('"event":"hybrid_preempt"')).reduce((n, l) => n + (JSON.parse(l) as { engine: { requests: string[] } }).engine.requests.length, 0);
      expect(own).toBe(m.get('keel_engine_preemptions_total{model="keel-tiny"}'));
      expect(server.logs.some((l) => l.includes('"event":"hybrid_ov_preempted"'))).toBe(false);
    });
  }
});
