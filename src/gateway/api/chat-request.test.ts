import { describe, expect, it } from "vitest";
import { parseChatRequest, type ChatRequest } from "./chat-request.js";
import { KeelHttpError } from "../http/errors.js";

const base = { model: "m", messages: [{ role: "user", content: "Hi" }] };
const withBase = (extra: Record<string, unknown>) => ({ ...base, ...extra });

/** Runs the parser and returns the thrown KeelHttpError (fails if none). */
function reject(body: unknown): KeelHttpError {
  try {
    parseChatRequest(body);
  } catch (err) {
    expect(err).toBeInstanceOf(KeelHttpError);
    const e = err as KeelHttpError;
    expect(e.status).toBe(400);
    expect(e.type).toBe("invalid_request_error");
    // the message always names the field it is about
    if (e.param !== null) expect(e.message).toContain(`'${e.param}'`);
    return e;
  }
  throw new Error(`expected rejection of ${JSON.stringify(body)}`);
}

function expectReject(body: unknown, code: string, param: string | null, message?: RegExp) {
  const e = reject(body);
  expect({ code: e.code, param: e.param }).toEqual({ code, param });
  if (message) expect(e.message).toMatch(message);
}

describe("parseChatRequest: accepted bodies", () => {
  it("applies defaults to a minimal request", () => {
    expect(parseChatRequest(base)).toEqual<ChatRequest>({
      model: "m",
      messages: [{ role: "user", content: "Hi" }],
      stream: false,
      includeUsage: false,
      temperature: 1,
      topP: 1,
      topK: -1,
      stop: [],
      ignoreEos: false,
      n: 1,
      sampling: {},
      includeStopStr: false,
      logprobs: null,
      templateKwargs: {},
      tools: [],
      toolChoice: { kind: "none" },
      parallelToolCalls: true,
      responseFormat: { kind: "text" },
    });
  });

  it("maps every supported field to camelCase", () => {
    const r = parseChatRequest(
      withBase({
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 64,
        temperature: 0,
        top_p: 0.9,
        top_k: 40,
        seed: 4294967295,
        stop: ["\n\n", "END"],
        ignore_eos: true,
      }),
    );
    expect(r).toMatchObject({
      stream: true,
      includeUsage: true,
      maxTokens: 64,
      temperature: 0,
      topP: 0.9,
      topK: 40,
      seed: 4294967295,
      stop: ["\n\n", "END"],
      ignoreEos: true,
    });
  });

  it("lets max_completion_tokens win over max_tokens", () => {
    expect(parseChatRequest(withBase({ max_tokens: 10, max_completion_tokens: 20 })).maxTokens).toBe(20);
    expect(parseChatRequest(withBase({ max_tokens: 10, max_completion_tokens: null })).maxTokens).toBe(10);
  });

  it("treats null as unset for optional fields", () => {
    const r = parseChatRequest(
      withBase({ max_tokens: null, temperature: null, top_p: null, seed: null, stop: null, stream: null, n: null, tools: null, logprobs: null }),
    );
    expect(r).toMatchObject({ temperature: 1, topP: 1, stop: [], stream: false });
    expect(r).not.toHaveProperty("maxTokens");
    expect(r).not.toHaveProperty("seed");
  });

  it("accepts the range boundaries", () => {
    expect(parseChatRequest(withBase({ temperature: 2, top_p: 1, top_k: -1, seed: 0, max_tokens: 1 }))).toMatchObject({
      temperature: 2,
      topP: 1,
      topK: -1,
      seed: 0,
      maxTokens: 1,
    });
    expect(parseChatRequest(withBase({ max_tokens: 4294967295 })).maxTokens).toBe(4294967295);
    expect(parseChatRequest(withBase({ top_k: 1 })).topK).toBe(1);
  });

  it("wraps a single stop string and accepts 16 of them", () => {
    expect(parseChatRequest(withBase({ stop: "###" })).stop).toEqual(["###"]);
    const sixteen = Array.from({ length: 16 }, (_, i) => `s${i}`);
    expect(parseChatRequest(withBase({ stop: sixteen })).stop).toEqual(sixteen);
    expect(parseChatRequest(withBase({ stop: [] })).stop).toEqual([]);
  });

  it("accepts every role and flattens text parts with newlines", () => {
    const r = parseChatRequest(
      withBase({
        messages: [
          { role: "developer", content: "d" },
          { role: "system", content: "s" },
          { role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] },
          { role: "assistant", content: null },
          { role: "assistant" },
          { role: "tool", content: "t", tool_call_id: "x" },
        ],
      }),
    );
    expect(r.messages).toEqual([
      { role: "developer", content: "d" },
      { role: "system", content: "s" },
      { role: "user", content: "a\nb" },
      { role: "assistant", content: "" },
      { role: "assistant", content: "" },
      { role: "tool", content: "t", toolCallId: "x" },
    ]);
  });

  it("accepts OpenAI's label fields and ignores unknown fields inside messages", () => {
    const r = parseChatRequest({ ...base, user: "u1", metadata: { a: "1" }, safety_identifier: "s", prompt_cache_key: "k", messages: [{ role: "user", content: "x", name: "bob", refusal: null }] });
    // `name` is part of the message (templates may render it); `refusal` is not ours and is dropped.
    expect(r.messages).toEqual([{ role: "user", content: "x", name: "bob" }]);
    expect(r).not.toHaveProperty("user");
    expectReject(withBase({ metadata: { a: 1 } }), "invalid_value", "metadata.a", /expected a string/);
  });

  it("refuses unknown top-level fields, naming the first and the field it is probably a typo of", () => {
    expectReject(withBase({ max_token: 5, temprature: 0 }), "unknown_field", "max_token", /Unrecognized request argument supplied: 'max_token'\. Did you mean 'max_tokens'\?/);
    expect(reject(withBase({ max_token: 5, temprature: 0 })).message).not.toMatch(/temprature/);
    expectReject(withBase({ temprature: 0 }), "unknown_field", "temprature", /Did you mean 'temperature'\?/);
    expectReject(withBase({ frobnicate: true }), "unknown_field", "frobnicate", /^Unrecognized request argument supplied: 'frobnicate'\.$/);
    // vLLM's and llama.cpp's extension fields Keel applies are known.
    const r = parseChatRequest(withBase({ top_k: 5, min_p: 0.1, repetition_penalty: 1.1, ignore_eos: false, chat_template_kwargs: {}, guided_regex: "a+" }));
    expect(r.responseFormat).toEqual({ kind: "regex", pattern: "a+", field: "guided_regex" });
    // vLLM's chat extensions Keel does not offer: accepted at the value Keel always uses, else refused by name.
    expect(parseChatRequest(withBase({ add_generation_prompt: true, continue_final_message: false, echo: false, use_beam_search: false })).model).toBe("m");
    expectReject(withBase({ add_generation_prompt: false }), "unsupported_field", "add_generation_prompt");
    expectReject(withBase({ echo: true }), "unsupported_field", "echo", /\/completions has 'echo'/);
  });

  it("accepts the no-op values of unsupported features", () => {
    const r = parseChatRequest(
      withBase({
        n: 1,
        best_of: 1,
        logprobs: false,
        top_logprobs: 0,
        tools: [],
        tool_choice: "none",
        functions: [],
        function_call: "auto",
        response_format: { type: "text" },
        logit_bias: {},
        presence_penalty: 0,
        frequency_penalty: 0,
        modalities: ["text"],
      }),
    );
    expect(r.model).toBe("m");
    expect(parseChatRequest(withBase({ tool_choice: "auto" })).model).toBe("m");
  });
});

