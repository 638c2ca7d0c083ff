/**
 * Recipe 14 with agents: the disconnect storm again with grammars, tool parsing, stop strings and logprobs active.
 * keel-tiny-qwen3coder with --tool_parser qwen3coder --enable_tool_guided_generation true; 4 sequences, a small
 * step budget; 96 greedy streaming requests of four kinds (forced tool call with logprobs, guided `auto` with a stop
 * string, JSON-schema output with logprobs, plain text with a stop string) at concurrency 12, about a third
 * hard-closed at random phases. Every bystander's whole answer (content, reasoning, tool calls, finish reason,
 * logprob tokens) equals its control run; the process, its readiness and the gauges come back to baseline.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chat, type ChatResult, type CloseMode } from "../support/chat-client.js";
import { get, metrics, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

const TOTAL = 96;
const CONCURRENCY = 12;

/** Deterministic PRNG (mulberry32) so a failing storm can be replayed. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const lookup = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: { type: "object", properties: { city: { type: "string", minLength: 1, maxLength: 8 }, days: { type: "integer", minimum: 1, maximum: 7 } }, required: ["city"], additionalProperties: false },
  },
};
const order = {
  type: "function",
  function: { name: "place_order", parameters: { type: "object", properties: { item: { enum: ["tea", "coffee"] }, qty: { type: "integer", minimum: 1, maximum: 9 } }, required: ["item", "qty"], additionalProperties: false } },
};
const person = { type: "object", properties: { name: { type: "string", maxLength: 6 }, age: { type: "integer", minimum: 0, maximum: 99 } }, required: ["name", "age"], additionalProperties: false };

const QUESTIONS = ["Weather in Paris?", "Order two teas.", "Who are you?", "Plan my week."];
const KINDS: Record<string, Record<string, unknown>> = {
  forced: { tools: [lookup, order], tool_choice: "required", parallel_tool_calls: false, logprobs: true, top_logprobs: 2, max_tokens: 200 },
  auto: { tools: [lookup, order], tool_choice: "auto", stop: ["ed"], max_tokens: 24 },
  schema: { response_format: { type: "json_schema", json_schema: { name: "person", schema: person } }, logprobs: true, max_tokens: 200 },
  plain: { stop: ["the"], max_tokens: 16 },
};
const body = (q: string, kind: string) => ({ model: "keel-tiny-qwen3coder", messages: [{ role: "user", content: q }], temperature: 0, stream: true, ...KINDS[kind] });
const key = (q: string, kind: string) => `${kind}|${q}`;

/** Everything a client sees of one streamed answer, as one comparable string. */
function answer(r: ChatResult): string {
  let content = "";
  let reasoning = "";
  let finish: unknown = null;
  const calls: string[] = [];
  const tokens: string[] = [];
  for (const ev of r.events) {
    const c = (ev.choices as { delta?: Record<string, unknown>; finish_reason?: unknown; logprobs?: { content?: { token: string }[] } | null }[] | undefined)?.[0];
    if (!c) continue;
    const d = c.delta ?? {};
    if (typeof d.content === "string") content += d.content;
    if (typeof d.reasoning_content === "string") reasoning += d.reasoning_content;
    for (const t of (d.tool_calls as { index: number; function: { name?: string; arguments?: string } }[] | undefined) ?? []) {
      calls[t.index] = (calls[t.index] ?? "") + (t.function.name ? `${t.function.name}:` : "") + (t.function.arguments ?? "");
    }
    for (const lp of c.logprobs?.content ?? []) tokens.push(lp.token);
    if (c.finish_reason) finish = c.finish_reason;
  }
  return JSON.stringify({ content, reasoning, calls, finish, tokens });
}

type Plan = { q: string; kind: string; victim: null | { at: "sent" | "admitted" | "chunk"; chunk: number; mode: CloseMode } };

