/**
 * Issue #20 items 6–8 through the real server: structured outputs beyond JSON (vLLM's `structured_outputs` regex /
 * choice / grammar, its `guided_*` aliases, llama.cpp's `grammar`) on chat and completions on both engines — the tiny
 * model's text is random, so the constraint is visible: unconstrained it never matches, constrained it always does;
 * unknown fields and bad grammars are 400s before the engine; `reasoning_effort` switches the template's thinking;
 * the catalogue name given to `--model_path` is an alias of the served model.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chat } from "../support/chat-client.js";
import { realModelPath } from "../support/real-models.js";
import { ENGINES_UNDER_TEST, TINY_MODEL_FOR, get, startServer, type ServerHandle } from "../support/server.js";

const FLAGS = ["--max_num_seqs", "4", "--max_num_batched_tokens", "64"];
const user = [{ role: "user", content: "Say something." }];

type ErrorBody = { error: { code: string; param: string | null; message: string } };

/** POST a completions body; status and parsed body. */
async function complete(baseUrl: string, body: Record<string, unknown>): Promise<{ status: number; body: Record<string, unknown> }> {
  const r = await fetch(`${baseUrl}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
}

/** Text and finish reason of a unary chat answer. */
function answer(body: unknown): { text: string; finish: string } {
  const c = (body as { choices: { message: { content: string | null }; finish_reason: string }[] }).choices[0]!;
  return { text: c.message.content ?? "", finish: c.finish_reason };
}

describe.each(ENGINES_UNDER_TEST)("on the %s engine", (engine) => {
  let server: ServerHandle;
  const model = TINY_MODEL_FOR[engine];
  beforeAll(async () => {
    server = await startServer(FLAGS, {}, { engine });
  }, 180_000);
  afterAll(async () => {
    await server?.stop();
  });

  const ID = /^[a-z]{3}-[0-9]{2,4}$/;

  it("structured_outputs.regex: every seed fully matches (unconstrained, the same seeds never do); the stream agrees", async () => {
    for (const seed of [1, 2, 3]) {
      const body = { model, messages: user, max_tokens: 24, temperature: 1, seed };
      const free = await chat(server.baseUrl, body);
      expect(free.status).toBe(200);
      expect(answer(free.body).text).not.toMatch(ID);
      const r = await chat(server.baseUrl, { ...body, structured_outputs: { regex: ID.source } });
      expect(r.status).toBe(200);
      expect(answer(r.body)).toEqual({ text: expect.stringMatching(ID), finish: "stop" });
      const stream = await chat(server.baseUrl, { ...body, structured_outputs: { regex: ID.source }, stream: true });
      expect(stream.text).toBe(answer(r.body).text);
    }
  });

  it("a logit_bias that bans every token a guide allows is a 400 naming logit_bias, unary and streamed", async () => {
    // "~" is one token and "~~" / "~~~" no token of their own: the regex allows that token only.
    const tokenize = async (text: string) => {
      const r = await fetch(`${server.baseUrl}/v3/tokenize`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model, text, add_special_tokens: false }) });
      return ((await r.json()) as { tokens: number[] }).tokens;
    };
    const [tilde] = await tokenize("~");
    expect(await tokenize("~~~")).toEqual([tilde, tilde, tilde]);
    const body = { model, messages: user, max_tokens: 16, temperature: 1, seed: 4, structured_outputs: { regex: "~{3}" } };
    const allowed = await chat(server.baseUrl, body);
    expect(answer(allowed.body).text).toBe("~~~");
    const banned = { ...body, logit_bias: { [String(tilde)]: -100 } };
    const unary = await chat(server.baseUrl, banned);
    expect(unary.status).toBe(400);
    expect((unary.body as ErrorBody).error.param).toBe("logit_bias");
    const streamed = await chat(server.baseUrl, { ...banned, stream: true });
    // Refused before the stream starts (an engine without logit_bias) or by the stream's one error event.
    const error = streamed.status === 400 ? (streamed.body as ErrorBody).error : (streamed.events.at(-1) as ErrorBody | undefined)?.error;
    expect(error?.param).toBe("logit_bias");
    expect(streamed.text).toBe("");
  });

  it("choice (structured_outputs and guided_choice) on chat and completions: always one of the strings", async () => {
    const choices = ["positive", "negative", "neutral \"maybe\""];
    for (const seed of [1, 2, 3, 4]) {
      const c = await chat(server.baseUrl, { model, messages: user, max_tokens: 16, temperature: 1, seed, structured_outputs: { choice: choices } });
      expect(c.status).toBe(200);
      expect(choices).toContain(answer(c.body).text);
      const p = await complete(server.baseUrl, { model, prompt: "The review is", max_tokens: 16, temperature: 1, seed, guided_choice: choices });
      expect(p.status).toBe(200);
      expect(choices).toContain((p.body.choices as { text: string }[])[0]!.text);
    }
  });

  it("a GBNF grammar (llama.cpp's `grammar` on completions, structured_outputs.grammar on chat): the output is in its language", async () => {
    const grammar = 'root ::= "(" num ("," num){0,3} ")"\nnum ::= [1-9] [0-9]? # no leading zero\n';
    const language = /^\([1-9][0-9]?(,[1-9][0-9]?){0,3}\)$/;
    for (const seed of [1, 2, 3]) {
      const p = await complete(server.baseUrl, { model, prompt: "A tuple:", max_tokens: 30, temperature: 1, seed, grammar });
      expect(p.status).toBe(200);
      const choice = (p.body.choices as { text: string; finish_reason: string }[])[0]!;
      expect(choice).toEqual({ text: expect.stringMatching(language), finish_reason: "stop", index: 0, logprobs: null });
      const c = await chat(server.baseUrl, { model, messages: user, max_tokens: 30, temperature: 1, seed, structured_outputs: { grammar } });
      expect(answer(c.body)).toEqual({ text: expect.stringMatching(language), finish: "stop" });
      // Negated classes and `.` (any character) reach both engines as Keel re-wrote them.
      const any = await chat(server.baseUrl, { model, messages: user, max_tokens: 30, temperature: 1, seed, guided_grammar: 'root ::= "<" [^<>\\n]{1,5} ">" .' });
      expect(answer(any.body)).toEqual({ text: expect.stringMatching(/^<[^<>\n]{1,5}>.$/su), finish: "stop" });
    }
  });

  it("a bad grammar or regex, two constraints, or an unknown field: a 400 naming the field, and the next request works", async () => {
    const bad = async (extra: Record<string, unknown>, code: string, param: string, message: RegExp) => {
      const r = await chat(server.baseUrl, { model, messages: user, max_tokens: 4, ...extra });
      expect(r.status).toBe(400);
      expect((r.body as ErrorBody).error).toMatchObject({ code, param, message: expect.stringMatching(message) });
    };
    await bad({ grammar: 'root ::= item\nitem ::= "a" undefined-rule' }, "invalid_value", "grammar", /rule 'item' refers to the undefined rule 'undefined-rule'/);
    await bad({ structured_outputs: { grammar: 'root ::= root "a"' } }, "invalid_value", "structured_outputs.grammar", /left-recursive|derives no finite text/);
    await bad({ guided_regex: "a(?!b)" }, "invalid_value", "guided_regex", /lookaround assertions/);
    await bad({ response_format: { type: "json_object" }, guided_choice: ["a"] }, "invalid_value", "guided_choice", /one output constraint/);
    await bad({ max_token: 5, temprature: 0 }, "unknown_field", "max_token", /Unrecognized request argument supplied: 'max_token'\. Did you mean 'max_tokens'\?/);
    const p = await complete(server.baseUrl, { model, prompt: "x", max_token: 5 });
    expect(p.status).toBe(400);
    expect((p.body as unknown as ErrorBody).error).toMatchObject({ code: "unknown_field", param: "max_token" });
    const ok = await chat(server.baseUrl, { model, messages: user, max_tokens: 4, user: "u-1", metadata: { run: "e2e" } });
    expect(ok.status).toBe(200);
  });
});

describe("reasoning_effort (llama.cpp, keel-tiny-qwen3)", () => {
  let thinking: ServerHandle;
  let plain: ServerHandle;
  beforeAll(async () => {
    [thinking, plain] = await Promise.all([startServer(["--model_path", "keel-tiny-qwen3", "--reasoning_parser", "qwen3", ...FLAGS]), startServer(["--model_path", "keel-tiny-qwen3", ...FLAGS])]);
  }, 120_000);
  afterAll(async () => {
    await Promise.all([thinking?.stop(), plain?.stop()]);
  });

  const promptTokens = async (extra: Record<string, unknown>): Promise<number> => {
    const r = await chat(thinking.baseUrl, { model: "keel-tiny-qwen3", messages: user, max_tokens: 1, temperature: 0, ...extra });
    expect(r.status).toBe(200);
    return (r.body as { usage: { prompt_tokens: number } }).usage.prompt_tokens;
  };

  it("none/minimal render the template's thinking-off prompt, low/medium/high the thinking-on one", async () => {
    const off = await promptTokens({ chat_template_kwargs: { enable_thinking: false } });
    const on = await promptTokens({ chat_template_kwargs: { enable_thinking: true } });
    expect(off).not.toBe(on);
    for (const effort of ["none", "minimal"]) expect(await promptTokens({ reasoning_effort: effort })).toBe(off);
    for (const effort of ["low", "medium", "high"]) expect(await promptTokens({ reasoning_effort: effort })).toBe(on);
  });

  it("is a 400 without --reasoning_parser, and against a contradicting enable_thinking", async () => {
    const r = await chat(plain.baseUrl, { model: "keel-tiny-qwen3", messages: user, max_tokens: 1, reasoning_effort: "high" });
    expect(r.status).toBe(400);
    expect((r.body as ErrorBody).error).toMatchObject({ code: "unsupported_field", param: "reasoning_effort" });
    const c = await chat(thinking.baseUrl, { model: "keel-tiny-qwen3", messages: user, max_tokens: 1, reasoning_effort: "none", chat_template_kwargs: { enable_thinking: true } });
    expect(c.status).toBe(400);
    expect((c.body as ErrorBody).error.param).toBe("reasoning_effort");
  });
});

describe("model aliases (a catalogue model, SmolLM2-135M)", () => {
  let server: ServerHandle;
  beforeAll(async () => {
    realModelPath("smollm2-135m-instruct"); // a clear error when the cache lacks it
    server = await startServer(["--model_path", "smollm2-135m-instruct", ...FLAGS]);
  }, 120_000);
  afterAll(async () => {
    await server?.stop();
  });

  it("the name given to --model_path is accepted on chat, completions, tokenize and /models/{id}; /models lists the served name only", async () => {
    const list = JSON.parse((await get(server.baseUrl, "/v1/models")).body) as { data: { id: string }[] };
    expect(list.data.map((m) => m.id)).toEqual(["SmolLM2-135M-Instruct"]);
    const c = await chat(server.baseUrl, { model: "smollm2-135m-instruct", messages: user, max_tokens: 2 });
    expect(c.status).toBe(200);
    expect((c.body as { model: string }).model).toBe("SmolLM2-135M-Instruct");
    expect((await complete(server.baseUrl, { model: "smollm2-135m-instruct", prompt: "Hi", max_tokens: 2 })).status).toBe(200);
    const t = await fetch(`${server.baseUrl}/v3/tokenize`, { method: "POST", body: JSON.stringify({ model: "smollm2-135m-instruct", text: "hello" }) });
    expect(t.status).toBe(200);
    expect((await get(server.baseUrl, "/v2/models/smollm2-135m-instruct/ready")).status).toBe(200);
    const one = await get(server.baseUrl, "/v1/models/smollm2-135m-instruct");
    expect(JSON.parse(one.body)).toMatchObject({ id: "SmolLM2-135M-Instruct", object: "model" });
    const other = await chat(server.baseUrl, { model: "smollm2", messages: user, max_tokens: 2 });
    expect(other.status).toBe(404);
    expect((other.body as ErrorBody).error.message).toMatch(/Served models: "SmolLM2-135M-Instruct"/);
  });
});