describe("parseChatRequest: the body itself", () => {
  it.each([
    ["an array", []],
    ["a string", "hello"],
    ["null", null],
    ["an integer", 42],
    ["a decimal", 4.2],
    ["a boolean", true],
  ])("rejects %s as the whole body", (what, body) => {
    const e = reject(body);
    expect(e.code).toBe("invalid_value");
    expect(e.param).toBeNull();
    expect(e.message).toBe(`Invalid type for the request body: expected a JSON object, but got ${what} instead.`);
  });

  it("an absent body is invalid JSON that says it is empty", () => {
    const e = reject(undefined);
    expect([e.code, e.param, e.message]).toEqual(["invalid_json", null, "We could not parse the JSON body of your request. (The request body is empty.)"]);
  });

  it("a number beyond a double's range (JSON.parse reads 1e309 as Infinity) is named so, not as a decimal", () => {
    expectReject({ ...base, temperature: JSON.parse("1e309") }, "invalid_value", "temperature", /got a value beyond the range of a double \(read as Infinity\)/);
  });

  it("rejects an empty object, reporting the missing model first", () => {
    expectReject({}, "missing_field", "model", /^Missing required parameter: 'model'\.$/);
  });
});

describe("parseChatRequest: model and messages", () => {
  it("requires model to be a non-empty string", () => {
    expectReject({ model: 3, messages: base.messages }, "invalid_value", "model", /expected a string, but got an integer/);
    expectReject({ model: "", messages: base.messages }, "invalid_value", "model", /non-empty/);
    expectReject({ model: null, messages: base.messages }, "invalid_value", "model", /got null/);
  });

  it("requires a non-empty messages array", () => {
    expectReject({ model: "m" }, "missing_field", "messages");
    expectReject({ model: "m", messages: [] }, "invalid_value", "messages", /^Invalid value for 'messages': expected a non-empty array, but got an empty array\.$/);
    expectReject({ model: "m", messages: "hi" }, "invalid_value", "messages", /expected an array, but got a string/);
    expectReject({ model: "m", messages: { role: "user" } }, "invalid_value", "messages", /expected an array, but got an object/);
  });

  it("requires each message to be an object", () => {
    expectReject({ model: "m", messages: ["hi"] }, "invalid_value", "messages[0]", /expected an object, but got a string/);
    expectReject({ model: "m", messages: [null] }, "invalid_value", "messages[0]", /got null/);
  });

  it("validates role", () => {
    expectReject(withBase({ messages: [{ content: "x" }] }), "missing_field", "messages[0].role");
    expectReject(withBase({ messages: [{ role: null, content: "x" }] }), "invalid_value", "messages[0].role", /got null/);
    expectReject(
      withBase({ messages: [{ role: "user", content: "x" }, { role: "robot", content: "x" }] }),
      "invalid_value",
      "messages[1].role",
      /expected one of 'system', 'user', 'assistant', 'tool', 'developer' \(got 'robot'\)/,
    );
    expectReject(withBase({ messages: [{ role: 1, content: "x" }] }), "invalid_value", "messages[0].role");
  });

  it("allows null or missing content only for assistant messages", () => {
    expectReject(withBase({ messages: [{ role: "user", content: null }] }), "invalid_value", "messages[0].content", /only allowed in assistant/);
    expectReject(withBase({ messages: [{ role: "system" }] }), "missing_field", "messages[0].content");
  });

  it("rejects content of the wrong type", () => {
    expectReject(withBase({ messages: [{ role: "user", content: 5 }] }), "invalid_value", "messages[0].content", /Invalid type.*got an integer/);
    expectReject(withBase({ messages: [{ role: "user", content: { type: "text" } }] }), "invalid_value", "messages[0].content", /got an object/);
    expectReject(withBase({ messages: [{ role: "user", content: [] }] }), "invalid_value", "messages[0].content", /non-empty array/);
  });

  it("validates content parts, naming the part", () => {
    const m = (content: unknown) => withBase({ messages: [{ role: "user", content }] });
    expectReject(m([{ type: "text", text: "ok" }, { type: "mystery", text: "x" }]), "invalid_value", "messages[0].content[1].type", /expected 'text' \(got 'mystery'\)/);
    expectReject(m([{ type: "image_url", image_url: { url: "data:" } }]), "unsupported_field", "messages[0].content[0].type", /'image_url'/);
    expectReject(m([{ type: "input_audio" }]), "unsupported_field", "messages[0].content[0].type");
    expectReject(m([{ text: "x" }]), "missing_field", "messages[0].content[0].type");
    expectReject(m([{ type: 7 }]), "invalid_value", "messages[0].content[0].type", /Invalid type/);
    expectReject(m([{ type: "text" }]), "missing_field", "messages[0].content[0].text");
    expectReject(m([{ type: "text", text: null }]), "invalid_value", "messages[0].content[0].text", /got null/);
    expectReject(m(["plain"]), "invalid_value", "messages[0].content[0]", /expected an object, but got a string/);
  });
});

