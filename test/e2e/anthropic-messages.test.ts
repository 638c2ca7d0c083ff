/**
 * The Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) on the real model
 * (Qwen2.5-Coder-0.5B-Instruct, hermes `<tool_call>` template, `--tool_parser hermes3`), driven with the official SDKs
 * as an agent would: a tool loop (tool_use → tool_result → answer) unary and streamed with the Node SDK and the
 * Python SDK (test/e2e/python/anthropic_check.py), the streamed events and input_json fragments against the unary
 * answer (with --deterministic true both runs compute the same logits), stop sequences, count_tokens against the
 * prompt's usage, errors in Anthropic's envelope (400, 401 with either header, 404), the other prefixes, and a
 * client that leaves mid-stream costing exactly one abort.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import Anthropic from "@anthropic-ai/sdk";
import type { MessageParam, Tool } from "@anthropic-ai/sdk/resources/messages";
import { Ajv2020 } from "ajv/dist/2020.js";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { realModelPath } from "../support/real-models.js";
import { metrics, ROOT, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

const MODEL = "qwen-coder";
// A real model on a shared CPU: a few short generations per test, each up to a minute when the machine is busy.
vi.setConfig({ testTimeout: 300_000 });
const KEY = "keel-test-key";
let server: ServerHandle;
let sdk: Anthropic;

beforeAll(async () => {
  const file = realModelPath("qwen2.5-coder-0.5b-instruct");
  server = await startServer(["--model_path", file, "--model_name", MODEL, "--tool_parser", "hermes3", "--deterministic", "true", "--max_num_seqs", "2", "--max_model_len", "2048", "--engine_stall_timeout", "600"], { API_KEY: KEY });
  sdk = new Anthropic({ baseURL: server.baseUrl, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
}, 180_000);
afterAll(async () => {
  await server?.stop();
});

const tools: Tool[] = [
  {
    name: "get_weather",
    description: "Get the current weather for a city",
    input_schema: { type: "object", properties: { city: { type: "string", description: "City name" } }, required: ["city"] },
  },
];
const ajv = new Ajv2020({ strict: false });
const validWeather = ajv.compile(tools[0]!.input_schema);
const ask: MessageParam[] = [{ role: "user", content: "What is the weather in Paris right now?" }];
/**
 * Greedy decoding: `temperature` is not in this SDK's request types any more (Anthropic's newest models take no
 * sampling parameters), but the SDK sends what it is given, and Keel applies it as older clients expect.
 */
const greedy = <T extends object>(params: T): T => ({ ...params, temperature: 0 });
const forced = greedy({ model: MODEL, max_tokens: 80, tools, tool_choice: { type: "any" as const }, messages: ask });

type Block = { type: string; id?: string; name?: string; input?: unknown; text?: string };
const toolUses = (content: Block[]): Block[] => content.filter((b) => b.type === "tool_use");

