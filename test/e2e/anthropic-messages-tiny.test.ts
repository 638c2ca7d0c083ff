/**
 * The Anthropic Messages API on the tiny random-weight models (fast, deterministic under greedy decoding): the
 * thinking switch reaches the template (count_tokens of the same conversation with thinking on, off and unsaid), a
 * guided tool call streamed as input_json_delta equal to the unary answer, refusals without the parsers, an engine
 * killed mid-stream resumes the stream to the same answer, and a request the engine fails after the stream began ends
 * with an `error` event in Anthropic's envelope.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { metrics, startServer, type ServerHandle } from "../support/server.js";

const AGENT_FLAGS = ["--model_path", "keel-tiny-qwen3", "--tool_parser", "auto", "--reasoning_parser", "qwen3", "--max_num_seqs", "2", "--max_num_batched_tokens", "64"];
const PLAIN_FLAGS = ["--max_num_seqs", "2", "--max_num_batched_tokens", "64"];

let agent: ServerHandle;
let plain: ServerHandle;

beforeAll(async () => {
  [agent, plain] = await Promise.all([startServer(AGENT_FLAGS), startServer(PLAIN_FLAGS, { KEEL_FAULT_INJECTION: JSON.stringify({ failOnPrompt: "POISON" }) })]);
}, 120_000);
afterAll(async () => {
  await Promise.all([agent?.stop(), plain?.stop()]);
});

const ask = [{ role: "user", content: "Weather in Paris?" }];
const weather = { name: "get_weather", description: "Current weather of a city", input_schema: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Rome"] } }, required: ["city"], additionalProperties: false } };

async function post(s: ServerHandle, p: string, body: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
  const r = await fetch(`${s.baseUrl}${p}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
}

/** One SSE event: its `event:` name and parsed data. */
interface Sse {
  event: string;
  data: Record<string, unknown>;
}

/** A streamed Messages request: every event, in order; `onEvent` is called after each. */
async function stream(s: ServerHandle, body: Record<string, unknown>, onEvent: (ev: Sse, i: number) => void = () => {}): Promise<{ status: number; events: Sse[]; raw: string }> {
  const r = await fetch(`${s.baseUrl}/v1/messages`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...body, stream: true }) });
  const raw = await new Promise<string>((resolve, reject) => {
    let text = "";
    let parsed = 0;
    const reader = r.body!.getReader();
    const pump = (): void => {
      reader.read().then(({ value, done }) => {
        if (done) return resolve(text);
        text += Buffer.from(value!).toString("utf8");
        const frames = text.split("\n\n").slice(0, -1);
        for (; parsed < frames.length; parsed++) onEvent(parse(frames[parsed]!), parsed);
        pump();
      }, reject);
    };
    pump();
  });
  return { status: r.status, events: raw.split("\n\n").filter((f) => f !== "").map(parse), raw };
}

function parse(frame: string): Sse {
  const event = /^event: (.*)$/m.exec(frame)?.[1] ?? "";
  const data = /^data: (.*)$/m.exec(frame)?.[1] ?? "null";
  return { event, data: JSON.parse(data) as Record<string, unknown> };
}

/** The text and each tool call's input JSON of a stream, assembled from its deltas. */
function assemble(events: Sse[]): { text: string; inputs: string[] } {
  let text = "";
  const inputs = new Map<number, string>();
  for (const { data } of events) {
    const d = data.delta as { type?: string; text?: string; partial_json?: string } | undefined;
    if (data.type !== "content_block_delta" || !d) continue;
    if (d.type === "text_delta") text += d.text;
    if (d.type === "input_json_delta") inputs.set(data.index as number, (inputs.get(data.index as number) ?? "") + d.partial_json);
  }
  return { text, inputs: [...inputs.values()] };
}

describe("thinking and tools on a Qwen3-style template (--reasoning_parser qwen3, --tool_parser auto)", () => {
  it("thinking disabled closes an empty think block in the prompt; enabled and unsaid keep the template's default", async () => {
    const count = async (thinking?: unknown): Promise<number> => {
      const r = await post(agent, "/v1/messages/count_tokens", { model: "keel-tiny-qwen3", messages: ask, ...(thinking ? { thinking } : {}) });
      expect(r.status).toBe(200);
      return r.body.input_tokens as number;
    };
    const unsaid = await count();
    expect(await count({ type: "enabled", budget_tokens: 1024 })).toBe(unsaid);
    expect(await count({ type: "disabled" })).toBeGreaterThan(unsaid);
  });

  it("tool_choice any (one call): a guided tool_use with schema-valid input; the streamed input_json fragments equal the unary input", async () => {
    const body = { model: "keel-tiny-qwen3", max_tokens: 300, temperature: 0, tools: [weather], tool_choice: { type: "any", disable_parallel_tool_use: true }, thinking: { type: "disabled" }, messages: ask };
    const unary = await post(agent, "/v1/messages", body);
    expect(unary.status).toBe(200);
    expect(unary.body.stop_reason, JSON.stringify(unary.body)).toBe("tool_use");
    const calls = (unary.body.content as { type: string; name?: string; input?: { city?: unknown } }[]).filter((b) => b.type === "tool_use");
    expect(calls.length).toBeGreaterThan(0);
    expect(calls[0]!.name).toBe("get_weather");
    expect(["Paris", "Rome"]).toContain(calls[0]!.input!.city);
    const s = await stream(agent, body);
    expect(s.events.map((e) => e.event).slice(0, 2)).toEqual(["message_start", "ping"]);
    expect(s.events.map((e) => e.event).slice(-2)).toEqual(["message_delta", "message_stop"]);
    expect(s.raw).not.toContain("[DONE]");
    expect(s.events.every((e) => e.data.type === e.event)).toBe(true);
    const usage = unary.body.usage as { input_tokens: number; output_tokens: number };
    expect(s.events.at(-2)!.data).toEqual({ type: "message_delta", delta: { stop_reason: "tool_use", stop_sequence: null }, usage: { input_tokens: usage.input_tokens, output_tokens: usage.output_tokens } });
    expect(assemble(s.events).inputs.map((j) => JSON.parse(j) as unknown)).toEqual(calls.map((c) => c.input));
  });
});