describe("parseChatRequest: generation parameters", () => {
  it.each([0, -1, 1e12, 4294967296, 2 ** 60, 1e300])("rejects max_tokens %s as out of range", (v) => {
    expectReject(withBase({ max_tokens: v }), "invalid_value", "max_tokens", /must be an integer between 1 and 4294967295/);
  });

  it("rejects non-integer and non-numeric token limits", () => {
    expectReject(withBase({ max_tokens: 1.5 }), "invalid_value", "max_tokens", /must be an integer.*got 1\.5/);
    expectReject(withBase({ max_tokens: "100" }), "invalid_value", "max_tokens", /Invalid type for 'max_tokens': expected a number, but got a string instead\./);
    expectReject(withBase({ max_completion_tokens: 0 }), "invalid_value", "max_completion_tokens");
    expectReject(withBase({ max_completion_tokens: true }), "invalid_value", "max_completion_tokens", /got a boolean/);
  });

  it("bounds temperature to 0..2", () => {
    expectReject(withBase({ temperature: 2.5 }), "invalid_value", "temperature", /^Invalid value for 'temperature': must be between 0 and 2 \(got 2\.5\)\.$/);
    expectReject(withBase({ temperature: -0.1 }), "invalid_value", "temperature");
    expectReject(withBase({ temperature: "0.7" }), "invalid_value", "temperature", /expected a number, but got a string/);
  });

  it("requires 0 < top_p <= 1", () => {
    expectReject(withBase({ top_p: 0 }), "invalid_value", "top_p", /greater than 0 and at most 1/);
    expectReject(withBase({ top_p: 1.01 }), "invalid_value", "top_p");
    expectReject(withBase({ top_p: [1] }), "invalid_value", "top_p", /got an array/);
  });

  it("requires top_k to be -1 or a positive integer", () => {
    expect(parseChatRequest(withBase({ top_k: 0 })).topK).toBe(-1); // 0 = all tokens, as vLLM and llama.cpp
    expectReject(withBase({ top_k: -3 }), "invalid_value", "top_k", /-1 or 0 \(all tokens\) or a positive integer/);
    expectReject(withBase({ top_k: -2 }), "invalid_value", "top_k");
    expectReject(withBase({ top_k: 2.5 }), "invalid_value", "top_k");
    expectReject(withBase({ top_k: "40" }), "invalid_value", "top_k", /got a string/);
  });

  it.each([-1, 4294967296, 2 ** 53, 1e20, 0.5])("rejects seed %s", (v) => {
    expectReject(withBase({ seed: v }), "invalid_value", "seed", /between 0 and 4294967295/);
  });

  it("rejects a string seed", () => {
    expectReject(withBase({ seed: "42" }), "invalid_value", "seed", /got a string/);
  });

  it("validates stop", () => {
    expectReject(withBase({ stop: "" }), "invalid_value", "stop", /non-empty/);
    expectReject(withBase({ stop: ["a", ""] }), "invalid_value", "stop[1]", /non-empty/);
    expectReject(withBase({ stop: Array.from({ length: 100 }, (_, i) => `s${i}`) }), "invalid_value", "stop", /at most 16 stop strings, but got 100/);
    expectReject(withBase({ stop: ["ok", "x".repeat(4097)] }), "invalid_value", "stop[1]", /at most 4096 characters \(got 4097\)/);
    expect(parseChatRequest(withBase({ stop: "x".repeat(4096) })).stop).toEqual(["x".repeat(4096)]);
    expectReject(withBase({ stop: Array.from({ length: 17 }, () => "x") }), "invalid_value", "stop");
    expectReject(withBase({ stop: ["a", 3] }), "invalid_value", "stop[1]", /expected a string, but got an integer/);
    expectReject(withBase({ stop: 5 }), "invalid_value", "stop", /string or an array of strings/);
    expectReject(withBase({ stop: { a: 1 } }), "invalid_value", "stop", /got an object/);
  });

  it("validates stream, stream_options and ignore_eos types", () => {
    expectReject(withBase({ stream: "true" }), "invalid_value", "stream", /expected a boolean, but got a string/);
    expectReject(withBase({ stream: 1 }), "invalid_value", "stream");
    expectReject(withBase({ stream: true, stream_options: "yes" }), "invalid_value", "stream_options", /expected an object/);
    expectReject(withBase({ stream: true, stream_options: { include_usage: "yes" } }), "invalid_value", "stream_options.include_usage");
    expectReject(withBase({ ignore_eos: "no" }), "invalid_value", "ignore_eos");
  });

  it("allows stream_options only with stream: true", () => {
    expectReject(withBase({ stream_options: { include_usage: true } }), "invalid_value", "stream_options", /only allowed when 'stream' is true/);
    expectReject(withBase({ stream: false, stream_options: {} }), "invalid_value", "stream_options");
    expect(parseChatRequest(withBase({ stream: true, stream_options: {} })).includeUsage).toBe(false);
    expect(parseChatRequest(withBase({ stream: false, stream_options: null })).stream).toBe(false);
  });

  it("reports the first problem in field order", () => {
    expectReject({ model: "m", messages: [], temperature: 9 }, "invalid_value", "messages");
    expectReject(withBase({ temperature: 9, seed: -1 }), "invalid_value", "temperature");
  });
});

