/**
 * The official OpenAI Node SDK (`openai` v6) against the real server: unary and streaming chat on `/v3` and `/v1`,
 * `stream_options.include_usage`, streamed text equal to unary text (greedy), a stream aborted mid-way with an
 * AbortController (the server counts one disconnect, frees everything and stays ready), and Keel's error envelope
 * parsed by the SDK into its own error classes (400, 404, 429).
 */
import OpenAI, { APIUserAbortError, BadRequestError, NotFoundError, RateLimitError } from "openai";
import type { ChatCompletionChunk, ChatCompletionCreateParamsNonStreaming, ChatCompletionCreateParamsStreaming } from "openai/resources/chat/completions";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { get, metrics, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

const MODEL = "keel-tiny";
let server: ServerHandle;

beforeAll(async () => {
  server = await startServer(["--max_num_seqs", "4", "--max_num_batched_tokens", "64"]);
});
afterAll(async () => {
  await server?.stop();
});

/** An SDK client for `baseUrl + prefix` that never retries (every attempt is visible in the server's metrics). */
function client(baseUrl: string, prefix = "/v3"): OpenAI {
  return new OpenAI({ baseURL: baseUrl + prefix, apiKey: "keel-test", maxRetries: 0, timeout: 60_000 });
}

/** Greedy request; `ignore_eos` is a Keel (vLLM/OVMS) extension the SDK passes through untouched. */
function unary(content: string, maxTokens: number, extra: Record<string, unknown> = {}): ChatCompletionCreateParamsNonStreaming {
  return { model: MODEL, messages: [{ role: "user", content }], max_tokens: maxTokens, temperature: 0, ignore_eos: true, ...extra } as ChatCompletionCreateParamsNonStreaming;
}
function streaming(content: string, maxTokens: number, extra: Record<string, unknown> = {}): ChatCompletionCreateParamsStreaming {
  return { ...unary(content, maxTokens), stream: true, ...extra } as ChatCompletionCreateParamsStreaming;
}

const gauges = ["keel_requests_running", "keel_requests_waiting", "keel_engine_sequences_active"];
const gaugesAtZero = (m: Map<string, number>): boolean => gauges.every((g) => m.get(g) === 0);
const disconnects = (m: Map<string, number>): number =>
  ["queued", "prefill", "decode"].reduce((s, p) => s + (m.get(`keel_client_disconnects_total{phase="${p}"}`) ?? NaN), 0);

describe("openai-node SDK: chat completions", () => {
  it("lists the served model", async () => {
    const page = await client(server.baseUrl).models.list();
    expect(page.data.map((m) => m.id)).toEqual([MODEL]);
  });

  for (const prefix of ["/v3", "/v1"]) {
    it(`${prefix}: unary and streaming give the same greedy text; include_usage puts usage in the last chunk only`, async () => {
      const sdk = client(server.baseUrl, prefix);
      for (const content of ["Tell me a story", "ünïcödé 🦊 and 日本語"]) {
        const u = await sdk.chat.completions.create(unary(content, 48));
        expect(u.object).toBe("chat.completion");
        expect(u.id).toMatch(/^chatcmpl-/);
        expect(u.model).toBe(MODEL);
        expect(u.choices).toHaveLength(1);
        expect(u.choices[0]!.message.role).toBe("assistant");
        expect(u.choices[0]!.finish_reason).toBe("length");
        expect(u.usage?.completion_tokens).toBe(48);
        expect(u.usage?.total_tokens).toBe(u.usage!.prompt_tokens + 48);
        const text = u.choices[0]!.message.content ?? "";
        expect(text.length).toBeGreaterThan(0);

        const chunks: ChatCompletionChunk[] = [];
        const stream = await sdk.chat.completions.create(streaming(content, 48, { stream_options: { include_usage: true } }));
        for await (const c of stream) chunks.push(c);
        expect(chunks.length).toBeGreaterThan(3);
        expect(new Set(chunks.map((c) => c.id)).size).toBe(1);
        expect(chunks.every((c) => c.object === "chat.completion.chunk")).toBe(true);
        expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant");
        const streamed = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
        expect(streamed).toBe(text);
        // Usage: null on every chunk but the last, which has no choices and the unary usage.
        const last = chunks.at(-1)!;
        expect(last.choices).toEqual([]);
        expect(last.usage).toEqual(u.usage);
        expect(chunks.slice(0, -1).every((c) => c.usage === null)).toBe(true);
        expect(chunks.at(-2)!.choices[0]!.finish_reason).toBe("length");
      }
    });
  }

  it("the SDK's stream helper assembles the same message as the unary call, and without include_usage no chunk has usage", async () => {
    const sdk = client(server.baseUrl);
    const u = await sdk.chat.completions.create(unary("Once upon a time", 32));
    const helper = sdk.chat.completions.stream(streaming("Once upon a time", 32));
    const seen: ChatCompletionChunk[] = [];
    helper.on("chunk", (c) => seen.push(c));
    const final = await helper.finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe(u.choices[0]!.message.content);
    expect(final.choices[0]!.finish_reason).toBe("length");
    expect(seen.length).toBeGreaterThan(3);
    expect(seen.every((c) => !("usage" in c) || c.usage == null)).toBe(true);
  });

  it("aborting a stream mid-way with an AbortController: one disconnect, gauges back to 0, the server stays ready", async () => {
    const sdk = client(server.baseUrl);
    const before = await waitForMetrics(server.baseUrl, gaugesAtZero);
    const ac = new AbortController();
    const stream = await sdk.chat.completions.create(streaming("keep going for a long time", 2000), { signal: ac.signal });
    let contentChunks = 0;
    let finishReason: string | null = null;
    // The SDK's stream iterator ends quietly when its request is aborted.
    for await (const c of stream) {
      if (c.choices[0]?.delta.content) contentChunks += 1;
      finishReason ??= c.choices[0]?.finish_reason ?? null;
      if (contentChunks === 5) ac.abort();
    }
    expect(stream.controller.signal.aborted).toBe(true);
    // Chunks already buffered when abort() ran may still be yielded; the stream never reached its end.
    expect(contentChunks).toBeGreaterThanOrEqual(5);
    expect(finishReason).toBeNull();

    const after = await waitForMetrics(
      server.baseUrl,
      (m) => gaugesAtZero(m) && m.get('keel_requests_finished_total{finish_reason="abort"}') === before.get('keel_requests_finished_total{finish_reason="abort"}')! + 1,
    );
    expect(disconnects(after)).toBe(disconnects(before) + 1);
    expect(after.get('keel_client_disconnects_total{phase="decode"}')).toBe(before.get('keel_client_disconnects_total{phase="decode"}')! + 1);
    expect(after.get('keel_requests_finished_total{finish_reason="length"}')).toBe(before.get('keel_requests_finished_total{finish_reason="length"}'));
    expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
    const ok = await sdk.chat.completions.create(unary("still there?", 4));
    expect(ok.choices[0]!.finish_reason).toBe("length");
  });
});

describe("openai-node SDK: errors become the SDK's error classes", () => {
  it("temperature 7 → BadRequestError 400 with param and code, unary and stream alike", async () => {
    const sdk = client(server.baseUrl);
    for (const params of [unary("x", 4, { temperature: 7 }), streaming("x", 4, { temperature: 7 })]) {
      const err = await sdk.chat.completions.create(params as ChatCompletionCreateParamsNonStreaming).then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(BadRequestError);
      const e = err as BadRequestError;
      expect(e.status).toBe(400);
      expect(e.param).toBe("temperature");
      expect(e.code).toBe("invalid_value");
      expect(e.type).toBe("invalid_request_error");
      expect(e.message).toContain("temperature");
    }
  });

  it("an unknown model → NotFoundError 404 model_not_found", async () => {
    const err = await client(server.baseUrl, "/v1")
      .chat.completions.create({ ...unary("x", 4), model: "gpt-9" })
      .then(
        () => null,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(NotFoundError);
    expect((err as NotFoundError).status).toBe(404);
    expect((err as NotFoundError).code).toBe("model_not_found");
    expect((err as NotFoundError).param).toBe("model");
  });

  it("queue full → RateLimitError 429 queue_full with Retry-After, tried exactly once (maxRetries 0)", async () => {
    const s = await startServer(["--max_num_seqs", "1", "--max_num_batched_tokens", "8", "--max_queued_requests", "1"]);
    const acs: AbortController[] = [];
    try {
      const sdk = client(s.baseUrl);
      const running = new AbortController();
      acs.push(running);
      const first = await sdk.chat.completions.create(streaming("the long one", 2000), { signal: running.signal });
      await waitForMetrics(s.baseUrl, (m) => m.get("keel_requests_running") === 1);
      // The second waits for the only sequence; create() settles only when its headers come, so it is not awaited.
      const queuedAc = new AbortController();
      acs.push(queuedAc);
      const queued = sdk.chat.completions.create(streaming("the waiting one", 2000), { signal: queuedAc.signal }).catch((e: unknown) => e);
      await waitForMetrics(s.baseUrl, (m) => m.get("keel_requests_waiting") === 1);

      const err = await sdk.chat.completions.create(unary("one too many", 4)).then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(RateLimitError);
      const e = err as RateLimitError;
      expect(e.status).toBe(429);
      expect(e.code).toBe("queue_full");
      expect(e.type).toBe("rate_limit_error");
      expect(e.headers.get("retry-after")).toBe("1");
      expect((await metrics(s.baseUrl)).get('keel_requests_rejected_total{reason="queue_full"}')).toBe(1);

      queuedAc.abort();
      running.abort();
      expect(await queued).toBeInstanceOf(APIUserAbortError);
      let finished = false;
      for await (const c of first) if (c.choices[0]?.finish_reason) finished = true;
      expect(finished).toBe(false);
      await waitForMetrics(s.baseUrl, gaugesAtZero);
      const ok = await sdk.chat.completions.create(unary("room again", 4));
      expect(ok.choices[0]!.finish_reason).toBe("length");
    } finally {
      acs.forEach((a) => a.abort());
      await s.stop();
    }
  });

  it("--max_num_seqs 1 --max_queued_requests 0: a request on an idle server is served, a second one while it runs → RateLimitError", async () => {
    const s = await startServer(["--max_num_seqs", "1", "--max_queued_requests", "0"]);
    const running = new AbortController();
    try {
      const sdk = client(s.baseUrl);
      // No request waits here: the only sequence is free, so this one must be admitted, not refused.
      const first = await sdk.chat.completions.create(streaming("the long one", 2000), { signal: running.signal }).then(
        (stream) => ({ stream, status: 200 }),
        (e: unknown) => ({ stream: null, status: (e as { status?: number }).status ?? -1 }),
      );
      expect(first.status, "the first request on an idle server with a free sequence was refused").toBe(200);
      await waitForMetrics(s.baseUrl, (m) => m.get("keel_requests_running") === 1);

      const err = await sdk.chat.completions.create(unary("one too many", 4)).then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(RateLimitError);
      expect((err as RateLimitError).status).toBe(429);
      expect((err as RateLimitError).code).toBe("queue_full");
      expect((await metrics(s.baseUrl)).get('keel_requests_rejected_total{reason="queue_full"}')).toBe(1);
      running.abort();
      await waitForMetrics(s.baseUrl, gaugesAtZero);
    } finally {
      running.abort();
      await s.stop();
    }
  });
});
