/**
 * The Responses API's agent fields on the tiny Qwen3-style model (`--tool_parser hermes3 --reasoning_parser qwen3`)
 * with the official OpenAI Node SDK: `reasoning.effort` is the template's thinking switch (the prompt is the chat
 * prompt of the same `enable_thinking`); a guided call comes out as only a `function_call` item, streamed through
 * the SDK's stream helper (which checks every event against its snapshot) with the same items as unary; the
 * response's own items and the call's output go back in. (Reasoning items from a model's `<think>` text: the random
 * weights never write one, so responses.test.ts runs such text through the real parsers and the session.)
 */
import { Ajv2020 } from "ajv/dist/2020.js";
import OpenAI from "openai";
import type { FunctionTool, ResponseInputItem, ResponseOutputItem } from "openai/resources/responses/responses";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startServer, type ServerHandle } from "../support/server.js";

const MODEL = "keel-tiny-qwen3";
let server: ServerHandle;
let sdk: OpenAI;

beforeAll(async () => {
  server = await startServer(["--model_path", MODEL, "--tool_parser", "hermes3", "--reasoning_parser", "qwen3", "--max_num_seqs", "2", "--max_num_batched_tokens", "64"]);
  sdk = new OpenAI({ baseURL: `${server.baseUrl}/v1`, apiKey: "keel-test", maxRetries: 0, timeout: 60_000 });
}, 120_000);
afterAll(async () => {
  await server?.stop();
});

const weather: FunctionTool = {
  type: "function",
  name: "get_weather",
  parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"], additionalProperties: false },
  strict: true,
};
const ajv = new Ajv2020({ strict: false });
/** What identifies an item apart from its random ids. */
const shape = (items: ResponseOutputItem[]) => items.map((o) => (o.type === "function_call" ? { type: o.type, name: o.name, arguments: o.arguments, status: o.status } : { type: o.type, status: "status" in o ? o.status : null }));

describe("Responses on a reasoning + tools server (tiny model)", () => {
  it("reasoning.effort is the thinking switch: 'none' renders the chat prompt of enable_thinking false, 'high' the thinking one", async () => {
    const chatTokens = async (enable: boolean) =>
      (await sdk.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 1, chat_template_kwargs: { enable_thinking: enable } } as never)).usage!.prompt_tokens;
    const responseTokens = async (effort: "none" | "high") => (await sdk.responses.create({ model: MODEL, input: "hi", max_output_tokens: 1, reasoning: { effort } })).usage!.input_tokens;
    const [off, on] = [await chatTokens(false), await chatTokens(true)];
    // The closed think block of 'off' is in the prompt: the two prompts differ.
    expect(off).toBeGreaterThan(on);
    expect(await responseTokens("none")).toBe(off);
    expect(await responseTokens("high")).toBe(on);
  });

  it.each([
    [{ text: { format: { type: "json_schema", name: "x", schema: { type: "object", properties: { a: { type: "strin" } } } } } }, "text.format.schema"],
    [{ tools: [{ type: "function", name: "f", parameters: { type: "object", properties: { a: { type: "strin" } } } }] }, "tools[0].parameters"],
    [{ tools: [weather], tool_choice: { type: "function", name: "g" } }, "tool_choice"],
    [{ input: [{ type: "function_call_output", output: "x" }] }, "input[0].call_id"],
    [{ temprature: 0 }, "temprature"],
  ])("%j → 400 naming %s in the Responses field names; the next request works", async (extra, param) => {
    const err = await sdk.responses.create({ model: MODEL, input: "hi", max_output_tokens: 1, ...extra } as never).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe(param);
    expect((err as Error).message).toContain(param);
    expect((await sdk.responses.create({ model: MODEL, input: "hi", max_output_tokens: 1 })).status).toBe("incomplete");
  });

  it("a required call: only the function_call item, streamed as unary; the items and the output go back and are answered", async () => {
    const params = { model: MODEL, input: "Weather in Paris?", tools: [weather], tool_choice: "required" as const, parallel_tool_calls: false, reasoning: { effort: "none" as const }, temperature: 0, max_output_tokens: 60 };
    const unary = await sdk.responses.create(params);
    expect(unary.status).toBe("completed");
    expect(unary.output.map((o) => o.type)).toEqual(["function_call"]);
    const call = unary.output[0]!;
    if (call.type !== "function_call") throw new Error("not a call");
    expect(ajv.compile(weather.parameters!)(JSON.parse(call.arguments))).toBe(true);
    const stream = sdk.responses.stream(params);
    const types: string[] = [];
    for await (const ev of stream) types.push(ev.type);
    expect(types.filter((t) => t !== "response.function_call_arguments.delta")).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(shape((await stream.finalResponse()).output)).toEqual(shape(unary.output));
    // The agent's next turn: the response's items as they came, then the call's output.
    const input: ResponseInputItem[] = [{ role: "user", content: "Weather in Paris?" }, ...(unary.output as ResponseInputItem[]), { type: "function_call_output", call_id: call.call_id, output: '{"temp_c": 21}' }];
    const next = await sdk.responses.create({ ...params, input, tool_choice: "none", max_output_tokens: 8 });
    expect(["completed", "incomplete"]).toContain(next.status);
    expect(next.output.map((o) => o.type)).toEqual(["message"]);
    // The call and its output are in the prompt: longer than the question alone under the same tool_choice.
    const alone = await sdk.responses.create({ ...params, tool_choice: "none", max_output_tokens: 1 });
    expect(next.usage!.input_tokens).toBeGreaterThan(alone.usage!.input_tokens + 10);
  });
});