describe("parseChatRequest: recognised but unsupported fields", () => {
  it.each([
    ["best_of", 3],
    ["functions", [{ name: "f" }]],
    ["function_call", { name: "f" }],
    ["audio", { voice: "alloy", format: "mp3" }],
    ["modalities", ["text", "audio"]],
    ["prediction", { type: "content", content: "x" }],
  ])("rejects %s = %j with unsupported_field", (field, value) => {
    const e = reject(withBase({ [field]: value }));
    expect(e.code).toBe("unsupported_field");
    expect(e.param).toBe(field);
    expect(e.message).toMatch(new RegExp(`^Unsupported parameter: '${field}' is not supported by this server\\.`));
  });

  it("validates the type and range of n, penalties and logprobs", () => {
    expectReject(withBase({ n: 0 }), "invalid_value", "n", /must be an integer between 1 and 16 \(got 0\)/);
    expectReject(withBase({ n: 17 }), "invalid_value", "n", /must be an integer between 1 and 16 \(got 17\)/);
    expectReject(withBase({ n: -3 }), "invalid_value", "n");
    expectReject(withBase({ n: "2" }), "invalid_value", "n", /got a string/);
    expectReject(withBase({ presence_penalty: "high" }), "invalid_value", "presence_penalty", /got a string/);
    expectReject(withBase({ logprobs: 1 }), "invalid_value", "logprobs", /expected a boolean/);
    expectReject(withBase({ presence_penalty: 2.5 }), "invalid_value", "presence_penalty", /between -2 and 2 \(got 2.5\)/);
    expectReject(withBase({ frequency_penalty: -3 }), "invalid_value", "frequency_penalty", /between -2 and 2/);
    expectReject(withBase({ repetition_penalty: 0 }), "invalid_value", "repetition_penalty", /greater than 0/);
    expect(parseChatRequest(withBase({ reasoning_effort: "high" })).reasoningEffort).toBe("high");
    expectReject(withBase({ reasoning_effort: "max" }), "invalid_value", "reasoning_effort", /expected one of 'none', 'minimal', 'low', 'medium', 'high', 'xhigh'/);
    expectReject(withBase({ verbosity: "high" }), "unsupported_field", "verbosity");
    expectReject(withBase({ store: true }), "unsupported_field", "store");
    expect(parseChatRequest(withBase({ store: false, service_tier: "auto" })).model).toBe(withBase({}).model);
    expectReject(withBase({ repetition_penalty: 1e300 }), "invalid_value", "repetition_penalty", /at most 1000000 \(1 = off\) \(got 1e\+300\)/);
    expectReject(withBase({ min_p: 1.5 }), "invalid_value", "min_p", /between 0 and 1/);
    expectReject(withBase({ min_tokens: -1 }), "invalid_value", "min_tokens", /non-negative integer/);
    expectReject(withBase({ min_tokens: 20, max_tokens: 5 }), "invalid_value", "min_tokens", /must not exceed the token budget \(max_tokens 5\), got 20/);
    expectReject(withBase({ min_tokens: 20, max_tokens: 50, max_completion_tokens: 5 }), "invalid_value", "min_tokens", /max_tokens 5/);
    expect(parseChatRequest(withBase({ min_tokens: 5, max_tokens: 5 })).sampling).toEqual({ minTokens: 5 });
    expectReject(withBase({ stop_token_ids: [1, "x"] }), "invalid_value", "stop_token_ids[1]");
    expectReject(withBase({ top_logprobs: 21, logprobs: true }), "invalid_value", "top_logprobs", /between 0 and 20/);
    expectReject(withBase({ top_logprobs: 2 }), "invalid_value", "top_logprobs", /'logprobs' must be true/);
    expectReject(withBase({ best_of: 3, n: 2 }), "unsupported_field", "best_of", /equal to n/);
    expectReject(withBase({ chat_template_kwargs: [1] }), "invalid_value", "chat_template_kwargs");
  });

  it("logit_bias names the bad key or bias", () => {
    expectReject(withBase({ logit_bias: { hello: 5 } }), "invalid_value", "logit_bias", /key 'hello' is not a token id/);
    expectReject(withBase({ logit_bias: { "-1": 5 } }), "invalid_value", "logit_bias", /key '-1' is not a token id/);
    expectReject(withBase({ logit_bias: { "12": 101 } }), "invalid_value", "logit_bias", /bias of token 12 must be a number between -100 and 100 \(got 101\)/);
    // A deeply nested bias is described by its type: not serialised back (a 10,000-level array overflowed the stack: 500).
    const deep = JSON.parse(`${"[".repeat(10000)}${"]".repeat(10000)}`) as unknown;
    expectReject(withBase({ logit_bias: { "12": deep } }), "invalid_value", "logit_bias", /bias of token 12 must be a number between -100 and 100 \(got an array\)/);
    expectReject(withBase({ logit_bias: { "12": "x".repeat(5000) } }), "invalid_value", "logit_bias", /\(got 'x{120}…'\)/);
    expectReject(withBase({ logit_bias: [1] }), "invalid_value", "logit_bias", /expected an object/);
  });
});

