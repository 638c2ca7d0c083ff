/**
 * The Responses API on a real model (Qwen2.5-Coder-0.5B-Instruct, `--tool_parser hermes3`, the README's agent
 * setup) with the official OpenAI Node SDK, as an agent drives it: a function call (only the `function_call` item, no
 * empty message before it), its output given back with the response's own items, then an answer; the same call
 * streamed (the SDK's stream helper checks every event against its snapshot; argument deltas add up to `.done`; the
 * streamed items equal the unary ones under --deterministic true); `text.format` json_schema output that parses and
 * matches the schema. The same loop with the official Python SDK (test/e2e/python/sdk_responses_agent.py, run from
 * `.venv-test`; the script observes, this file asserts). Few and short: ~25 tok/s here.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { Ajv2020 } from "ajv/dist/2020.js";
import OpenAI from "openai";
import type { FunctionTool, ResponseInputItem, ResponseOutputItem, ResponseStreamEvent } from "openai/resources/responses/responses";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { realModelPath } from "../support/real-models.js";
import { ROOT, startServer, type ServerHandle } from "../support/server.js";

let server: ServerHandle;
let sdk: OpenAI;
const MODEL = "qwen-coder";

beforeAll(async () => {
  const file = realModelPath("qwen2.5-coder-0.5b-instruct");
  server = await startServer(["--model_path", file, "--model_name", MODEL, "--tool_parser", "hermes3", "--enable_tool_guided_generation", "true", "--deterministic", "true", "--max_num_seqs", "2", "--max_model_len", "2048"]);
  sdk = new OpenAI({ baseURL: `${server.baseUrl}/v1`, apiKey: "keel-test", maxRetries: 0, timeout: 300_000 });
}, 180_000);
afterAll(async () => {
  await server?.stop();
});

const weather: FunctionTool = {
  type: "function",
  name: "get_weather",
  description: "Get the current weather for a city",
  parameters: { type: "object", properties: { city: { type: "string", description: "City name" } }, required: ["city"], additionalProperties: false },
  strict: true,
};
const ajv = new Ajv2020({ strict: false });
const ask = "What is the weather in Paris right now?";
/** Per-test limit of the tests that generate: the 2 shared cores run other suites too (one request took 120 s under load). */
const SLOW = 480_000;

/** The function_call items of an output; every other item must be a message with real text. */
function callsOf(output: ResponseOutputItem[]) {
  for (const o of output) {
    if (o.type === "function_call") continue;
    expect(o.type).toBe("message");
    const text = o.type === "message" ? o.content.map((c) => (c.type === "output_text" ? c.text : "")).join("") : "";
    expect(text.trim(), "a message item next to a call carries text").not.toBe("");
  }
  return output.flatMap((o) => (o.type === "function_call" ? [o] : []));
}

/** The question with the tool, unary: asked once, shared by the loop and the stream comparison (each costs ~1 min here). */
const callParams = { model: MODEL, input: ask, tools: [weather], temperature: 0, max_output_tokens: 80 };
let firstCall: Promise<OpenAI.Responses.Response> | null = null;
const unaryCall = () => (firstCall ??= sdk.responses.create(callParams));