/** POST a JSON body to `p` with `headers`; the status and parsed body. */
async function post(p: string, body: unknown, headers: Record<string, string> = { "x-api-key": KEY }): Promise<{ status: number; body: Record<string, unknown> }> {
  const r = await fetch(`${server.baseUrl}${p}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
}

describe("Node SDK: a tool loop on the real model", () => {
  it("tool_choice any: a tool_use block with schema-valid input, stop_reason tool_use, usage; streamed = unary", async () => {
    const unary = await sdk.messages.create(forced);
    expect(unary).toMatchObject({ type: "message", role: "assistant", model: MODEL, stop_reason: "tool_use", stop_sequence: null });
    expect(unary.id).toMatch(/^msg_/);
    const calls = toolUses(unary.content as Block[]);
    expect(calls.length).toBeGreaterThan(0);
    expect(calls[0]!.name).toBe("get_weather");
    expect(calls[0]!.id).toMatch(/^toolu_/);
    expect(validWeather(calls[0]!.input), JSON.stringify(calls[0]!.input)).toBe(true);
    expect(unary.usage.input_tokens).toBeGreaterThan(0);
    expect(unary.usage.output_tokens).toBeGreaterThan(0);

    const stream = sdk.messages.stream(forced);
    const events: string[] = [];
    const partials = new Map<number, string>();
    for await (const ev of stream) {
      events.push(ev.type);
      if (ev.type === "content_block_delta" && ev.delta.type === "input_json_delta") partials.set(ev.index, (partials.get(ev.index) ?? "") + ev.delta.partial_json);
    }
    const final = await stream.finalMessage();
    expect(events[0]).toBe("message_start");
    expect(events.slice(-2)).toEqual(["message_delta", "message_stop"]);
    expect(events).toContain("content_block_start");
    expect(events).toContain("content_block_stop");
    // Each call's argument fragments concatenate to its unary input.
    expect([...partials.values()].map((j) => JSON.parse(j) as unknown)).toEqual(calls.map((c) => c.input));
    expect({ content: final.content.map((b) => (b.type === "tool_use" ? { ...b, id: "" } : b)), stop: final.stop_reason, usage: [final.usage.input_tokens, final.usage.output_tokens] }).toEqual({
      content: unary.content.map((b) => (b.type === "tool_use" ? { ...b, id: "" } : b)),
      stop: unary.stop_reason,
      usage: [unary.usage.input_tokens, unary.usage.output_tokens],
    });
  });

  it("the SDK's assistant content and a tool_result go back; the model answers (unary and streamed alike)", async () => {
    const first = await sdk.messages.create(forced);
    const calls = toolUses(first.content as Block[]);
    const loop: MessageParam[] = [
      ...ask,
      { role: "assistant", content: first.content },
      { role: "user", content: calls.map((c) => ({ type: "tool_result" as const, tool_use_id: c.id!, content: JSON.stringify({ temperature_c: 14, sky: "cloudy" }) })) },
    ];
    const req = greedy({ model: MODEL, max_tokens: 40, tools, messages: loop });
    const second = await sdk.messages.create(req);
    expect(["end_turn", "max_tokens", "tool_use"]).toContain(second.stop_reason);
    const text = second.content.filter((b) => b.type === "text").map((b) => (b as { text: string }).text).join("");
    expect(text.length > 0 || toolUses(second.content as Block[]).length > 0).toBe(true);
    const streamed = await sdk.messages.stream(req).finalMessage();
    expect(streamed.content.map((b) => (b.type === "tool_use" ? { ...b, id: "" } : b))).toEqual(second.content.map((b) => (b.type === "tool_use" ? { ...b, id: "" } : b)));
    expect(streamed.stop_reason).toBe(second.stop_reason);
  });

  it("a stop sequence ends the answer before it: stop_reason stop_sequence names it", async () => {
    const r = await sdk.messages.create(greedy({ model: MODEL, max_tokens: 30, stop_sequences: ["5"], messages: [{ role: "user" as const, content: "Count from 1 to 10, separated by spaces. Only the numbers." }] }));
    expect({ stop: r.stop_reason, seq: r.stop_sequence }).toEqual({ stop: "stop_sequence", seq: "5" });
    const text = (r.content[0] as { text: string }).text;
    expect(text).toContain("4");
    expect(text).not.toContain("5");
  });

  it("count_tokens equals the input_tokens of the same request", async () => {
    const { input_tokens } = await sdk.messages.countTokens({ model: MODEL, tools, tool_choice: { type: "any" }, messages: ask });
    const unary = await sdk.messages.create({ ...forced, max_tokens: 1 });
    expect(input_tokens).toBe(unary.usage.input_tokens);
    // Without the tools the prompt is shorter: the count is of this request's prompt.
    expect((await sdk.messages.countTokens({ model: MODEL, messages: ask })).input_tokens).toBeLessThan(input_tokens);
  });
});

describe("errors in Anthropic's envelope, authentication, prefixes", () => {
  it("bad input is a 400 invalid_request_error naming the field; the SDK raises BadRequestError", async () => {
    const r = await post("/v1/messages", { model: MODEL, max_tokens: 5, messages: ask, temprature: 0 });
    expect(r.status).toBe(400);
    expect(r.body).toEqual({ type: "error", error: { type: "invalid_request_error", message: expect.stringContaining("'temprature'") } });
    const missing = await post("/v1/messages", { model: MODEL, messages: ask });
    expect(missing.body).toEqual({ type: "error", error: { type: "invalid_request_error", message: "Missing required parameter: 'max_tokens'." } });
    await expect(sdk.messages.create({ ...{ model: MODEL, max_tokens: 5, messages: ask }, ...{ temperature: 3 } })).rejects.toBeInstanceOf(Anthropic.BadRequestError);
    const bad = await post("/v1/messages", "{not json", { "x-api-key": KEY });
    expect(bad.status).toBe(400);
    expect(bad.body.type).toBe("error");
  });

  it("an unknown model is a 404 not_found_error (NotFoundError in the SDK)", async () => {
    const r = await post("/v1/messages", { model: "no-such-model", max_tokens: 5, messages: ask });
    expect(r.status).toBe(404);
    expect(r.body).toMatchObject({ type: "error", error: { type: "not_found_error" } });
    await expect(sdk.messages.create({ model: "no-such-model", max_tokens: 5, messages: ask })).rejects.toBeInstanceOf(Anthropic.NotFoundError);
  });

  it("a wrong or missing key is a 401 authentication_error; x-api-key and Bearer both work, on every route", async () => {
    const wrong = new Anthropic({ baseURL: server.baseUrl, apiKey: "wrong", maxRetries: 0 });
    await expect(wrong.messages.create({ model: MODEL, max_tokens: 5, messages: ask })).rejects.toBeInstanceOf(Anthropic.AuthenticationError);
    const none = await post("/v1/messages", { model: MODEL, max_tokens: 5, messages: ask }, {});
    expect(none.status).toBe(401);
    expect(none.body).toMatchObject({ type: "error", error: { type: "authentication_error" } });
    const bearer = await post("/v1/messages/count_tokens", { model: MODEL, messages: ask }, { authorization: `Bearer ${KEY}` });
    expect(bearer.status).toBe(200);
    // The OpenAI routes take x-api-key too, and keep their own envelope.
    const models = await fetch(`${server.baseUrl}/v1/models`, { headers: { "x-api-key": KEY } });
    expect(models.status).toBe(200);
    const chatNoKey = await post("/v1/chat/completions", { model: MODEL, messages: ask }, {});
    expect(chatNoKey.body).toMatchObject({ error: { code: "invalid_api_key" } });
  });

  it.each(["/v3/messages", "/v3/v1/messages"])("%s serves the same API", async (p) => {
    const r = await post(p, { model: MODEL, max_tokens: 3, temperature: 0, messages: ask });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ type: "message", stop_reason: "max_tokens", usage: { output_tokens: 3 } });
  });
});

describe("a client that leaves mid-stream", () => {
  it("costs exactly one abort and leaves the server idle", async () => {
    const idle = (m: Map<string, number>): boolean => m.get("keel_requests_running") === 0 && m.get("keel_requests_waiting") === 0;
    const before = await waitForMetrics(server.baseUrl, idle);
    const ctl = new AbortController();
    const r = await fetch(`${server.baseUrl}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-api-key": KEY },
      body: JSON.stringify({ model: MODEL, max_tokens: 1500, temperature: 0, stream: true, messages: [{ role: "user", content: "Write a very long story about a lighthouse keeper." }] }),
      signal: ctl.signal,
    });
    expect(r.status).toBe(200);
    expect(r.headers.get("content-type")).toMatch(/^text\/event-stream/);
    // 1. Read until text is streaming, 2. leave.
    const reader = r.body!.getReader();
    let seen = "";
    while ((seen.match(/event: content_block_delta/g) ?? []).length < 3) {
      const { value, done } = await reader.read();
      if (done) break;
      seen += Buffer.from(value!).toString("utf8");
    }
    expect(seen.startsWith("event: message_start\n")).toBe(true);
    expect(seen).toContain("event: ping\n");
    ctl.abort();
    const after = await waitForMetrics(server.baseUrl, idle);
    const disconnects = (m: Map<string, number>): number => ["queued", "prefill", "decode"].reduce((a, p) => a + (m.get(`keel_client_disconnects_total{phase="${p}"}`) ?? 0), 0);
    expect(disconnects(after)).toBe(disconnects(before) + 1);
    expect(after.get('keel_requests_finished_total{finish_reason="abort"}')).toBe((before.get('keel_requests_finished_total{finish_reason="abort"}') ?? 0) + 1);
    expect((await metrics(server.baseUrl)).get("keel_requests_running")).toBe(0);
  });
});

