/**
 * The HTTP surface against the real server and embedded model: routes, OpenAI response shapes, streaming vs unary
 * text equality (UTF-8 held back, never thrown on), stop strings, usage, and OpenAI-shaped 4xx errors.
 */
import http from "node:http";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chat } from "../support/chat-client.js";
import { get, metrics, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

let server: ServerHandle;

beforeAll(async () => {
  server = await startServer(["--max_num_seqs", "4", "--max_num_batched_tokens", "64"]);
});
afterAll(async () => {
  await server?.stop();
});

const base = { model: "keel-tiny", temperature: 0, ignore_eos: true };

function post(path: string, raw: string | Buffer, headers: Record<string, string> = { "content-type": "application/json" }): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(server.baseUrl + path, { method: "POST", headers: { ...headers, "content-length": Buffer.byteLength(raw) } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end(raw);
  });
}

/**
 * Write one chat request on a raw socket and send a FIN after it: `close` false keeps reading (a half-close), true
 * closes the socket at once (a client that left: the FIN is all the server sees until it writes). Resolves with every
 * byte the server sent until the connection closed.
 */
function finAfterChat(body: Record<string, unknown>, close: boolean): Promise<string> {
  return new Promise((resolve) => {
    const sock = net.connect(server.port, "127.0.0.1");
    let got = "";
    sock.on("data", (d) => (got += d.toString("utf8")));
    sock.on("error", () => undefined);
    sock.on("close", () => resolve(got));
    const payload = JSON.stringify(body);
    sock.end(`POST /v3/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`, () => {
      if (close) sock.destroy();
    });
  });
}

describe("a client's FIN after a complete request (docs/operations.md, \"Clients that leave\")", () => {
  // HTTP/1.1 lets a client half-close and read its answer; most clients that leave also just send a FIN. The server
  // tells them apart by writing: `100 Continue` probes before the answer starts (a departed client's kernel resets
  // the connection), the stream's own events after. Node's httpAllowHalfOpen switch is what lets the FIN through
  // without aborting the request (docs/upstream.md): these tests pin it.
  const disconnects = (m: Map<string, number>): number => ["queued", "prefill", "decode"].reduce((a, p) => a + (m.get(`keel_client_disconnects_total{phase="${p}"}`) ?? 0), 0);
  const idle = (m: Map<string, number>): boolean => m.get("keel_requests_running") === 0 && m.get("keel_requests_waiting") === 0 && m.get("keel_engine_sequences_active") === 0;
  for (const stream of [false, true]) {
    it(`${stream ? "streaming" : "unary"}: a half-closed client gets its whole answer and is not counted as a disconnect`, async () => {
      const before = await metrics(server.baseUrl);
      const got = await finAfterChat({ ...base, messages: [{ role: "user", content: "half-closed" }], max_tokens: 12, ignore_eos: true, stream }, false);
      expect(got).toMatch(/^(HTTP\/1\.1 100 Continue\r\n\r\n)*HTTP\/1\.1 200 OK\r\n/);
      if (stream) expect(got).toContain("data: [DONE]");
      else expect(got).toContain('"finish_reason":"length"');
      const after = await waitForMetrics(server.baseUrl, idle);
      expect(disconnects(after)).toBe(disconnects(before));
      expect(after.get('keel_requests_finished_total{finish_reason="length"}')).toBe(before.get('keel_requests_finished_total{finish_reason="length"}')! + 1);
    });
    it(`${stream ? "streaming" : "unary"}: a client that closed after its FIN is found gone by the probe — aborted, not generated to the end`, async () => {
      const before = await metrics(server.baseUrl);
      await finAfterChat({ ...base, messages: [{ role: "user", content: "left after the FIN" }], max_tokens: 1500, ignore_eos: true, stream }, true);
      const after = await waitForMetrics(server.baseUrl, (m) => idle(m) && disconnects(m) > disconnects(before));
      expect(disconnects(after)).toBe(disconnects(before) + 1);
      expect(after.get('keel_requests_finished_total{finish_reason="abort"}')).toBe(before.get('keel_requests_finished_total{finish_reason="abort"}')! + 1);
      expect(after.get('keel_requests_finished_total{finish_reason="length"}')).toBe(before.get('keel_requests_finished_total{finish_reason="length"}'));
    });
  }
});

