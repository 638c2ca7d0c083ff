/**
 * Tools, reasoning and structured output through the real server and the tiny random-weight models (issue #9):
 * bad agent input is a 400 before the engine and a valid request right after works (recipe M2); a server without
 * --tool_parser refuses tools instead of ignoring them; `--tool_parser auto` resolves from the template; tool-call
 * turns round-trip through the template; streamed deltas concatenate to the unary answer of the same seed.
 */
import { Ajv2020 } from "ajv/dist/2020.js";
import OpenAI from "openai";
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chat } from "../support/chat-client.js";
import { ENGINES_UNDER_TEST, TINY_MODEL_FOR, startServer, type ServerHandle } from "../support/server.js";

const AGENT_FLAGS = ["--model_path", "keel-tiny-qwen3", "--tool_parser", "auto", "--reasoning_parser", "qwen3", "--max_num_seqs", "4", "--max_num_batched_tokens", "64"];
const CODER_FLAGS = ["--model_path", "keel-tiny-qwen3coder", "--tool_parser", "qwen3coder", "--enable_tool_guided_generation", "true", "--max_num_seqs", "4", "--max_num_batched_tokens", "64"];
const PLAIN_FLAGS = ["--max_num_seqs", "2", "--max_num_batched_tokens", "64"];

let agent: ServerHandle;
let coder: ServerHandle;
let plain: ServerHandle;

beforeAll(async () => {
  [agent, coder, plain] = await Promise.all([startServer(AGENT_FLAGS), startServer(CODER_FLAGS), startServer(PLAIN_FLAGS)]);
}, 120_000);
afterAll(async () => {
  await Promise.all([agent?.stop(), coder?.stop(), plain?.stop()]);
});

const ajv = new Ajv2020({ strict: false });

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer", minimum: 1, maximum: 7 } }, required: ["city"] },
  },
};
const user = [{ role: "user", content: "Weather in Paris?" }];
const fn = (parameters: unknown, name = "lookup") => ({ type: "function", function: { name, parameters } });

type ErrorBody = { error: { code: string; param: string | null; message: string } };

/** Stream and unary of the same request: content, reasoning and tool calls (arguments joined per index). */
function collect(events: Record<string, unknown>[]) {
  let content = "";
  let reasoning = "";
  const calls = new Map<number, { id: string; name: string; arguments: string }>();
  for (const ev of events) {
    const choice = (ev.choices as { delta?: Record<string, unknown> }[] | undefined)?.[0];
    const d = choice?.delta;
    if (!d) continue;
    if (typeof d.content === "string") content += d.content;
    if (typeof d.reasoning_content === "string") reasoning += d.reasoning_content;
    for (const t of (d.tool_calls as { index: number; id?: string; function: { name?: string; arguments?: string } }[] | undefined) ?? []) {
      const c = calls.get(t.index) ?? { id: "", name: "", arguments: "" };
      if (t.id) c.id = t.id;
      if (t.function.name) c.name = t.function.name;
      c.arguments += t.function.arguments ?? "";
      calls.set(t.index, c);
    }
  }
  return { content, reasoning, calls: [...calls.values()] };
}

describe("agent requests: bad input before the engine (recipe M2), then a valid request", () => {
  it.each([
    [{ tools: [{ type: "function", function: { name: "f", parameters: "object" } }] }, "tools[0].function.parameters"],
    [{ tools: [weather], tool_choice: { type: "function", function: { name: "missing" } } }, "tool_choice"],
    [{ tools: [weather, weather] }, "tools[1].function.name"],
    [{ tools: [{ type: "retrieval" }] }, "tools[0].type"],
    [{ functions: [{ name: "f" }] }, "functions"],
    [{ messages: [...user, { role: "assistant", content: null, tool_calls: [{ id: "c", function: {} }] }] }, "messages[1].tool_calls[0].function.name"],
    [{ messages: [...user, { role: "tool", content: "x" }] }, "messages[1].tool_call_id"],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: "{}" } } }, "response_format.json_schema.schema"],
    // Schemas the grammar converter refuses: checked for every request with tools, guided or not.
    [{ tools: [fn({ type: "object", properties: { a: { type: "strin" } } })] }, "tools[0].function.parameters"],
    [{ tools: [weather, fn({ enum: [] })] }, "tools[1].function.parameters"],
    [{ tools: [fn({ $defs: { a: { $ref: "#/$defs/a" } }, $ref: "#/$defs/a" })] }, "tools[0].function.parameters"],
    [{ tools: [fn({ type: "object", properties: { code: { type: "string", pattern: "([a-z]" } } })] }, "tools[0].function.parameters"],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { $ref: "#" } } } }, "response_format.json_schema.schema"],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "(?<=a)b" } } } }, "response_format.json_schema.schema"],
  ])("%j → 400 on %s, and the server answers the next request", async (extra, param) => {
    const bad = await chat(agent.baseUrl, { model: "keel-tiny-qwen3", messages: user, max_tokens: 4, ...extra });
    expect(bad.status).toBe(400);
    expect((bad.body as ErrorBody).error.param).toBe(param);
    const ok = await chat(agent.baseUrl, { model: "keel-tiny-qwen3", messages: user, tools: [weather], max_tokens: 4 });
    expect(ok.status).toBe(200);
  });
});

