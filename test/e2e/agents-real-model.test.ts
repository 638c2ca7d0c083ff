/**
 * Tools on a real model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, hermes `<tool_call>` template), driven with the
 * official OpenAI Node SDK as an agent would. Asserts what must hold whatever the model writes: under `required`, a
 * named function and guided `auto`, a call to a declared tool whose arguments validate against its schema; stream
 * deltas concatenate to the unary answer (with --deterministic true, so two runs compute the same logits); the
 * SDK's own assistant message and a tool result go back in and are answered. Few and short: ~25 tok/s here.
 */
import { Ajv2020 } from "ajv/dist/2020.js";
import OpenAI from "openai";
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { realModelPath } from "../support/real-models.js";
import { startServer, type ServerHandle } from "../support/server.js";

let server: ServerHandle;
let sdk: OpenAI;
const MODEL = "qwen-coder";

beforeAll(async () => {
  const file = realModelPath("qwen2.5-coder-0.5b-instruct");
  server = await startServer(["--model_path", file, "--model_name", MODEL, "--tool_parser", "auto", "--enable_tool_guided_generation", "true", "--deterministic", "true", "--max_num_seqs", "2", "--max_model_len", "2048"]);
  sdk = new OpenAI({ baseURL: `${server.baseUrl}/v1`, apiKey: "keel-test", maxRetries: 0, timeout: 120_000 });
}, 180_000);
afterAll(async () => {
  await server?.stop();
});

const tools: ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather for a city",
      parameters: { type: "object", properties: { city: { type: "string", description: "City name" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["city"], additionalProperties: false },
    },
  },
  {
    type: "function",
    function: {
      name: "convert_currency",
      description: "Convert an amount between currencies",
      parameters: { type: "object", properties: { amount: { type: "number" }, from: { type: "string" }, to: { type: "string" } }, required: ["amount", "from", "to"], additionalProperties: false },
    },
  },
];
const ajv = new Ajv2020({ strict: false });

function expectValidCall(call: { type: string; function: { name: string; arguments: string } } | undefined): void {
  expect(call).toBeDefined();
  const tool = tools.find((t) => t.type === "function" && t.function.name === call!.function.name);
  expect(tool, call!.function.name).toBeDefined();
  const validate = ajv.compile(tool!.type === "function" ? tool!.function.parameters! : {});
  expect(validate(JSON.parse(call!.function.arguments)), `${call!.function.arguments} ${ajv.errorsText(validate.errors)}`).toBe(true);
}

const ask = (content: string): ChatCompletionMessageParam[] => [{ role: "user", content }];

describe("real model: tool calls (hermes3 from the template)", () => {
  it("--tool_parser auto picked hermes3 from the model's template", () => {
    const line = server.logs.find((l) => l.includes('"tool_parser_resolved"'));
    expect(JSON.parse(line!).toolParser).toBe("hermes3");
  });

  it.each([
    ["required", "required" as const],
    ["guided auto", "auto" as const],
  ])("%s: a call to a declared tool with schema-valid arguments; finish_reason tool_calls", async (_name, choice) => {
    const r = await sdk.chat.completions.create({ model: MODEL, messages: ask("What is the weather in Paris right now?"), tools, tool_choice: choice, temperature: 0, max_tokens: 80 });
    const c = r.choices[0]!;
    expect(c.finish_reason, JSON.stringify(c.message)).toBe("tool_calls");
    expectValidCall(c.message.tool_calls?.[0] as never);
  });

  it("a named function: exactly that tool, schema-valid; the stream's deltas concatenate to the unary answer", async () => {
    const req = {
      model: MODEL,
      messages: ask("I have 20 euros. How many dollars is that?"),
      tools,
      tool_choice: { type: "function" as const, function: { name: "convert_currency" } },
      parallel_tool_calls: false,
      temperature: 0,
      max_tokens: 80,
    };
    const unary = await sdk.chat.completions.create(req);
    const call = unary.choices[0]!.message.tool_calls?.[0] as { type: string; function: { name: string; arguments: string } } | undefined;
    expectValidCall(call);
    expect(call!.function.name).toBe("convert_currency");
    const stream = await sdk.chat.completions.create({ ...req, stream: true });
    let name = "";
    let args = "";
    let finish: string | null = null;
    for await (const chunk of stream) {
      const ch = chunk.choices[0];
      for (const t of ch?.delta.tool_calls ?? []) {
        name += t.function?.name ?? "";
        args += t.function?.arguments ?? "";
      }
      if (ch?.finish_reason) finish = ch.finish_reason;
    }
    expect({ name, args, finish }).toEqual({ name: call!.function.name, args: call!.function.arguments, finish: unary.choices[0]!.finish_reason });
  });

  it("an agent loop with the SDK: the call, the tool's result, then an answer", async () => {
    const messages = ask("What is the weather in Berlin?");
    const first = await sdk.chat.completions.create({ model: MODEL, messages, tools, tool_choice: "required", temperature: 0, max_tokens: 80 });
    const assistant = first.choices[0]!.message;
    expectValidCall(assistant.tool_calls?.[0] as never);
    // The SDK's own message object goes back as it came (content null, tool_calls with ids).
    messages.push(assistant as ChatCompletionMessageParam);
    for (const call of assistant.tool_calls!) messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature_c: 14, sky: "cloudy" }) });
    const second = await sdk.chat.completions.create({ model: MODEL, messages, tools, temperature: 0, max_tokens: 60 });
    const answer = second.choices[0]!;
    expect(["stop", "length", "tool_calls"]).toContain(answer.finish_reason);
    // The model answered the user (content) or asked for another call; either is a well-formed turn.
    expect((answer.message.content ?? "").length > 0 || (answer.message.tool_calls?.length ?? 0) > 0).toBe(true);
    // Two real-model turns: ~10 s on an idle 2-core machine, past the default 60 s when the cores are shared.
  }, 180_000);
});