describe("routes", () => {
  it("serves the model list on /v3/models, /v3/v1/models and /v1/models", async () => {
    for (const p of ["/v3/models", "/v3/v1/models", "/v1/models"]) {
      const r = await get(server.baseUrl, p);
      expect(r.status).toBe(200);
      const j = JSON.parse(r.body) as { object: string; data: { id: string; object: string }[] };
      expect(j.object).toBe("list");
      expect(j.data.map((d) => d.id)).toEqual(["keel-tiny"]);
    }
  });

  it("answers health live/ready and exposes every required metric at start", async () => {
    expect((await get(server.baseUrl, "/v2/health/live")).status).toBe(200);
    expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
    expect((await get(server.baseUrl, "/health")).status).toBe(200); // vLLM's and llama-server's probe path
    const m = await metrics(server.baseUrl);
    for (const name of [
      "keel_requests_running",
      "keel_requests_waiting",
      "keel_engine_sequences_active",
      "keel_engine_steps_total",
      'keel_client_disconnects_total{phase="queued"}',
      'keel_client_disconnects_total{phase="prefill"}',
      'keel_client_disconnects_total{phase="decode"}',
      'keel_requests_finished_total{finish_reason="stop"}',
      'keel_requests_finished_total{finish_reason="length"}',
    ]) {
      expect(m.has(name), name).toBe(true);
    }
  });

  it("chat completions answer on all three paths", async () => {
    for (const p of ["/v3/chat/completions", "/v3/v1/chat/completions", "/v1/chat/completions"]) {
      const r = await chat(server.baseUrl, { ...base, messages: [{ role: "user", content: "hi" }], max_tokens: 3 }, {}, p);
      expect(r.status).toBe(200);
      expect(r.finishReason).toBe("length");
    }
  });

  it("unknown routes are an OpenAI-shaped 404", async () => {
    const r = await get(server.baseUrl, "/v3/nope");
    expect(r.status).toBe(404);
    expect(JSON.parse(r.body).error.type).toBe("invalid_request_error");
  });

  it("GET /v2/models/{served name} without /ready is a route_not_found 404, not 'the model does not exist' (the breaker's finding)", async () => {
    for (const p of ["/v2/models/keel-tiny", "/v2/models/keel-tiny/versions/1", "/v2/models/nope"]) {
      const r = await get(server.baseUrl, p);
      expect(r.status, p).toBe(404);
      const e = (JSON.parse(r.body) as { error: { code: string; message: string } }).error;
      expect(e.code, p).toBe("route_not_found");
      expect(e.message, p).not.toMatch(/does not exist/);
      expect(e.message, p).toContain("No route for");
    }
    expect((await get(server.baseUrl, "/v2/models/keel-tiny/ready")).status).toBe(200);
  });

  it("garbage after a streaming request on the same connection never writes a raw error into the stream", async () => {
    const net = await import("node:net");
    const sock = net.connect(server.port, "127.0.0.1");
    sock.on("error", () => undefined);
    await new Promise<void>((r) => sock.once("connect", () => r()));
    const body = JSON.stringify({ ...base, messages: [{ role: "user", content: "then garbage" }], max_tokens: 400, stream: true });
    let data = "";
    const closed = new Promise<void>((r) => sock.once("close", () => r()));
    let sentGarbage = false;
    sock.on("data", (d) => {
      data += d.toString();
      // Once the stream is flowing, the same connection sends something that is not HTTP.
      if (!sentGarbage && data.includes("chat.completion.chunk")) {
        sentGarbage = true;
        sock.write("GARBAGE\r\n\r\n");
      }
    });
    sock.write(`POST /v3/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    await closed;
    expect(sentGarbage).toBe(true);
    expect(data.match(/HTTP\/1\.1 /g)).toHaveLength(1);
    const { waitForMetrics } = await import("../support/server.js");
    await waitForMetrics(server.baseUrl, (m) => m.get("keel_requests_running") === 0 && m.get("keel_requests_waiting") === 0);
  });

  it("a URL that does not decode and a request that is not HTTP get OpenAI-shaped 400s", async () => {
    const bad = await get(server.baseUrl, "/v1/models/%zz");
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.body).error.code).toBe("invalid_url");
    const net = await import("node:net");
    const sock = net.connect(server.port, "127.0.0.1");
    const reply = new Promise<string>((resolve) => {
      let data = "";
      sock.on("data", (d) => (data += d.toString()));
      sock.once("close", () => resolve(data));
    });
    sock.on("error", () => undefined);
    sock.write("GARBAGE\r\n\r\n");
    const text = await reply;
    expect(text.startsWith("HTTP/1.1 400")).toBe(true);
    expect(JSON.parse(text.slice(text.indexOf("\r\n\r\n") + 4)).error.code).toBe("malformed_request");
    expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
  });
});

describe("request metrics", () => {
  it("counters and latency histograms account for each request", async () => {
    const before = await metrics(server.baseUrl);
    const r = await chat(server.baseUrl, { ...base, messages: [{ role: "user", content: "count me" }], max_tokens: 10, stream: true, stream_options: { include_usage: true } });
    const usage = (r.events.at(-1) as { usage: { prompt_tokens: number; completion_tokens: number } }).usage;
    const after = await metrics(server.baseUrl);
    const d = (k: string) => after.get(k)! - before.get(k)!;
    expect(d("keel_requests_queued_total")).toBe(1);
    expect(d("keel_prompt_tokens_total")).toBe(usage.prompt_tokens);
    expect(d("keel_generation_tokens_total")).toBe(10);
    expect(d("keel_time_to_first_token_seconds_count")).toBe(1);
    expect(d("keel_request_queue_time_seconds_count")).toBe(1);
    expect(d("keel_e2e_request_latency_seconds_count")).toBe(1);
    expect(d("keel_inter_token_latency_seconds_count")).toBe(9);
  });
});

describe("chat completion shapes", () => {
  it("unary: chat.completion with id, message, finish_reason and usage", async () => {
    const r = await chat(server.baseUrl, { ...base, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 12 });
    const j = r.body as Record<string, any>;
    expect(j.object).toBe("chat.completion");
    expect(j.id).toMatch(/^chatcmpl-/);
    expect(j.model).toBe("keel-tiny");
    expect(j.choices[0].message.role).toBe("assistant");
    expect(j.choices[0].finish_reason).toBe("length");
    expect(j.usage.completion_tokens).toBe(12);
    expect(j.usage.prompt_tokens).toBeGreaterThan(5);
    expect(j.usage.total_tokens).toBe(j.usage.prompt_tokens + 12);
  });

  it("streaming: role chunk, content chunks, final finish_reason chunk, usage chunk, [DONE]; deltas equal the unary text", async () => {
    for (const content of ["Tell me a story", "ünïcödé 🦊 and 日本語", "{\"json\": [1, 2, 3]}"]) {
      const req = { ...base, messages: [{ role: "user", content }], max_tokens: 64 };
      const unary = await chat(server.baseUrl, req);
      const stream = await chat(server.baseUrl, { ...req, stream: true, stream_options: { include_usage: true } });
      expect(stream.done).toBe(true);
      expect(stream.text).toBe(unary.text);
      const first = stream.events[0] as any;
      expect(first.object).toBe("chat.completion.chunk");
      expect(first.choices[0].delta.role).toBe("assistant");
      const last = stream.events.at(-1) as any;
      expect(last.choices).toEqual([]);
      expect(last.usage).toEqual((unary.body as any).usage);
      const final = stream.events.at(-2) as any;
      expect(final.choices[0].finish_reason).toBe("length");
      expect(new Set(stream.events.map((e) => e["id"])).size).toBe(1);
      // JSON never carries a lone surrogate: every chunk re-serialises to valid UTF-8.
      expect(Buffer.from(stream.text, "utf8").toString("utf8")).toBe(stream.text);
    }
  });

  it("a stop string ends the text before it with finish_reason stop, stream and unary alike", async () => {
    const req = { ...base, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 40 };
    const full = (await chat(server.baseUrl, req)).text;
    const stop = full.slice(10, 13);
    expect(stop.length).toBe(3);
    const expected = full.slice(0, full.indexOf(stop));
    const unary = await chat(server.baseUrl, { ...req, stop: [stop] });
    expect(unary.text).toBe(expected);
    expect(unary.finishReason).toBe("stop");
    const stream = await chat(server.baseUrl, { ...req, stop, stream: true });
    expect(stream.text).toBe(expected);
    expect(stream.finishReason).toBe("stop");
    expect(stream.done).toBe(true);
  });

  it("seeded sampling is reproducible and differs from greedy", async () => {
    const req = { model: "keel-tiny", messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 24, temperature: 1.5, seed: 42 };
    const a = await chat(server.baseUrl, req);
    const b = await chat(server.baseUrl, req);
    const g = await chat(server.baseUrl, { ...req, temperature: 0 });
    expect(a.text).toBe(b.text);
    expect(a.text).not.toBe(g.text);
  });
});

describe("errors are OpenAI-shaped 4xx", () => {
  it("invalid JSON → 400 invalid_json (not OVMS's 412)", async () => {
    const r = await post("/v3/chat/completions", "{not json");
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error.code).toBe("invalid_json");
  });

  it("a body nested thousands deep → 400 (was a stack overflow: 500)", async () => {
    const deep = (n: number) => "[".repeat(n) + "]".repeat(n);
    // Written as text: the test's own JSON.stringify would overflow on it too.
    const tool = `{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": ${deep(5000)}}}}}`;
    const body = `{"model": "keel-tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [${tool}], "max_tokens": 2}`;
    const r = await post("/v3/chat/completions", body);
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error).toMatchObject({ code: "invalid_json", message: expect.stringContaining("deeper than 256") });
  });

  it("a body that is not valid UTF-8 → 400", async () => {
    const r = await post("/v3/chat/completions", Buffer.from([0x7b, 0x22, 0xff, 0xfe, 0x22, 0x7d]));
    expect(r.status).toBe(400);
  });

  it("a lone UTF-16 surrogate anywhere in the body → 400 naming the field, in each API's envelope; a pair is a character", async () => {
    // JSON.stringify writes a lone surrogate as the escape "\ud800" (well-formed JSON, not a Unicode character).
    const chat = await post("/v3/chat/completions", JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "a\ud800b" }], max_tokens: 2 }));
    expect(chat.status).toBe(400);
    expect(JSON.parse(chat.body).error).toMatchObject({ code: "invalid_value", param: "messages[0].content" });
    const stop = await post("/v3/completions", JSON.stringify({ model: "keel-tiny", prompt: "x", stop: ["ok", "\udc00"], max_tokens: 2 }));
    expect(JSON.parse(stop.body).error).toMatchObject({ code: "invalid_value", param: "stop[1]" });
    const anthropic = await post("/v1/messages", JSON.stringify({ model: "keel-tiny", max_tokens: 2, messages: [{ role: "user", content: "\ud83d" }] }));
    expect(anthropic.status).toBe(400);
    expect(JSON.parse(anthropic.body)).toMatchObject({ type: "error", error: { type: "invalid_request_error" } });
    const pair = await post("/v3/chat/completions", JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "\ud83d\ude00" }], max_tokens: 2 }));
    expect(pair.status).toBe(200);
    // A route that does not exist is a 404 whatever the body holds (a bad body included).
    for (const bad of [JSON.stringify({ a: "\ud800" }), "{not json"]) expect(JSON.parse((await post("/v3/nonexistent", bad)).body).error.code).toBe("route_not_found");
  });

  it("unknown model → 404 model_not_found", async () => {
    const r = await post("/v3/chat/completions", JSON.stringify({ model: "gpt-9", messages: [{ role: "user", content: "x" }] }));
    expect(r.status).toBe(404);
    expect(JSON.parse(r.body).error.code).toBe("model_not_found");
  });

  it("validation errors name the field", async () => {
    const r = await post("/v3/chat/completions", JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "x" }], temperature: 7 }));
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error.param).toBe("temperature");
  });

  it("a prompt longer than the context → 400 context_length_exceeded naming each API's prompt field, stream or not", async () => {
    const content = "word ".repeat(6000);
    const routes = [
      ["/v3/chat/completions", { messages: [{ role: "user", content }] }, "messages"],
      ["/v3/completions", { prompt: content }, "prompt"],
      ["/v3/responses", { input: content }, "input"],
    ] as const;
    for (const [route, fields, param] of routes) {
      for (const stream of [false, true]) {
        const r = await post(route, JSON.stringify({ model: "keel-tiny", ...fields, stream }));
        expect(r.status, route).toBe(400);
        const error = (JSON.parse(r.body) as { error: { code: string; param: string; message: string } }).error;
        expect([error.code, error.param], route).toEqual(["context_length_exceeded", param]);
        expect(error.message).toMatch(new RegExp(`your ${param} resulted in (at least )?\\d+ tokens\\. Please reduce the length of the ${param} or completion\\.$`));
      }
    }
  });

  it("a prompt of 80,000 special markers or 20,000 messages is refused at once and the server stays ready", async () => {
    // llama.cpp's special-token pass is quadratic in markers: tokenizing these would stall the engine for tens
    // of seconds; the engine's lower bound refuses them before tokenizing.
    const markers = await post("/v3/chat/completions", JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "<|im_end|>".repeat(80_000) }] }));
    expect(markers.status).toBe(400);
    expect(JSON.parse(markers.body).error.code).toBe("context_length_exceeded");
    const many = await post("/v3/chat/completions", JSON.stringify({ model: "keel-tiny", messages: Array.from({ length: 20_000 }, () => ({ role: "user", content: "" })) }));
    expect(many.status).toBe(400);
    expect(JSON.parse(many.body).error.code).toBe("context_length_exceeded");
    expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
    const ok = await chat(server.baseUrl, { ...base, messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
    expect(ok.status).toBe(200);
  });

  it("a 10 MB message → 413 over the default 8 MiB body limit; the server keeps serving", async () => {
    // The server answers 413 from the Content-Length alone and closes; a client still writing the 10 MB body may
    // then see EPIPE/RST before it reads the answer. So send the headers, read the answer, then stop.
    const net = await import("node:net");
    const sock = net.connect(server.port, "127.0.0.1");
    const reply = await new Promise<string>((resolve) => {
      let data = "";
      sock.on("data", (d) => {
        data += d.toString();
        if (data.includes("\r\n\r\n") && data.includes("}}")) resolve(data);
      });
      sock.on("error", () => resolve(data));
      sock.on("close", () => resolve(data));
      sock.write(`POST /v3/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${10 * 1024 * 1024 + 64}\r\n\r\n`);
      sock.write(`{"model":"keel-tiny","messages":[{"role":"user","content":"` + "x".repeat(64 * 1024));
    });
    sock.destroy();
    expect(reply.startsWith("HTTP/1.1 413")).toBe(true);
    expect(JSON.parse(reply.slice(reply.indexOf("\r\n\r\n") + 4)).error.code).toBe("request_too_large");
    const ok = await chat(server.baseUrl, { ...base, messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
    expect(ok.status).toBe(200);
  });

  it("prompt + max_tokens over the capacity → 400 before queueing", async () => {
    const r = await post("/v3/chat/completions", JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 5000 }));
    expect(r.status).toBe(400);
    expect(JSON.parse(r.body).error.code).toBe("context_length_exceeded");
  });
});