describe("Python SDK (anthropic, pinned in test/e2e/python/requirements.txt)", () => {
  interface PyReport {
    sdk_version: string;
    first: { id: string; stop_reason: string; content: Block[]; usage: { input_tokens: number; output_tokens: number } };
    stream: { events: string[]; partials: string[]; stop_reason: string; content: Block[]; usage: { input_tokens: number; output_tokens: number } };
    second: { stop_reason: string; content: Block[] };
    second_stream: { stop_reason: string; content: Block[] };
    count: number;
    bad_request: { class: string; status: number; type: string; envelope: string };
    unknown_model: { class: string; status: number; type: string };
    wrong_key: { class: string; status: number; type: string };
  }
  let report: PyReport;

  beforeAll(async () => {
    const python = path.join(ROOT, ".venv-test", "bin", "python3");
    if (!fs.existsSync(python)) throw new Error(`${python} is missing: run \`node scripts/prepare.mjs\``);
    report = await new Promise<PyReport>((resolve, reject) => {
      const child = spawn(python, [path.join(ROOT, "test", "e2e", "python", "anthropic_check.py"), server.baseUrl, MODEL, KEY], { stdio: ["ignore", "pipe", "pipe"] });
      let stdout = "";
      let stderr = "";
      child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
      child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
      child.on("error", reject);
      child.on("exit", (code) => (code === 0 ? resolve(JSON.parse(stdout.trim().split("\n").at(-1)!) as PyReport) : reject(new Error(`anthropic_check.py failed (${code}):\n${stderr}\n${stdout}`))));
    });
  }, 600_000);

  it("runs the pinned SDK version", () => {
    const pin = /^anthropic==(\S+)$/m.exec(fs.readFileSync(path.join(ROOT, "test", "e2e", "python", "requirements.txt"), "utf8"))?.[1];
    expect(report.sdk_version).toBe(pin);
  });

  it("tool_use with schema-valid input; the streamed events and input_json fragments agree with the unary answer", () => {
    const calls = toolUses(report.first.content);
    expect(report.first.stop_reason).toBe("tool_use");
    expect(validWeather(calls[0]!.input)).toBe(true);
    expect(report.stream.events[0]).toBe("message_start");
    expect(report.stream.events.slice(-2)).toEqual(["message_delta", "message_stop"]);
    expect(report.stream.partials.length).toBeGreaterThan(0);
    const strip = (c: Block[]) => c.map((b) => (b.type === "tool_use" ? { ...b, id: "" } : b));
    expect({ content: strip(report.stream.content), stop: report.stream.stop_reason, usage: report.stream.usage }).toEqual({ content: strip(report.first.content), stop: "tool_use", usage: report.first.usage });
  });

  it("the tool result is answered, unary and streamed alike; count_tokens equals input_tokens", () => {
    expect(["end_turn", "max_tokens", "tool_use"]).toContain(report.second.stop_reason);
    expect(report.second.content.length).toBeGreaterThan(0);
    const strip = (c: Block[]) => c.map((b) => (b.type === "tool_use" ? { ...b, id: "" } : b));
    expect(strip(report.second_stream.content)).toEqual(strip(report.second.content));
    expect(report.count).toBe(report.first.usage.input_tokens);
  });

  it("errors: BadRequestError 400, NotFoundError 404, AuthenticationError 401, from Anthropic's envelope", () => {
    expect(report.bad_request).toEqual({ class: "BadRequestError", status: 400, type: "invalid_request_error", envelope: "error" });
    expect(report.unknown_model).toMatchObject({ class: "NotFoundError", status: 404, type: "not_found_error" });
    expect(report.wrong_key).toMatchObject({ class: "AuthenticationError", status: 401, type: "authentication_error" });
  });
});