describe("parseChatRequest: the sampling set", () => {
  it("maps every field, drops no-op values and reads logprobs, n and template kwargs", () => {
    const r = parseChatRequest(
      withBase({
        n: 3,
        best_of: 3,
        presence_penalty: 0.5,
        frequency_penalty: -1,
        repetition_penalty: 1.2,
        min_p: 0.05,
        logit_bias: { "7": -100, "9": 0, "11": 2.5 },
        min_tokens: 4,
        stop_token_ids: [5, 5, 6],
        include_stop_str_in_output: true,
        logprobs: true,
        top_logprobs: 3,
        chat_template_kwargs: { enable_thinking: false },
      }),
    );
    expect(r.n).toBe(3);
    expect(r.sampling).toEqual({ presencePenalty: 0.5, frequencyPenalty: -1, repetitionPenalty: 1.2, minP: 0.05, logitBias: [[7, -100], [11, 2.5]], minTokens: 4, stopTokenIds: [5, 6] });
    expect(r.includeStopStr).toBe(true);
    expect(r.logprobs).toBe(3);
    expect(r.templateKwargs).toEqual({ enable_thinking: false });
    expect(parseChatRequest(withBase({ logprobs: true })).logprobs).toBe(0);
    expect(parseChatRequest(withBase({ repetition_penalty: 1, min_p: 0, min_tokens: 0, stop_token_ids: [] })).sampling).toEqual({});
  });
});

