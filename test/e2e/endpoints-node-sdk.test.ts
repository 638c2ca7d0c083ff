/**
 * The endpoints of issue #8 against the real server (tiny embedded model) with the official OpenAI Node SDK:
 * completions.create (string and list prompts, echo, default max_tokens, streaming, integer logprobs),
 * responses.create (unary and streamed typed events; stateless fields refused), `n` = 2 (indexed choices in stream
 * and unary, usage, a stream abort releasing both children), chat logprobs, the sampling set (logit_bias,
 * stop_token_ids), /v3/tokenize, models/{id}, the short 404 and the 405 with Allow, and HTTP/1.1 pipelining on one socket.
 */
import net from "node:net";
import OpenAI, { BadRequestError, NotFoundError } from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { get, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

const MODEL = "keel-tiny";
let server: ServerHandle;
let sdk: OpenAI;

beforeAll(async () => {
  server = await startServer(["--max_num_seqs", "4", "--max_num_batched_tokens", "64"]);
  sdk = new OpenAI({ baseURL: server.baseUrl + "/v3", apiKey: "keel-test", maxRetries: 0, timeout: 60_000 });
});
afterAll(async () => {
  await server?.stop();
});

/** POST a JSON body; resolves with status and parsed body. */
async function post(path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const r = await fetch(server.baseUrl + path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, json: (await r.json()) as Record<string, unknown> };
}

async function tokenize(text: string, addSpecialTokens = true): Promise<number[]> {
  const r = await post("/v3/tokenize", { model: MODEL, text, add_special_tokens: addSpecialTokens });
  expect(r.status).toBe(200);
  return r.json.tokens as number[];
}

const gauges = ["keel_requests_running", "keel_requests_waiting", "keel_engine_sequences_active"];
const gaugesAtZero = (m: Map<string, number>): boolean => gauges.every((g) => m.get(g) === 0);
const metric = (m: Map<string, number>, k: string): number => m.get(k) ?? NaN;

describe("completions", () => {
  it("unary and streamed greedy text are equal; usage prompt tokens equal /v3/tokenize of the prompt", async () => {
    const body = { model: MODEL, prompt: "Once upon a time", max_tokens: 12, temperature: 0, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming;
    const u = await sdk.completions.create(body);
    expect(u.object).toBe("text_completion");
    expect(u.id).toMatch(/^cmpl-/);
    expect(u.choices).toHaveLength(1);
    expect(u.choices[0]!.finish_reason).toBe("length");
    expect(u.usage?.completion_tokens).toBe(12);
    expect(u.usage?.prompt_tokens).toBe((await tokenize("Once upon a time")).length);
    const stream = await sdk.completions.create({ ...body, stream: true });
    let text = "";
    const reasons: (string | null)[] = [];
    for await (const ch of stream) {
      expect(ch.object).toBe("text_completion");
      text += ch.choices[0]?.text ?? "";
      if (ch.choices[0]?.finish_reason) reasons.push(ch.choices[0].finish_reason);
    }
    expect(text).toBe(u.choices[0]!.text);
    expect(reasons).toEqual(["length"]);
  });

  it("max_tokens defaults to 16; echo prepends the prompt; suffix and best_of != n are refused", async () => {
    const d = await sdk.completions.create({ model: MODEL, prompt: "A", temperature: 0, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(d.usage?.completion_tokens).toBe(16);
    const plain = await sdk.completions.create({ model: MODEL, prompt: "Echo me", max_tokens: 5, temperature: 0 });
    const echoed = await sdk.completions.create({ model: MODEL, prompt: "Echo me", max_tokens: 5, temperature: 0, echo: true });
    expect(echoed.choices[0]!.text).toBe("Echo me" + plain.choices[0]!.text);
    await expect(sdk.completions.create({ model: MODEL, prompt: "x", suffix: "y" })).rejects.toMatchObject({ status: 400, param: "suffix" });
    await expect(sdk.completions.create({ model: MODEL, prompt: "x", n: 1, best_of: 2 })).rejects.toBeInstanceOf(BadRequestError);
  });

  it("a prompt list gives one choice per prompt × n, in order; each prompt's tokens counted once", async () => {
    const prompts = ["The cat", "A very different beginning"];
    const solo = await Promise.all(prompts.map((p) => sdk.completions.create({ model: MODEL, prompt: p, max_tokens: 6, temperature: 0, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming)));
    const r = await sdk.completions.create({ model: MODEL, prompt: prompts, n: 2, max_tokens: 6, temperature: 0, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(r.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    // Greedy: both choices of a prompt are that prompt's solo text.
    expect(r.choices.map((c) => c.text)).toEqual([solo[0]!.choices[0]!.text, solo[0]!.choices[0]!.text, solo[1]!.choices[0]!.text, solo[1]!.choices[0]!.text]);
    expect(r.usage?.prompt_tokens).toBe(solo[0]!.usage!.prompt_tokens + solo[1]!.usage!.prompt_tokens);
    expect(r.usage?.completion_tokens).toBe(24);
  });

  it("integer logprobs: one entry per token, tokens joined give the text, offsets advance, alternatives as asked", async () => {
    const r = await sdk.completions.create({ model: MODEL, prompt: "Hello there", max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: 2 } as OpenAI.CompletionCreateParamsNonStreaming);
    const lp = r.choices[0]!.logprobs!;
    expect(lp.tokens).toHaveLength(8);
    expect(lp.token_logprobs).toHaveLength(8);
    expect(lp.tokens!.join("")).toBe(r.choices[0]!.text);
    for (const [i, top] of lp.top_logprobs!.entries()) {
      expect(Object.keys(top).length).toBeGreaterThanOrEqual(1);
      expect(Object.keys(top).length).toBeLessThanOrEqual(2);
      // Greedy: the sampled token is the most likely one.
      expect(lp.token_logprobs![i]).toBeCloseTo(Math.max(...Object.values(top)), 5);
      expect(lp.token_logprobs![i]).toBeLessThanOrEqual(0);
    }
    expect(lp.text_offset![0]).toBe(0);
    for (let i = 1; i < 8; i++) expect(lp.text_offset![i]).toBe(lp.text_offset![i - 1]! + lp.tokens![i - 1]!.length);
  });
});

describe("responses", () => {
  it("unary: the greedy text equals the chat completion's; instructions become a system message", async () => {
    const chat = await sdk.chat.completions.create({ model: MODEL, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Say something" }], max_tokens: 10, temperature: 0 });
    const r = await sdk.responses.create({ model: MODEL, instructions: "Be brief.", input: "Say something", max_output_tokens: 10, temperature: 0 });
    expect(r.object).toBe("response");
    expect(r.id).toMatch(/^resp_/);
    expect(r.output_text).toBe(chat.choices[0]!.message.content);
    expect(r.status).toBe(chat.choices[0]!.finish_reason === "length" ? "incomplete" : "completed");
    expect(r.usage?.input_tokens).toBe(chat.usage?.prompt_tokens);
    expect(r.usage?.output_tokens).toBe(chat.usage?.completion_tokens);
    const items = await sdk.responses.create({ model: MODEL, input: [{ role: "system", content: "Be brief." }, { role: "user", content: [{ type: "input_text", text: "Say something" }] }], max_output_tokens: 10, temperature: 0 });
    expect(items.output_text).toBe(r.output_text);
  });

  it("streaming: typed events in order with consecutive sequence numbers; deltas add up to the done text and the unary text", async () => {
    const params = { model: MODEL, input: "Tell me about foxes", max_output_tokens: 12, temperature: 0 };
    const unary = await sdk.responses.create(params);
    const stream = await sdk.responses.create({ ...params, stream: true });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const ev of stream) events.push(ev);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const types = events.map((e) => e.type).filter((t) => t !== "response.output_text.delta");
    expect(types).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      unary.status === "completed" ? "response.completed" : "response.incomplete",
    ]);
    const deltas = events.flatMap((e) => (e.type === "response.output_text.delta" ? [e.delta] : []));
    expect(deltas.length).toBeGreaterThan(0);
    const done = events.find((e) => e.type === "response.output_text.done") as OpenAI.Responses.ResponseTextDoneEvent;
    expect(deltas.join("")).toBe(done.text);
    expect(done.text).toBe(unary.output_text);
  });

  it("refuses previous_response_id and store: true (no server state), and tools on a server without --tool_parser", async () => {
    for (const extra of [{ previous_response_id: "resp_1" }, { store: true }, { tools: [{ type: "function", name: "f", parameters: {}, strict: false }] }]) {
      const err = await sdk.responses.create({ model: MODEL, input: "x", ...extra } as OpenAI.Responses.ResponseCreateParamsNonStreaming).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(BadRequestError);
      expect((err as BadRequestError).param).toBe(Object.keys(extra)[0]);
    }
  });
});

describe("n = 2", () => {
  it("chat: two indexed choices in unary and stream; the same seed gives the same choices; usage sums completions", async () => {
    const body = { model: MODEL, messages: [{ role: "user" as const, content: "Pick a word" }], n: 2, max_tokens: 8, temperature: 1, seed: 42, ignore_eos: true } as OpenAI.ChatCompletionCreateParamsNonStreaming;
    const a = await sdk.chat.completions.create(body);
    const b = await sdk.chat.completions.create(body);
    expect(a.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(a.choices.map((c) => c.message.content)).toEqual(b.choices.map((c) => c.message.content));
    expect(a.usage?.completion_tokens).toBe(16);
    const stream = await sdk.chat.completions.create({ ...body, stream: true });
    const texts = ["", ""];
    const reasons: string[] = [];
    for await (const ch of stream) {
      for (const c of ch.choices) {
        texts[c.index] += c.delta.content ?? "";
        if (c.finish_reason) reasons[c.index] = c.finish_reason;
      }
    }
    expect(texts).toEqual(a.choices.map((c) => c.message.content));
    expect(reasons).toEqual(["length", "length"]);
  });

  it("a client that aborts an n=2 stream releases both children", async () => {
    const before = await waitForMetrics(server.baseUrl, gaugesAtZero);
    const controller = new AbortController();
    const stream = await sdk.chat.completions.create(
      { model: MODEL, messages: [{ role: "user", content: "go on" }], n: 2, max_tokens: 2000, temperature: 0, ignore_eos: true, stream: true } as OpenAI.ChatCompletionCreateParamsStreaming,
      { signal: controller.signal },
    );
    let content = 0;
    const finishes: string[] = [];
    // The SDK's stream iterator ends quietly when its request is aborted.
    for await (const ch of stream) {
      if (ch.choices.some((c) => c.delta.content)) content += 1;
      for (const c of ch.choices) if (c.finish_reason) finishes.push(c.finish_reason);
      if (content === 6) controller.abort();
    }
    expect(stream.controller.signal.aborted).toBe(true);
    expect(finishes).toEqual([]);
    const after = await waitForMetrics(server.baseUrl, (m) => gaugesAtZero(m) && metric(m, 'keel_requests_finished_total{finish_reason="abort"}') >= metric(before, 'keel_requests_finished_total{finish_reason="abort"}') + 2);
    expect(metric(after, 'keel_requests_finished_total{finish_reason="abort"}')).toBe(metric(before, 'keel_requests_finished_total{finish_reason="abort"}') + 2);
    expect(metric(after, 'keel_client_disconnects_total{phase="decode"}')).toBe(metric(before, 'keel_client_disconnects_total{phase="decode"}') + 1);
  });
});

describe("chat logprobs", () => {
  it("logprobs + top_logprobs: one entry per token with bytes that spell the content, greedy token the most likely", async () => {
    const r = await sdk.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "ünïcödé 🦊 please" }], max_tokens: 10, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 3 } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const content = r.choices[0]!.logprobs!.content!;
    expect(content).toHaveLength(10);
    const bytes = content.flatMap((e) => e.bytes!);
    expect(Buffer.from(bytes).toString("utf8")).toBe(r.choices[0]!.message.content);
    for (const e of content) {
      expect(e.top_logprobs.length).toBeGreaterThanOrEqual(1);
      expect(e.top_logprobs.length).toBeLessThanOrEqual(3);
      expect(e.logprob).toBeCloseTo(Math.max(...e.top_logprobs.map((t) => t.logprob)), 5);
      // token is valid text: its bytes decoded, U+FFFD where a character is incomplete.
      expect(e.token).toBe(new TextDecoder().decode(Uint8Array.from(e.bytes!)));
    }
  });
});

describe("the sampling set", () => {
  it("logit_bias -100 bans the greedy first token; stop_token_ids ends at it with reason stop", async () => {
    const base = { model: MODEL, prompt: "The answer is", max_tokens: 1, temperature: 0 } as OpenAI.CompletionCreateParamsNonStreaming;
    const first = (await sdk.completions.create(base)).choices[0]!.text;
    const ids = await tokenize(first, false);
    expect(ids).toHaveLength(1);
    const banned = await sdk.completions.create({ ...base, logit_bias: { [String(ids[0])]: -100 } });
    expect(banned.choices[0]!.text).not.toBe(first);
    const stopped = await sdk.completions.create({ ...base, max_tokens: 5, stop_token_ids: [ids[0]] } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(stopped.choices[0]!.finish_reason).toBe("stop");
    expect(stopped.usage?.completion_tokens).toBe(1);
    const bad = await post("/v1/completions", { ...base, logit_bias: { hello: 1 } });
    expect(bad.status).toBe(400);
    expect((bad.json.error as { message: string }).message).toMatch(/key 'hello' is not a token id/);
  });
});

describe("stop strings", () => {
  it("cut the text (include_stop_str_in_output keeps the stop) and release the engine request at once", async () => {
    const base = { model: MODEL, prompt: "Count with me", max_tokens: 24, temperature: 0, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming;
    const full = (await sdk.completions.create(base)).choices[0]!.text;
    // A stop string from the middle of the greedy text (skipping its first characters so the cut is not empty).
    const at = Math.max(1, Math.floor(full.length / 2));
    const stop = full.slice(at, at + 2);
    const cut = full.slice(0, full.indexOf(stop));
    const before = await waitForMetrics(server.baseUrl, gaugesAtZero);
    const long = { ...base, max_tokens: 1500, stop: [stop] };
    const r = await sdk.completions.create(long);
    expect(r.choices[0]!.text).toBe(cut);
    expect(r.choices[0]!.finish_reason).toBe("stop");
    const kept = await sdk.completions.create({ ...long, include_stop_str_in_output: true } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(kept.choices[0]!.text).toBe(cut + stop);
    // Both engine requests were aborted when the stop matched, not run to 1,500 tokens.
    const after = await waitForMetrics(server.baseUrl, (m) => gaugesAtZero(m) && metric(m, 'keel_requests_finished_total{finish_reason="stop"}') === metric(before, 'keel_requests_finished_total{finish_reason="stop"}') + 2);
    expect(metric(after, "keel_generation_tokens_total") - metric(before, "keel_generation_tokens_total")).toBeLessThan(2 * 24 + 10);
  });
});

describe("penalties, min_p and template kwargs on the real engine", () => {
  const chat = (extra: Record<string, unknown>) =>
    sdk.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: "Repeat after me: la la la la" }], max_tokens: 32, temperature: 0, ignore_eos: true, ...extra } as OpenAI.ChatCompletionCreateParamsNonStreaming);

  it("min_p 1 at temperature 1 keeps only the most likely token: the greedy text, whatever the seed", async () => {
    const greedy = (await chat({})).choices[0]!.message.content;
    for (const seed of [1, 2]) expect((await chat({ temperature: 1, min_p: 1, seed })).choices[0]!.message.content).toBe(greedy);
  });

  it("repetition, presence and frequency penalties change the greedy text", async () => {
    const greedy = (await chat({})).choices[0]!.message.content;
    for (const extra of [{ repetition_penalty: 1.8 }, { presence_penalty: 2 }, { frequency_penalty: 2 }]) {
      expect((await chat(extra)).choices[0]!.message.content, JSON.stringify(extra)).not.toBe(greedy);
    }
  });

  it("chat_template_kwargs are accepted as template variables; the template's own variables cannot be overridden", async () => {
    expect((await chat({ chat_template_kwargs: { enable_thinking: false } })).choices[0]!.finish_reason).toBe("length");
    const bad = await post("/v1/chat/completions", { model: MODEL, messages: [{ role: "user", content: "x" }], chat_template_kwargs: { add_generation_prompt: false } });
    expect(bad.status).toBe(400);
    expect((bad.json.error as { param: string }).param).toBe("chat_template_kwargs.add_generation_prompt");
  });
});

describe("tokenize, models, routes", () => {
  it("/v3/tokenize: a string, a list, add_special_tokens and max_length", async () => {
    const withSpecials = await tokenize("Hello world");
    const without = await tokenize("Hello world", false);
    expect(without.length).toBeGreaterThan(0);
    expect(withSpecials.slice(-without.length)).toEqual(without);
    const list = await post("/v3/tokenize", { model: MODEL, text: ["Hello world", "x"], max_length: 2 });
    expect(list.status).toBe(200);
    expect((list.json.tokens as number[][]).map((t) => t.length)).toEqual([Math.min(2, withSpecials.length), Math.min(2, (await tokenize("x")).length)]);
    expect((await post("/v3/tokenize", { model: MODEL, text: "x", pad_to_max_length: true })).status).toBe(400);
    // Padding under its other name is refused too, not accepted and ignored.
    const padded = await post("/v3/tokenize", { model: MODEL, text: "x", padding: true });
    expect(padded.status).toBe(400);
    expect((padded.json.error as { param: string }).param).toBe("padding");
    expect((await post("/v3/tokenize", { model: MODEL, text: "x", padding: false })).status).toBe(200);
    // Text far beyond what the context could hold is refused at the door instead of stalling the engine.
    const huge = await post("/v3/tokenize", { model: MODEL, text: "x".repeat(2_000_000) });
    expect(huge.status).toBe(400);
    expect((huge.json.error as { param: string }).param).toBe("text");
  });

  it("models.retrieve finds the served model and answers 404 model_not_found for another", async () => {
    expect((await sdk.models.retrieve(MODEL)).id).toBe(MODEL);
    const err = await sdk.models.retrieve("gpt-9").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NotFoundError);
    expect((err as NotFoundError).code).toBe("model_not_found");
  });

  it("an unknown route answers a short 404; a known path with another method a 405 with Allow", async () => {
    const r = await get(server.baseUrl, "/v3/embeddings");
    expect(r.status).toBe(404);
    const msg = (JSON.parse(r.body) as { error: { code: string; message: string } }).error;
    expect(msg.code).toBe("route_not_found");
    expect(msg.message.length).toBeLessThan(160);
    const wrong = await fetch(`${server.baseUrl}/v3/chat/completions`);
    expect(wrong.status).toBe(405);
    expect(wrong.headers.get("allow")).toBe("POST");
    expect(((await wrong.json()) as { error: { code: string } }).error.code).toBe("method_not_allowed");
  });
});

describe("HTTP/1.1 pipelining", () => {
  it("two requests written back to back on one socket are both answered, neither counted as a disconnect", async () => {
    const before = await waitForMetrics(server.baseUrl, gaugesAtZero);
    const body = JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "pipelined" }], max_tokens: 6, temperature: 0, ignore_eos: true });
    const request = `POST /v3/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    const socket = net.connect(server.port, "127.0.0.1");
    let received = "";
    socket.setEncoding("utf8");
    const answered = new Promise<void>((resolve, reject) => {
      socket.on("data", (d: string) => {
        received += d;
        if ((received.match(/"object":"chat\.completion"/g) ?? []).length === 2) resolve();
      });
      socket.on("close", () => reject(new Error(`socket closed after: ${received}`)));
    });
    answered.catch(() => undefined); // awaited below; a failing assertion first must not leave it unhandled
    socket.write(request + request);
    // Both requests end on the server — served to their length, or (the defect) the second taken for a disconnect
    // and aborted — before anything is asserted, so a regression fails here at once instead of hanging.
    const ended = (m: Map<string, number>) =>
      metric(m, 'keel_requests_finished_total{finish_reason="length"}') + metric(m, 'keel_requests_finished_total{finish_reason="abort"}') >=
      metric(before, 'keel_requests_finished_total{finish_reason="length"}') + metric(before, 'keel_requests_finished_total{finish_reason="abort"}') + 2;
    const after = await waitForMetrics(server.baseUrl, (m) => ended(m) && gaugesAtZero(m));
    for (const phase of ["queued", "prefill", "decode"]) {
      expect(metric(after, `keel_client_disconnects_total{phase="${phase}"}`)).toBe(metric(before, `keel_client_disconnects_total{phase="${phase}"}`));
    }
    expect(metric(after, 'keel_requests_finished_total{finish_reason="length"}')).toBe(metric(before, 'keel_requests_finished_total{finish_reason="length"}') + 2);
    await answered;
    socket.destroy();
    expect(received.match(/HTTP\/1\.1 200 OK/g)).toHaveLength(2);
  });

  it("a connection that closes with pipelined requests still queued behind a stream releases every one of them", async () => {
    const before = await waitForMetrics(server.baseUrl, gaugesAtZero);
    const long = (stream: boolean) => {
      const body = JSON.stringify({ model: MODEL, prompt: "pipelined and left", max_tokens: 1000, temperature: 0, ignore_eos: true, stream });
      return `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    };
    const socket = net.connect(server.port, "127.0.0.1");
    socket.on("error", () => undefined);
    await new Promise<void>((r) => socket.once("connect", () => r()));
    // A stream first, then two unary requests queued behind it on the same connection.
    socket.write(long(true) + long(false) + long(false));
    // All three are in the engine (the later two started generating although their answers must wait).
    await waitForMetrics(server.baseUrl, (m) => metric(m, "keel_requests_running") + metric(m, "keel_requests_waiting") >= 3);
    socket.destroy();
    const after = await waitForMetrics(server.baseUrl, gaugesAtZero);
    expect(metric(after, 'keel_requests_finished_total{finish_reason="abort"}')).toBe(metric(before, 'keel_requests_finished_total{finish_reason="abort"}') + 3);
  });
});