describe("without the parsers", () => {
  it("thinking enabled is refused naming --reasoning_parser; tools naming --tool_parser (Anthropic's envelope)", async () => {
    const thinking = await post(plain, "/v1/messages", { model: "keel-tiny", max_tokens: 2000, thinking: { type: "enabled", budget_tokens: 1024 }, messages: ask });
    expect(thinking.status).toBe(400);
    expect(thinking.body).toEqual({ type: "error", error: { type: "invalid_request_error", message: expect.stringContaining("--reasoning_parser") } });
    const tools = await post(plain, "/v1/messages", { model: "keel-tiny", max_tokens: 5, tools: [weather], messages: ask });
    expect(tools.status).toBe(400);
    expect(tools.body).toEqual({ type: "error", error: { type: "invalid_request_error", message: expect.stringContaining("--tool_parser") } });
  });
});

describe("routes", () => {
  it("another method on a Messages path is a 405 with Allow: POST in Anthropic's envelope", async () => {
    const r = await fetch(`${plain.baseUrl}/v1/messages?beta=true`);
    expect(r.status).toBe(405);
    expect(r.headers.get("allow")).toBe("POST");
    const body = (await r.json()) as { type: string; error: { type: string; message: string } };
    expect(body).toEqual({ type: "error", error: { type: "invalid_request_error", message: "Method 'GET' is not allowed on '/v1/messages'. Allowed: POST." } });
  });

  it("a query string (Claude Code sends ?beta=true) does not change the route", async () => {
    const r = await post(plain, "/v1/messages/count_tokens?beta=true", { model: "keel-tiny", messages: ask });
    expect(r.status).toBe(200);
    expect(r.body.input_tokens).toBeGreaterThan(0);
  });
});

describe("engine faults during a stream", () => {
  it("an engine killed mid-stream is restarted and the stream continues to the undisturbed answer", async () => {
    const body = { model: "keel-tiny", max_tokens: 40, temperature: 0, messages: [{ role: "user", content: "Tell me about rivers." }] };
    const control = await post(plain, "/v1/messages", body);
    expect(control.status).toBe(200);
    const before = await metrics(plain.baseUrl);
    const pid = plain.enginePid();
    let killed = false;
    const s = await stream(plain, body, (ev) => {
      if (!killed && ev.event === "content_block_delta") {
        killed = true;
        process.kill(pid, "SIGKILL");
      }
    });
    expect(killed).toBe(true);
    expect(s.events.at(-1)!.event).toBe("message_stop");
    const text = (control.body.content as { text: string }[]).map((b) => b.text).join("");
    expect(assemble(s.events).text).toBe(text);
    expect(s.events.at(-2)!.data.delta).toEqual({ stop_reason: control.body.stop_reason, stop_sequence: null });
    const after = await metrics(plain.baseUrl);
    expect(after.get("keel_requests_resumed_total")! - before.get("keel_requests_resumed_total")!).toBeGreaterThanOrEqual(1);
  });

  it("a request the engine fails after the stream began ends with an `error` event (api_error), no message_stop", async () => {
    const s = await stream(plain, { model: "keel-tiny", max_tokens: 10, temperature: 0, messages: [{ role: "user", content: "POISON" }] });
    expect(s.status).toBe(200);
    expect(s.events[0]!.event).toBe("message_start");
    expect(s.events.at(-1)).toEqual({ event: "error", data: { type: "error", error: { type: "api_error", message: expect.stringContaining("engine") } } });
    expect(s.events.some((e) => e.event === "message_stop")).toBe(false);
  });
});

describe("drain", () => {
  it("SIGTERM with --shutdown_timeout 0: the running stream ends with an overloaded_error event (as chat's shutting_down); exit 0", async () => {
    const server = await startServer(["--max_num_seqs", "1", "--shutdown_timeout", "0", "--max_num_batched_tokens", "8"]);
    try {
      const exited = new Promise<number | null>((resolve) => server.proc.once("exit", (code) => resolve(code)));
      let signalled = false;
      const s = await stream(server, { model: "keel-tiny", max_tokens: 1900, temperature: 0, messages: [{ role: "user", content: "Tell me about rivers." }] }, (ev) => {
        if (!signalled && ev.event === "content_block_delta") {
          signalled = true;
          server.proc.kill("SIGTERM");
        }
      });
      expect(signalled).toBe(true);
      expect(s.events.at(-1)).toEqual({ event: "error", data: { type: "error", error: { type: "overloaded_error", message: "The server is shutting down." } } });
      expect(await exited).toBe(0);
    } finally {
      await server.stop();
    }
  });
});