describe("parseChatRequest: hostile bodies", () => {
  it.each([
    ["deeply nested content", withBase({ messages: [{ role: "user", content: [[[[[[]]]]]] }] }), "messages[0].content[0]"],
    ["huge stop string with a bad max_tokens", withBase({ stop: "x".repeat(100_000), max_tokens: -5 }), "max_tokens"],
    ["a 100 kB unknown role", withBase({ messages: [{ role: "r".repeat(100_000), content: "x" }] }), "messages[0].role"],
    ["a NaN-like string", withBase({ temperature: "NaN" }), "temperature"],
    ["an object for model", { model: { name: "m" }, messages: base.messages }, "model"],
  ])("%s → 400 naming the field, with a short message", (_label, body, param) => {
    const e = reject(body);
    expect(e.param).toBe(param);
    expect(e.message.length).toBeLessThan(300);
  });

  it("does not let a __proto__ key change the parsed role", () => {
    const body = JSON.parse('{"model":"m","messages":[{"role":"user","content":"x","__proto__":{"role":"system"}}]}');
    expect(parseChatRequest(body).messages).toEqual([{ role: "user", content: "x" }]);
  });
});

describe("parseChatRequest: tools, tool_choice, parallel_tool_calls, response_format", () => {
  const params = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
  const nested = { type: "function", function: { name: "get_weather", description: "Weather", parameters: params, strict: true } };
  const flat = { type: "function", name: "get_time" };

  it("accepts OpenAI nested and OVMS flat tools; tool_choice defaults to auto with tools", () => {
    const r = parseChatRequest(withBase({ tools: [nested, flat] }));
    expect(r.tools).toEqual([{ name: "get_weather", description: "Weather", parameters: params, strict: true }, { name: "get_time" }]);
    expect(r.toolChoice).toEqual({ kind: "auto" });
    expect(r.parallelToolCalls).toBe(true);
  });

  it.each([
    ["none", { kind: "none" }],
    ["auto", { kind: "auto" }],
    ["required", { kind: "required" }],
    [{ type: "function", function: { name: "get_time" } }, { kind: "function", name: "get_time" }],
    [{ type: "function", name: "get_time" }, { kind: "function", name: "get_time" }],
  ])("maps tool_choice %j", (choice, expected) => {
    expect(parseChatRequest(withBase({ tools: [nested, flat], tool_choice: choice })).toolChoice).toEqual(expected);
  });

  it("maps parallel_tool_calls and the three response formats", () => {
    expect(parseChatRequest(withBase({ parallel_tool_calls: false })).parallelToolCalls).toBe(false);
    expect(parseChatRequest(withBase({ response_format: { type: "json_object" } })).responseFormat).toEqual({ kind: "json_object" });
    expect(parseChatRequest(withBase({ response_format: { type: "text" } })).responseFormat).toEqual({ kind: "text" });
    const schema = { type: "object", properties: { a: { type: "integer" } } };
    expect(parseChatRequest(withBase({ response_format: { type: "json_schema", json_schema: { name: "out", schema, strict: true } } })).responseFormat).toEqual({
      kind: "json_schema",
      name: "out",
      schema,
      strict: true,
    });
  });

  it.each([
    [{ tools: {} }, "invalid_value", "tools", /expected an array of tools/],
    [{ tools: ["x"] }, "invalid_value", "tools[0]", /expected an object/],
    [{ tools: [{ function: { name: "f" } }] }, "missing_field", "tools[0].type", undefined],
    [{ tools: [{ type: "code_interpreter" }] }, "unsupported_field", "tools[0].type", /Only tools of type 'function'/],
    [{ tools: [{ type: "function", function: "f" }] }, "invalid_value", "tools[0].function", /expected an object/],
    [{ tools: [{ type: "function", function: {} }] }, "missing_field", "tools[0].function.name", undefined],
    [{ tools: [{ type: "function", function: { name: "" } }] }, "invalid_value", "tools[0].function.name", /non-empty/],
    [{ tools: [{ type: "function", function: { name: "get weather" } }] }, "invalid_value", "tools[0].function.name", /1 to 64 characters/],
    [{ tools: [{ type: "function", name: "x".repeat(65) }] }, "invalid_value", "tools[0].name", /1 to 64 characters/],
    [{ tools: [{ type: "function", function: { name: "f", parameters: "{}" } }] }, "invalid_value", "tools[0].function.parameters", /expected an object \(a JSON schema\)/],
    [{ tools: [{ type: "function", function: { name: "f", parameters: [] } }] }, "invalid_value", "tools[0].function.parameters", /got an array/],
    [{ tools: [{ type: "function", function: { name: "f", strict: "yes" } }] }, "invalid_value", "tools[0].function.strict", /expected a boolean/],
    [{ tools: [{ type: "function", function: { name: "f" } }, { type: "function", name: "f" }] }, "invalid_value", "tools[1].name", /declared more than once/],
    [{ tools: Array.from({ length: 129 }, (_, i) => ({ type: "function", name: `f${i}` })) }, "invalid_value", "tools", /at most 128 tools/],
    [{ tools: [nested], tool_choice: "any" }, "invalid_value", "tool_choice", /'none', 'auto', 'required'/],
    [{ tools: [nested], tool_choice: 3 }, "invalid_value", "tool_choice", /expected a string or an object/],
    [{ tools: [nested], tool_choice: { type: "function" } }, "missing_field", "tool_choice.name", undefined],
    [{ tools: [nested], tool_choice: { type: "function", function: { name: 1 } } }, "invalid_value", "tool_choice.function.name", /expected a string/],
    [{ tools: [nested], tool_choice: { type: "function", function: { name: "nope" } } }, "invalid_value", "tool_choice", /no function named 'nope'/],
    [{ tool_choice: { type: "function", name: "get_weather" } }, "invalid_value", "tool_choice", /no function named/],
    [{ tool_choice: "required" }, "invalid_value", "tool_choice", /needs at least one tool/],
    [{ parallel_tool_calls: "no" }, "invalid_value", "parallel_tool_calls", /expected a boolean/],
    [{ response_format: "json" }, "invalid_value", "response_format", /expected an object/],
    [{ response_format: { type: "yaml" } }, "invalid_value", "response_format.type", /'text', 'json_object', 'json_schema'/],
    [{ response_format: { type: "json_schema" } }, "missing_field", "response_format.json_schema", undefined],
    [{ response_format: { type: "json_schema", json_schema: { schema: {} } } }, "missing_field", "response_format.json_schema.name", undefined],
    [{ response_format: { type: "json_schema", json_schema: { name: "a b", schema: {} } } }, "invalid_value", "response_format.json_schema.name", /1 to 64/],
    [{ response_format: { type: "json_schema", json_schema: { name: "x" } } }, "missing_field", "response_format.json_schema.schema", undefined],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: true } } }, "invalid_value", "response_format.json_schema.schema", /a JSON schema/],
  ])("rejects %j", (extra, code, param, message) => {
    expectReject(withBase(extra as Record<string, unknown>), code, param, message);
  });
});