describe("real model: Responses function calls (hermes3)", () => {
  it("unary loop: a function_call item with schema-valid arguments; the items go back with its output; then an answer", async () => {
    const first = await unaryCall();
    expect(first.status).toBe("completed");
    // OpenAI's shape: only the call when the model wrote no text (no empty message item before it).
    expect(first.output.map((o) => o.type)).toEqual(["function_call"]);
    const [call] = callsOf(first.output);
    expect(call).toMatchObject({ type: "function_call", name: "get_weather", status: "completed" });
    expect(call!.id).toMatch(/^fc_/);
    expect(call!.call_id).toMatch(/^call_/);
    expect(ajv.compile(weather.parameters!)(JSON.parse(call!.arguments))).toBe(true);
    // The agent gives the response's own items back, then the result.
    const input: ResponseInputItem[] = [{ role: "user", content: ask }, ...(first.output as ResponseInputItem[]), { type: "function_call_output", call_id: call!.call_id, output: JSON.stringify({ temp_c: 18, sky: "clear" }) }];
    const second = await sdk.responses.create({ model: MODEL, input, tools: [weather], tool_choice: "none", temperature: 0, max_output_tokens: 40 });
    expect(["completed", "incomplete"]).toContain(second.status);
    expect(second.output.map((o) => o.type)).toEqual(["message"]);
    expect(second.output_text.trim()).not.toBe("");
    // The call and its result are in the prompt of the answer: longer than the question alone under the same choice.
    const alone = await sdk.responses.create({ model: MODEL, input: ask, tools: [weather], tool_choice: "none", max_output_tokens: 1 });
    expect(second.usage!.input_tokens).toBeGreaterThan(alone.usage!.input_tokens + 10);
  }, SLOW);

  it("streamed: item added with empty arguments, argument deltas adding up to .done, item done; the same items as unary", async () => {
    const unary = await unaryCall();
    const stream = sdk.responses.stream(callParams);
    const events: ResponseStreamEvent[] = [];
    for await (const ev of stream) events.push(ev);
    // The SDK's helper rebuilt the response from the events (it throws on an event for an item it does not have).
    const final = await stream.finalResponse();
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const types = events.map((e) => e.type).filter((t) => t !== "response.function_call_arguments.delta");
    expect(types).toEqual(["response.created", "response.in_progress", "response.output_item.added", "response.function_call_arguments.done", "response.output_item.done", "response.completed"]);
    const added = events.find((e) => e.type === "response.output_item.added")!;
    expect(added.type === "response.output_item.added" && added.item).toMatchObject({ type: "function_call", name: "get_weather", arguments: "" });
    const deltas = events.flatMap((e) => (e.type === "response.function_call_arguments.delta" ? [e.delta] : []));
    expect(deltas.length).toBeGreaterThan(0);
    const done = events.find((e) => e.type === "response.function_call_arguments.done")!;
    expect(done.type === "response.function_call_arguments.done" && [done.name, done.arguments]).toEqual(["get_weather", deltas.join("")]);
    const strip = (items: ResponseOutputItem[]) => items.map((o) => (o.type === "function_call" ? { name: o.name, arguments: o.arguments, status: o.status } : o.type));
    expect(strip(final.output)).toEqual(strip(unary.output));
    const completed = events.at(-1)!;
    expect(completed.type === "response.completed" && strip(completed.response.output)).toEqual(strip(unary.output));
  }, SLOW);

  it("text.format json_schema: the output text parses and matches the schema, unary and streamed", async () => {
    const schema = { type: "object", properties: { city: { type: "string" }, population: { type: "integer" } }, required: ["city", "population"], additionalProperties: false };
    const params = { model: MODEL, input: "Give the city and population of the largest city in France as JSON.", text: { format: { type: "json_schema" as const, name: "city", schema, strict: true } }, temperature: 0, max_output_tokens: 60 };
    const unary = await sdk.responses.create(params);
    expect(unary.status).toBe("completed");
    expect(unary.text?.format).toMatchObject({ type: "json_schema", name: "city" });
    expect(ajv.compile(schema)(JSON.parse(unary.output_text))).toBe(true);
    const stream = sdk.responses.stream(params);
    for await (const _ of stream) void _;
    expect((await stream.finalResponse()).output_text).toBe(unary.output_text);
  }, SLOW);

  it("refusals name the field: an unknown field, a chat field, reasoning without --reasoning_parser", async () => {
    for (const [extra, param] of [[{ temprature: 0 }, "temprature"], [{ max_tokens: 5 }, "max_tokens"], [{ reasoning: { effort: "low" } }, "reasoning.effort"]] as const) {
      const err = await sdk.responses.create({ model: MODEL, input: "x", ...extra } as never).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe(param);
    }
  });
});

/** An output item as the Python script reports it. */
type PyItem = { type: string; status?: string; name?: string; arguments?: string; call_id?: string; id?: string; text?: string };
interface PyReport {
  first: { status: string; output: PyItem[]; input_tokens: number };
  second: { status: string; output: PyItem[]; output_text: string; input_tokens: number; alone_input_tokens: number };
  stream: { types: string[]; sequence_numbers: number[]; argument_deltas: string[]; arguments_done: string[]; output: PyItem[] };
}

/** Run the Python agent script against the server; its last stdout line is the JSON report. */
function runPython(): Promise<PyReport> {
  const python = path.join(ROOT, ".venv-test", "bin", "python3");
  if (!fs.existsSync(python)) throw new Error(`${python} is missing: run \`node scripts/prepare.mjs\``);
  return new Promise((resolve, reject) => {
    const child = spawn(python, [path.join(ROOT, "test", "e2e", "python", "sdk_responses_agent.py"), server.baseUrl, MODEL], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, PYTHONUNBUFFERED: "1" } });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    child.on("error", reject);
    child.on("exit", (code, signal) => {
      if (code !== 0) return reject(new Error(`sdk_responses_agent.py failed (${code ?? signal}):\n${stderr}\n${stdout}`));
      try {
        resolve(JSON.parse(stdout.trim().split("\n").at(-1) ?? "") as PyReport);
      } catch (err) {
        reject(new Error(`sdk_responses_agent.py printed no JSON report (${(err as Error).message}):\n${stdout}\n${stderr}`));
      }
    });
  });
}

describe("real model: the same loop with the OpenAI Python SDK", () => {
  it("call (only the function_call item) → output items given back as the SDK returned them + function_call_output → answer; the stream helper rebuilds the same call", async () => {
    const r = await runPython();
    expect(r.first.status).toBe("completed");
    expect(r.first.output.map((o) => o.type)).toEqual(["function_call"]);
    const call = r.first.output[0]!;
    expect(call).toMatchObject({ name: "get_weather", status: "completed" });
    expect(call.call_id).toMatch(/^call_/);
    expect(ajv.compile(weather.parameters!)(JSON.parse(call.arguments!))).toBe(true);
    expect(["completed", "incomplete"]).toContain(r.second.status);
    expect(r.second.output.map((o) => o.type)).toEqual(["message"]);
    expect(r.second.output_text.trim()).not.toBe("");
    expect(r.second.input_tokens).toBeGreaterThan(r.second.alone_input_tokens + 10);
    expect(r.stream.sequence_numbers).toEqual(r.stream.types.map((_, i) => i));
    expect(r.stream.types.filter((t) => t !== "response.function_call_arguments.delta")).toEqual(["response.created", "response.in_progress", "response.output_item.added", "response.function_call_arguments.done", "response.output_item.done", "response.completed"]);
    expect(r.stream.argument_deltas.join("")).toBe(r.stream.arguments_done[0]);
    expect(r.stream.output.map((o) => [o.type, o.name, o.arguments])).toEqual([["function_call", call.name, call.arguments]]);
  }, 480_000);
});