describe("slow clients", () => {
  it("a client that sends headers and then nothing is dropped after --request_timeout, without blocking anyone", async () => {
    const s = await startServer(["--request_timeout", "1"]);
    try {
      const net = await import("node:net");
      const sock = net.connect(s.port, "127.0.0.1");
      await new Promise<void>((r) => sock.once("connect", () => r()));
      // A request line and part of the headers; never the rest.
      sock.write("POST /v3/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n");
      const closed = new Promise<string>((resolve) => {
        let data = "";
        sock.on("data", (d) => (data += d.toString()));
        sock.once("close", () => resolve(data));
      });
      // Meanwhile another client is served normally.
      const ok = await chat(s.baseUrl, { ...base, messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
      expect(ok.status).toBe(200);
      const reply = await closed;
      expect(reply === "" || reply.startsWith("HTTP/1.1 408")).toBe(true);
      expect((await get(s.baseUrl, "/v2/health/live")).status).toBe(200);
    } finally {
      await s.stop();
    }
  });

  it("a body not sent within --request_timeout gets a 408 in the OpenAI error envelope", async () => {
    const s = await startServer(["--request_timeout", "1"]);
    try {
      const net = await import("node:net");
      const sock = net.connect(s.port, "127.0.0.1");
      await new Promise<void>((r) => sock.once("connect", () => r()));
      const closed = new Promise<string>((resolve) => {
        let data = "";
        sock.on("data", (d) => (data += d.toString()));
        sock.once("close", () => resolve(data));
      });
      // Whole headers, one byte of a 100-byte body, then nothing.
      sock.write("POST /v3/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{");
      const reply = await closed;
      expect(reply.startsWith("HTTP/1.1 408")).toBe(true);
      const body = JSON.parse(reply.slice(reply.indexOf("\r\n\r\n") + 4)) as { error: { code: string; type: string; message: string } };
      expect(body.error.code).toBe("request_timeout");
      expect(body.error.type).toBe("invalid_request_error");
      expect((await get(s.baseUrl, "/v2/health/live")).status).toBe(200);
    } finally {
      await s.stop();
    }
  });
});
