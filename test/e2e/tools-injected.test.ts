/**
 * Tools on a model whose chat template cannot show them (issue #20). SmolLM2-135M's template renders only role and
 * content: with the seed's tool flags (`--tool_parser qwen3coder --enable_tool_guided_generation true
 * --reasoning_parser qwen3`) the start log says the tools are injected, the prompt grows by the tool definitions, and
 * `tool_choice` required / a named function give parsed `tool_calls` (before: the guide forced a call the model had
 * never been shown, which rambled inside a parameter value until max_tokens and stayed in content). On the tiny
 * models, both engines: keel-tiny's ChatML template gets the tools injected, and a guided call on random weights
 * parses; keel-tiny-qwen3coder's template shows tools, so nothing is injected.
 */
import { Ajv2020 } from "ajv/dist/2020.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chat, type ChatResult } from "../support/chat-client.js";
import { realModelPath } from "../support/real-models.js";
import { ENGINES_UNDER_TEST, TINY_MODEL_FOR, startServer, type ServerHandle } from "../support/server.js";

const ajv = new Ajv2020({ strict: false });
const SEED_TOOL_FLAGS = ["--tool_parser", "qwen3coder", "--enable_tool_guided_generation", "true", "--reasoning_parser", "qwen3"];
const user = [{ role: "user", content: "What is the weather in Paris?" }];

type Call = { id: string; type: string; function: { name: string; arguments: string } };
type Choice = { finish_reason: string; message: { content: string | null; tool_calls?: Call[] } };

function choiceOf(r: ChatResult): Choice {
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return (r.body as { choices: Choice[] }).choices[0]!;
}