describe("parseChatRequest: tool calls and tool results in messages", () => {
  const call = { id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } };

  it("carries assistant tool_calls (null content), tool results and reasoning_content to the template", () => {
    const r = parseChatRequest({
      model: "m",
      messages: [
        { role: "user", content: "Weather?" },
        { role: "assistant", content: null, reasoning_content: "think", tool_calls: [call, { id: "call_2", function: { name: "f" } }] },
        { role: "tool", content: "sunny", tool_call_id: "call_1", name: "get_weather" },
      ],
    });
    expect(r.messages).toEqual([
      { role: "user", content: "Weather?" },
      {
        role: "assistant",
        content: "",
        reasoningContent: "think",
        toolCalls: [
          { id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
          { id: "call_2", name: "f", arguments: "{}" },
        ],
      },
      { role: "tool", content: "sunny", toolCallId: "call_1", name: "get_weather" },
    ]);
  });

  const msgs = (m: Record<string, unknown>) => ({ model: "m", messages: [{ role: "user", content: "x" }, m] });
  it.each([
    [{ role: "assistant", content: null, tool_calls: {} }, "invalid_value", "messages[1].tool_calls", /expected an array/],
    [{ role: "assistant", content: null, tool_calls: ["x"] }, "invalid_value", "messages[1].tool_calls[0]", /expected an object/],
    [{ role: "assistant", content: null, tool_calls: [{ function: { name: "f" } }] }, "missing_field", "messages[1].tool_calls[0].id", undefined],
    [{ role: "assistant", content: null, tool_calls: [{ id: "c" }] }, "missing_field", "messages[1].tool_calls[0].function", undefined],
    [{ role: "assistant", content: null, tool_calls: [{ id: "c", function: {} }] }, "missing_field", "messages[1].tool_calls[0].function.name", undefined],
    [{ role: "assistant", content: null, tool_calls: [{ id: "c", function: { name: "f", arguments: { a: 1 } } }] }, "invalid_value", "messages[1].tool_calls[0].function.arguments", /expected a string/],
    [{ role: "assistant", content: null, tool_calls: [{ id: "c", type: "custom", function: { name: "f" } }] }, "invalid_value", "messages[1].tool_calls[0].type", /'function'/],
    [{ role: "user", content: "x", tool_calls: [] }, "invalid_value", "messages[1].tool_calls", /only assistant messages/],
    [{ role: "tool", content: "x" }, "missing_field", "messages[1].tool_call_id", undefined],
    [{ role: "tool", content: "x", tool_call_id: 5 }, "invalid_value", "messages[1].tool_call_id", /expected a string/],
    [{ role: "user", content: "x", tool_call_id: "c" }, "invalid_value", "messages[1].tool_call_id", /only tool messages/],
    [{ role: "assistant", content: "x", reasoning_content: 1 }, "invalid_value", "messages[1].reasoning_content", /expected a string/],
    [{ role: "user", content: "x", reasoning_content: "r" }, "invalid_value", "messages[1].reasoning_content", /only assistant/],
    [{ role: "user", content: "x", name: 3 }, "invalid_value", "messages[1].name", /expected a string/],
  ])("rejects %j", (m, code, param, message) => {
    expectReject(msgs(m), code, param, message);
  });
});