describe("disconnect storm with tools, grammars, stop strings and logprobs", () => {
  let server: ServerHandle;
  const control = new Map<string, string>();

  beforeAll(async () => {
    server = await startServer(["--model_path", "keel-tiny-qwen3coder", "--tool_parser", "qwen3coder", "--enable_tool_guided_generation", "true", "--max_num_seqs", "4", "--max_num_batched_tokens", "32", "--max_queued_requests", "1000"]);
    for (const q of QUESTIONS) {
      for (const kind of Object.keys(KINDS)) {
        const r = await chat(server.baseUrl, body(q, kind));
        expect(r.done, `${kind} ${q}`).toBe(true);
        control.set(key(q, kind), answer(r));
      }
    }
  });
  afterAll(async () => {
    await server?.stop();
  });

  it(`${TOTAL} guided and plain requests at concurrency ${CONCURRENCY}, a third hard-closed: bystanders identical, gauges back to 0`, async () => {
    // The controls exercised what we meant: forced calls came out as calls, schema output as JSON.
    for (const q of QUESTIONS) {
      expect(JSON.parse(control.get(key(q, "forced"))!).finish, control.get(key(q, "forced"))).toBe("tool_calls");
      const schema = JSON.parse(control.get(key(q, "schema"))!) as { content: string; finish: string };
      expect(schema.finish, schema.content).toBe("stop");
      expect(typeof JSON.parse(schema.content)).toBe("object");
    }
    const rand = prng(20261209);
    const kinds = Object.keys(KINDS);
    const plans: Plan[] = Array.from({ length: TOTAL }, () => {
      const q = QUESTIONS[Math.floor(rand() * QUESTIONS.length)]!;
      const kind = kinds[Math.floor(rand() * kinds.length)]!;
      if (rand() >= 1 / 3) return { q, kind, victim: null };
      const at = (["sent", "admitted", "chunk"] as const)[Math.floor(rand() * 3)]!;
      return { q, kind, victim: { at, chunk: 1 + Math.floor(rand() * 6), mode: rand() < 0.5 ? "fin" : "rst" } };
    });
    const pid = server.proc.pid;
    const results: { plan: Plan; r: ChatResult }[] = [];
    let next = 0;
    async function worker(): Promise<void> {
      while (next < plans.length) {
        const plan = plans[next++]!;
        const v = plan.victim;
        const r = await chat(server.baseUrl, body(plan.q, plan.kind), {
          onSent: (ctl) => v?.at === "sent" && ctl.close(v.mode),
          onEvent: (_e, i, ctl) => {
            if (v?.at === "admitted" && i === 0) ctl.close(v.mode);
            if (v?.at === "chunk" && i === v.chunk) ctl.close(v.mode);
          },
        });
        results.push({ plan, r });
      }
    }
    await Promise.all(Array.from({ length: CONCURRENCY }, () => worker()));

    let bystanders = 0;
    for (const { plan, r } of results) {
      if (r.closedByClient) continue;
      bystanders += 1;
      expect(r.status, `${plan.kind} ${plan.q}`).toBe(200);
      expect(r.done).toBe(true);
      expect(answer(r), `${plan.kind} ${plan.q}`).toBe(control.get(key(plan.q, plan.kind)));
    }
    expect(bystanders).toBeGreaterThan(TOTAL / 3);
    expect(TOTAL - bystanders).toBeGreaterThan(TOTAL / 6);

    expect(server.proc.exitCode).toBeNull();
    expect(server.proc.pid).toBe(pid);
    expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
    await waitForMetrics(server.baseUrl, (m) => m.get("keel_requests_running") === 0 && m.get("keel_requests_waiting") === 0 && m.get("keel_engine_sequences_active") === 0);
    const m = await metrics(server.baseUrl);
    expect(m.get("keel_requests_running")).toBe(0);
    // A fresh forced call still gives its control answer.
    const fresh = await chat(server.baseUrl, body(QUESTIONS[0]!, "forced"));
    expect(answer(fresh)).toBe(control.get(key(QUESTIONS[0]!, "forced")));
  });
});