function promptTokens(r: ChatResult): number {
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return (r.body as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
}

/** The parsed log events named `event`. */
function events(logs: readonly string[], event: string): Record<string, unknown>[] {
  return logs.flatMap((l) => {
    try {
      const j = JSON.parse(l) as Record<string, unknown>;
      return j.event === event ? [j] : [];
    } catch {
      return [];
    }
  });
}

/** Every call names a declared tool and its arguments validate against that tool's schema. */
function expectValidCalls(c: Choice, tools: readonly { function: { name: string; parameters: object } }[]): Call[] {
  const calls = c.message.tool_calls ?? [];
  expect(calls.length, JSON.stringify(c)).toBeGreaterThan(0);
  for (const call of calls) {
    const tool = tools.find((t) => t.function.name === call.function.name);
    expect(tool, call.function.name).toBeDefined();
    const validate = ajv.compile(tool!.function.parameters);
    expect(validate(JSON.parse(call.function.arguments)), `${call.function.arguments} ${ajv.errorsText(validate.errors)}`).toBe(true);
  }
  // Nothing of the call left in content.
  expect(c.message.content ?? "").not.toMatch(/<tool_call>|<function=|<parameter=/);
  return calls;
}

describe("real model: SmolLM2-135M (template without tools) with the seed's tool flags", () => {
  let server: ServerHandle;
  const MODEL = "smollm2";
  const weather = { type: "function", function: { name: "get_weather", description: "Get the current weather for a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } };

  beforeAll(async () => {
    server = await startServer(["--model_path", realModelPath("smollm2-135m-instruct"), "--model_name", MODEL, ...SEED_TOOL_FLAGS, "--max_num_seqs", "2", "--max_model_len", "2048"]);
  }, 180_000);
  afterAll(async () => {
    await server?.stop();
  });

  it("says once at start that the tools are injected, in which format", () => {
    expect(events(server.logs, "tools_injected")).toEqual([expect.objectContaining({ model: MODEL, toolParser: "qwen3coder", support: { tools: false, toolCalls: false, systemRole: true } })]);
    expect(events(server.logs, "tools_in_template")).toEqual([]);
  });

  it("the tool reaches the prompt: more prompt tokens with the tool than without (before: the same 37)", async () => {
    const without = await chat(server.baseUrl, { model: MODEL, messages: user, max_tokens: 1, temperature: 0 });
    const withTool = await chat(server.baseUrl, { model: MODEL, messages: user, tools: [weather], tool_choice: "auto", max_tokens: 1, temperature: 0 });
    expect(promptTokens(withTool)).toBeGreaterThan(promptTokens(without) + 50);
  });

  it.each([
    ["required", "required"],
    ["a named function", { type: "function", function: { name: "get_weather" } }],
  ] as const)("tool_choice %s: one parsed get_weather call, finish_reason tool_calls; the stream carries the same call", async (_label, toolChoice) => {
    const body = { model: MODEL, messages: user, tools: [weather], tool_choice: toolChoice, max_tokens: 200, temperature: 0 };
    const c = choiceOf(await chat(server.baseUrl, body));
    expect(c.finish_reason).toBe("tool_calls");
    const calls = expectValidCalls(c, [weather]);
    expect(calls.map((x) => x.function.name)).toEqual(["get_weather"]);
    const stream = await chat(server.baseUrl, { ...body, stream: true });
    expect(stream.finishReason).toBe("tool_calls");
    const streamed = stream.events.flatMap((e) => ((e.choices as { delta?: { tool_calls?: { function?: { name?: string } }[] } }[])[0]?.delta?.tool_calls ?? []).flatMap((t) => (t.function?.name ? [t.function.name] : [])));
    expect(streamed).toEqual(["get_weather"]);
  });

  it("a tool loop: the call and its result go back in (rendered as text the template keeps) and the model answers", async () => {
    const history = [
      ...user,
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
      { role: "tool", tool_call_id: "call_1", content: "Sunny, 21 degrees Celsius" },
    ];
    const r = await chat(server.baseUrl, { model: MODEL, messages: history, tools: [weather], max_tokens: 30, temperature: 0 });
    const c = choiceOf(r);
    expect(["stop", "length", "tool_calls"]).toContain(c.finish_reason);
    // The call and the result are in the prompt: dropping them shortens it by at least their text.
    const short = await chat(server.baseUrl, { model: MODEL, messages: user, tools: [weather], max_tokens: 1, temperature: 0 });
    expect(promptTokens(r)).toBeGreaterThan(promptTokens(short) + 15);
  });
});

describe.each(ENGINES_UNDER_TEST)("tiny models on %s", (engine) => {
  let plain: ServerHandle;
  let coder: ServerHandle;
  let mismatched: ServerHandle;
  // Bounded values: a random-weight model inside an unbounded string would write until max_tokens.
  const order = {
    type: "function",
    function: {
      name: "place_order",
      description: "Order a drink",
      parameters: { type: "object", properties: { item: { type: "string", enum: ["tea", "coffee"] }, qty: { type: "integer", minimum: 1, maximum: 9 } }, required: ["item", "qty"], additionalProperties: false },
    },
  };

  beforeAll(async () => {
    [plain, coder, mismatched] = await Promise.all([
      startServer(["--tool_parser", "qwen3coder", "--enable_tool_guided_generation", "true", "--max_num_seqs", "2", "--max_num_batched_tokens", "64"], {}, { engine }),
      startServer(["--model_path", "keel-tiny-qwen3coder", "--tool_parser", "qwen3coder", "--max_num_seqs", "2", "--max_num_batched_tokens", "64"], {}, { engine }),
      startServer(["--model_path", "keel-tiny-qwen3coder", "--tool_parser", "hermes3", "--max_num_seqs", "1", "--max_num_batched_tokens", "64"], {}, { engine }),
    ]);
  }, 240_000);
  afterAll(async () => {
    await Promise.all([plain?.stop(), coder?.stop(), mismatched?.stop()]);
  });

  it("a --tool_parser other than the format the template teaches is warned about at start; the matching one is not", () => {
    expect(events(mismatched.logs, "tool_parser_mismatch")).toEqual([expect.objectContaining({ toolParser: "hermes3", templateFormat: "qwen3coder" })]);
    expect(events(coder.logs, "tool_parser_mismatch")).toEqual([]);
    expect(events(plain.logs, "tool_parser_mismatch")).toEqual([]);
  });

  it("the ChatML template of the tiny model cannot show tools: injected, logged once", () => {
    expect(events(plain.logs, "tools_injected")).toEqual([expect.objectContaining({ toolParser: "qwen3coder" })]);
  });

  it("keel-tiny-qwen3coder's template shows tools: not injected, and the log says so", () => {
    expect(events(coder.logs, "tools_injected")).toEqual([]);
    expect(events(coder.logs, "tools_in_template")).toEqual([expect.objectContaining({ toolParser: "qwen3coder" })]);
  });

  it.each([1, 2, 3])("injected, tool_choice required on random weights (seed %i): exactly one schema-valid call", async (seed) => {
    const model = TINY_MODEL_FOR[engine];
    const c = choiceOf(await chat(plain.baseUrl, { model, messages: user, tools: [order], tool_choice: "required", max_tokens: 200, temperature: 1, seed }));
    expect(c.finish_reason).toBe("tool_calls");
    // One call per turn where the tools are injected, though parallel_tool_calls defaults to true.
    expect(expectValidCalls(c, [order])).toHaveLength(1);
  });
});