describe("server agent flags", () => {
  it("--tool_parser auto resolves from the model's template (hermes tool calls in keel-tiny-qwen3)", () => {
    const line = agent.logs.find((l) => l.includes('"tool_parser_resolved"'));
    expect(line).toBeDefined();
    expect(JSON.parse(line!).toolParser).toBe("hermes3");
  });

  it("--tool_parser auto on a model whose template shows no tool format says so at start, and refuses tools", async () => {
    const none = await startServer(["--tool_parser", "auto", "--max_num_seqs", "1", "--max_num_batched_tokens", "64"]);
    try {
      const refused = await chat(none.baseUrl, { model: "keel-tiny", messages: user, tools: [weather], max_tokens: 2 });
      expect(refused.status).toBe(400);
      expect((refused.body as ErrorBody).error.message).toContain("--tool_parser auto");
    } finally {
      await none.stop(); // every log line the process wrote has been read once it stopped
    }
    const line = none.logs.find((l) => l.includes('"tool_parser_unresolved"'));
    expect(line, none.logs.slice(-5).join("\n")).toBeDefined();
    expect(JSON.parse(line!).level).toBe(40);
  });

  it("a server without --tool_parser refuses tools (not ignored), but tool_choice none renders no tools and is served", async () => {
    const refused = await chat(plain.baseUrl, { model: "keel-tiny", messages: user, tools: [weather], max_tokens: 4 });
    expect(refused.status).toBe(400);
    expect((refused.body as ErrorBody).error).toMatchObject({ code: "unsupported_field", param: "tools" });
    expect((refused.body as ErrorBody).error.message).toContain("--tool_parser");
    const none = await chat(plain.baseUrl, { model: "keel-tiny", messages: user, tools: [weather], tool_choice: "none", max_tokens: 2, temperature: 0 });
    const without = await chat(plain.baseUrl, { model: "keel-tiny", messages: user, max_tokens: 2, temperature: 0 });
    expect([none.status, without.status]).toEqual([200, 200]);
    const promptTokens = (r: typeof none) => (r.body as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
    expect(promptTokens(none)).toBe(promptTokens(without));
  });

  it("tools are rendered into the prompt (the prompt grows with each declaration)", async () => {
    const time = { type: "function", function: { name: "get_time", description: "Current time", parameters: { type: "object", properties: {} } } };
    const usage = async (extra: Record<string, unknown>) => {
      const r = await chat(agent.baseUrl, { model: "keel-tiny-qwen3", messages: user, max_tokens: 1, temperature: 0, ...extra });
      expect(r.status).toBe(200);
      return (r.body as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
    };
    const none = await usage({});
    const one = await usage({ tools: [weather] });
    const both = await usage({ tools: [weather, time] });
    expect(one).toBeGreaterThan(none);
    expect(both).toBeGreaterThan(one);
  });
});

describe("tool-call turns and streaming agreement", () => {
  const turn = {
    model: "keel-tiny-qwen3",
    tools: [weather],
    messages: [
      ...user,
      { role: "assistant", content: null, reasoning_content: "I should call the tool.", tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
      { role: "tool", tool_call_id: "call_1", content: '{"temp_c": 21}' },
    ],
    max_tokens: 24,
    temperature: 0.9,
    seed: 7,
    chat_template_kwargs: { enable_thinking: true },
  };

  it("a conversation with tool calls and a tool result is accepted, and stream deltas concatenate to the unary answer", async () => {
    const unary = await chat(agent.baseUrl, turn);
    const stream = await chat(agent.baseUrl, { ...turn, stream: true });
    expect([unary.status, stream.status]).toEqual([200, 200]);
    const choice = (unary.body as { choices: { message: { content: string | null; reasoning_content?: string; tool_calls?: { id: string; function: { name: string; arguments: string } }[] }; finish_reason: string }[] }).choices[0]!;
    const s = collect(stream.events);
    expect(s.content).toBe(choice.message.content ?? "");
    expect(s.reasoning).toBe(choice.message.reasoning_content ?? "");
    expect(s.calls.map((c) => ({ name: c.name, arguments: c.arguments }))).toEqual((choice.message.tool_calls ?? []).map((c) => ({ name: c.function.name, arguments: c.function.arguments })));
    expect(stream.finishReason).toBe(choice.finish_reason);
  });
});

type Message = { content: string | null; reasoning_content?: string; tool_calls?: { id: string; type: string; function: { name: string; arguments: string } }[] };
const firstChoice = (r: { body: unknown }) => (r.body as { choices: { message: Message; finish_reason: string }[] }).choices[0]!;

/** Every call names a declared tool and its arguments validate against that tool's schema. */
type Tool = { type: string; function: { name: string; parameters: object } };
function expectValidCalls(message: Message, tools: Tool[]): void {
  expect(message.tool_calls?.length ?? 0, JSON.stringify(message)).toBeGreaterThan(0);
  for (const call of message.tool_calls!) {
    const tool = tools.find((t) => t.function.name === call.function.name);
    expect(tool, `call to ${call.function.name}`).toBeDefined();
    expect(call.type).toBe("function");
    expect(call.id).toMatch(/^call_/);
    const validate = ajv.compile(tool!.function.parameters);
    const args: unknown = JSON.parse(call.function.arguments);
    expect(validate(args), `${call.function.arguments}: ${ajv.errorsText(validate.errors)}`).toBe(true);
  }
}

/**
 * The guided and agent cases run on both engines (issue #19): the llama.cpp engine with the servers above, the
 * OpenVINO engine (guides as XGrammar structural tags, src/engine-openvino/guides.py) with the same flags.
 */
describe.each(ENGINES_UNDER_TEST)("on the %s engine", (engine) => {
  let ov: { agent: ServerHandle; coder: ServerHandle; plain: ServerHandle } | null = null;
  const servers = () => (engine === "llama.cpp" ? { agent, coder, plain } : ov!);
  beforeAll(async () => {
    if (engine !== "openvino") return;
    const [a, c, p] = await Promise.all([
      startServer(AGENT_FLAGS, {}, { engine }),
      startServer(CODER_FLAGS, {}, { engine }),
      startServer(PLAIN_FLAGS, {}, { engine }),
    ]);
    ov = { agent: a, coder: c, plain: p };
  }, 240_000);
  afterAll(async () => {
    if (ov) await Promise.all([ov.agent.stop(), ov.coder.stop(), ov.plain.stop()]);
  });

  describe("tool-guided `auto` (--enable_tool_guided_generation): free text with call triggers", () => {
    // hermes3 with reasoning: a start-only bare-JSON trigger, <tool_call> anywhere, a gated free start.
    let hermes: ServerHandle;
    beforeAll(async () => {
      hermes = await startServer(["--model_path", "keel-tiny-qwen3", "--tool_parser", "hermes3", "--reasoning_parser", "qwen3", "--enable_tool_guided_generation", "true", "--max_num_seqs", "4", "--max_num_batched_tokens", "64"], {}, { engine });
    }, 120_000);
    afterAll(async () => {
      await hermes?.stop();
    });
    const tool = { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"], additionalProperties: false } } };

    it.each([
      ["hermes3", () => hermes, "keel-tiny-qwen3"],
      ["qwen3coder", () => servers().coder, "keel-tiny-qwen3coder"],
    ] as const)("%s: served (never a 400), every call it makes is schema-valid, and the stream equals the unary answer", async (_format, server, model) => {
      for (const seed of [1, 2]) {
        const body = { model, messages: user, tools: [tool], max_tokens: 40, temperature: 1, seed, chat_template_kwargs: { enable_thinking: false } };
        const unary = await chat(server().baseUrl, body);
        expect(unary.status, JSON.stringify(unary.body)).toBe(200);
        const c = firstChoice(unary);
        expect(["stop", "length", "tool_calls"]).toContain(c.finish_reason);
        if (c.finish_reason === "tool_calls") expectValidCalls(c.message, [tool as Tool]);
        const stream = collect((await chat(server().baseUrl, { ...body, stream: true })).events);
        expect(stream.content).toBe(c.message.content ?? "");
        expect(stream.calls.map((x) => [x.name, x.arguments])).toEqual((c.message.tool_calls ?? []).map((x) => [x.function.name, x.function.arguments]));
      }
    });
  });

  describe("guided generation on random weights (the engine applies the grammar)", () => {
    // Bounded strings: a random-weight model inside an unbounded JSON string would write until max_tokens.
    const lookup = {
      type: "function",
      function: {
        name: "get_weather",
        description: "Current weather of a city",
        parameters: { type: "object", properties: { city: { type: "string", minLength: 1, maxLength: 10 }, days: { type: "integer", minimum: 1, maximum: 7 } }, required: ["city"], additionalProperties: false },
      },
    };
    const order = {
      type: "function",
      function: {
        name: "place_order",
        description: "Order items",
        parameters: {
          type: "object",
          properties: { item: { type: "string", enum: ["tea", "coffee"] }, qty: { type: "integer", minimum: 1, maximum: 9 }, note: { type: "string", maxLength: 6 } },
          required: ["item", "qty"],
          additionalProperties: false,
        },
      },
    };

    it.each([1, 2, 3])("qwen3coder, tool_choice required, one call (seed %i): a schema-valid call, finish_reason tool_calls; stream agrees", async (seed) => {
      const body = { model: "keel-tiny-qwen3coder", messages: user, tools: [lookup, order], tool_choice: "required", parallel_tool_calls: false, max_tokens: 300, temperature: 1, seed };
      const unary = await chat(servers().coder.baseUrl, body);
      expect(unary.status).toBe(200);
      const c = firstChoice(unary);
      expect(c.finish_reason).toBe("tool_calls");
      expectValidCalls(c.message, [lookup, order]);
      const stream = await chat(servers().coder.baseUrl, { ...body, stream: true });
      const s = collect(stream.events);
      expect(s.calls.map((x) => [x.name, x.arguments])).toEqual(c.message.tool_calls!.map((x) => [x.function.name, x.function.arguments]));
    });

    it("qwen3coder, a named function with parallel_tool_calls false: exactly one call, to that function", async () => {
      const r = await chat(servers().coder.baseUrl, { model: "keel-tiny-qwen3coder", messages: user, tools: [lookup, order], tool_choice: { type: "function", function: { name: "place_order" } }, parallel_tool_calls: false, max_tokens: 200, seed: 5 });
      expect(r.status).toBe(200);
      const c = firstChoice(r);
      expectValidCalls(c.message, [order]);
      expect(c.message.tool_calls!.map((t) => t.function.name)).toEqual(["place_order"]);
      expect(c.finish_reason).toBe("tool_calls");
    });

    it("hermes3 (auto-resolved), a named function with thinking off: one schema-valid call; reasoning never in content", async () => {
      const r = await chat(servers().agent.baseUrl, {
        model: "keel-tiny-qwen3",
        messages: user,
        tools: [lookup, order],
        tool_choice: { type: "function", name: "get_weather" },
        parallel_tool_calls: false,
        chat_template_kwargs: { enable_thinking: false },
        max_tokens: 300,
        seed: 11,
      });
      expect(r.status).toBe(200);
      const c = firstChoice(r);
      expectValidCalls(c.message, [lookup]);
      expect(c.message.tool_calls).toHaveLength(1);
      expect(c.message.content ?? "").not.toContain("<think>");
    });

    it("named tool_choice renders only that tool (the prompt is the one-tool prompt)", async () => {
      const usage = async (extra: Record<string, unknown>) => {
        const r = await chat(servers().agent.baseUrl, { model: "keel-tiny-qwen3", messages: user, max_tokens: 1, temperature: 0, ...extra });
        expect(r.status).toBe(200);
        return (r.body as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
      };
      const time = fn({ type: "object", properties: {} }, "get_time");
      expect(await usage({ tools: [weather, time], tool_choice: { type: "function", function: { name: "get_weather" } } })).toBe(await usage({ tools: [weather] }));
    });

    const person = {
      type: "object",
      properties: { name: { type: "string", minLength: 1, maxLength: 8 }, age: { type: "integer", minimum: 0, maximum: 120 }, tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 3 } },
      required: ["name", "age"],
      additionalProperties: false,
    };

    it.each([1, 2, 3])("response_format json_schema (seed %i) without any server flag: the content parses and validates; stream agrees", async (seed) => {
      const body = { model: TINY_MODEL_FOR[engine], messages: user, response_format: { type: "json_schema", json_schema: { name: "person", schema: person, strict: true } }, max_tokens: 300, temperature: 1, seed };
      const r = await chat(servers().plain.baseUrl, body);
      expect(r.status).toBe(200);
      const c = firstChoice(r);
      expect(c.finish_reason).toBe("stop");
      const value: unknown = JSON.parse(c.message.content!);
      const validate = ajv.compile(person);
      expect(validate(value), ajv.errorsText(validate.errors)).toBe(true);
      const stream = await chat(servers().plain.baseUrl, { ...body, stream: true });
      expect(stream.text).toBe(c.message.content);
    });

    it("response_format with active tools is a 400 (the output cannot be both)", async () => {
      const r = await chat(servers().coder.baseUrl, { model: "keel-tiny-qwen3coder", messages: user, tools: [weather], response_format: { type: "json_object" }, max_tokens: 4 });
      expect(r.status).toBe(400);
      expect((r.body as ErrorBody).error.param).toBe("response_format");
    });
  });

  describe("an OpenAI SDK agent loop in both call formats (call, tool result, answer)", () => {
    const tool: ChatCompletionTool = {
      type: "function",
      function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"], additionalProperties: false } },
    };
    it.each([
      ["hermes3", () => servers().agent, "keel-tiny-qwen3"],
      ["qwen3coder", () => servers().coder, "keel-tiny-qwen3coder"],
    ] as const)("%s: the SDK's assistant message and the tool result go back through the template and are answered", async (_format, server, model) => {
      const sdk = new OpenAI({ baseURL: `${server().baseUrl}/v1`, apiKey: "k", maxRetries: 0 });
      const messages: ChatCompletionMessageParam[] = [{ role: "user", content: "Weather in Rome?" }];
      const first = await sdk.chat.completions.create({ model, messages, tools: [tool], tool_choice: "required", parallel_tool_calls: false, max_tokens: 120, seed: 3, chat_template_kwargs: { enable_thinking: false } } as never);
      const assistant = first.choices[0]!.message;
      expect(first.choices[0]!.finish_reason).toBe("tool_calls");
      expect(assistant.content).toBeNull();
      expect(assistant.tool_calls).toHaveLength(1);
      messages.push(assistant as ChatCompletionMessageParam);
      messages.push({ role: "tool", tool_call_id: assistant.tool_calls![0]!.id, content: '{"temp_c": 18}' });
      const second = await sdk.chat.completions.create({ model, messages, tools: [tool], max_tokens: 8, seed: 3 });
      expect(second.choices).toHaveLength(1);
      expect(["stop", "length", "tool_calls"]).toContain(second.choices[0]!.finish_reason);
      // The follow-up prompt holds the first one plus the call and its result.
      expect(second.usage!.prompt_tokens).toBeGreaterThan(first.usage!.prompt_tokens);
    });
  });

  describe("Responses API: function tools", () => {
    const flat = { type: "function", name: "get_weather", parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"], additionalProperties: false } };
    const post = async (body: Record<string, unknown>) => {
      const r = await fetch(`${servers().coder.baseUrl}/v3/responses`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      return { status: r.status, body: (await r.json()) as { status: string; output: { type: string; call_id?: string; name?: string; arguments?: string }[]; error?: unknown } };
    };

    it("required: a function_call output item with schema-valid arguments; its result goes back as function_call_output", async () => {
      const input: unknown[] = [{ role: "user", content: "Weather in Oslo?" }];
      const first = await post({ model: "keel-tiny-qwen3coder", input, tools: [flat], tool_choice: "required", parallel_tool_calls: false, max_output_tokens: 120 });
      expect(first.status).toBe(200);
      expect(first.body.status).toBe("completed");
      const calls = first.body.output.filter((o) => o.type === "function_call");
      expect(calls).toHaveLength(1);
      expect(calls[0]!.name).toBe("get_weather");
      expect(ajv.compile(flat.parameters)(JSON.parse(calls[0]!.arguments!))).toBe(true);
      input.push({ type: "function_call", call_id: calls[0]!.call_id, name: calls[0]!.name, arguments: calls[0]!.arguments });
      input.push({ type: "function_call_output", call_id: calls[0]!.call_id, output: '{"temp_c": 3}' });
      const second = await post({ model: "keel-tiny-qwen3coder", input, tools: [flat], max_output_tokens: 8 });
      expect(second.status).toBe(200);
      expect(["completed", "incomplete"]).toContain(second.body.status);
    });
  });
});
