/**
 * Prompt-lookup decoding through the whole server on a real model (Qwen2.5-Coder-0.5B): `--prompt_lookup true` turns
 * it on for requests that say nothing, `num_assistant_tokens: 0` turns it off for one request. Streamed greedy chats
 * on an edit-this-file prompt give the same text, finish reason and usage either way, max_tokens is kept exactly
 * while a step delivers several tokens, a stop string cuts the text at the same place, the draft counters move on
 * /metrics, a field out of range is a 400, and so is the request's own speculation with logprobs or a guide. Few and short: the shared cores make each answer take a while.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { realModelPath } from "../support/real-models.js";
import { startServer, type ServerHandle } from "../support/server.js";

let server: ServerHandle;
const SLOW = 480_000;

beforeAll(async () => {
  server = await startServer(["--model_path", realModelPath("qwen2.5-coder-0.5b-instruct"), "--model_name", "coder", "--prompt_lookup", "true", "--max_num_seqs", "1", "--max_model_len", "2048", "--engine_stall_timeout", "300"]);
}, 180_000);
afterAll(async () => {
  await server?.stop();
});

const FILE = ["export function area(width: number, height: number): number {", "  return width * height;", "}", "", "export function perimeter(width: number, height: number): number {", "  return 2 * (width + height);", "}", ""].join("\n");
const messages = [{ role: "user", content: `Here is shapes.ts:\n\`\`\`ts\n${FILE}\`\`\`\nRename area to surface and return the whole file.` }];

/** One streamed greedy chat: the content, the finish reason, the usage, and how many content chunks it took. */
async function chat(extra: Record<string, unknown>) {
  const res = await fetch(`${server.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "coder", messages, temperature: 0, max_tokens: 60, stream: true, stream_options: { include_usage: true }, ...extra }),
  });
  expect(res.status).toBe(200);
  let text = "";
  let finish: string | null = null;
  let usage: { completion_tokens: number } | null = null;
  let chunks = 0;
  for (const line of (await res.text()).split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const ev = JSON.parse(line.slice(6));
    if (ev.usage) usage = ev.usage;
    const c = ev.choices?.[0];
    if (c?.delta?.content) {
      text += c.delta.content;
      chunks += 1;
    }
    if (c?.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, usage, chunks };
}

async function drafts(): Promise<{ proposed: number; accepted: number }> {
  const text = await (await fetch(`${server.baseUrl}/metrics`)).text();
  const num = (name: string) => Number(text.match(new RegExp(`^${name}\\{model="coder"\\} (\\S+)`, "m"))?.[1] ?? NaN);
  return { proposed: num("keel_engine_draft_tokens_total"), accepted: num("keel_engine_accepted_draft_tokens_total") };
}

describe("prompt lookup through the server (Qwen2.5-Coder-0.5B)", () => {
  it("gives the same streamed text, finish and usage on (server default) and off (num_assistant_tokens 0); drafts are counted", async () => {
    const before = await drafts();
    // max_tokens 40 ends the answer (~50 tokens) inside the file: a length cut while steps deliver several tokens.
    const off = await chat({ num_assistant_tokens: 0, max_tokens: 40 });
    const mid = await drafts();
    const on = await chat({ max_tokens: 40 });
    const after = await drafts();
    expect(mid).toEqual(before);
    expect(after.proposed).toBeGreaterThan(mid.proposed);
    expect(after.accepted).toBeGreaterThan(mid.accepted);
    expect(on.text).toBe(off.text);
    expect(on.text).toContain("surface(width");
    expect([on.finish, on.usage?.completion_tokens]).toEqual([off.finish, off.usage?.completion_tokens]);
    expect(on.usage?.completion_tokens).toBe(40);
    expect(on.finish).toBe("length");
    // Several tokens per step: fewer content chunks for the same text.
    expect(on.chunks).toBeLessThan(off.chunks);
  }, SLOW);

  it("cuts at a stop string at the same place with more drafts per step (num_assistant_tokens 8, max_ngram_size 2)", async () => {
    const off = await chat({ num_assistant_tokens: 0, stop: ["perimeter"] });
    const on = await chat({ num_assistant_tokens: 8, max_ngram_size: 2, stop: ["perimeter"] });
    expect(off.finish).toBe("stop");
    expect(on.text).toBe(off.text);
    expect(on.finish).toBe("stop");
    // The tokens a speculative step produced after the stop string are not completion tokens.
    expect(on.usage).toEqual(off.usage);
  }, SLOW);

  it("refuses num_assistant_tokens and max_ngram_size out of range with a 400 naming the field", async () => {
    for (const [field, value] of [["num_assistant_tokens", 33], ["num_assistant_tokens", -1], ["max_ngram_size", 0]] as const) {
      const res = await fetch(`${server.baseUrl}/v3/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "coder", messages, [field]: value }) });
      expect(res.status).toBe(400);
      expect((await res.json()).error.param).toBe(field);
    }
  });

  it("refuses num_assistant_tokens with logprobs or a guide (drafts are verified for neither); the server default just does not apply to them", async () => {
    const post = (extra: Record<string, unknown>) =>
      fetch(`${server.baseUrl}/v3/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "coder", messages, max_tokens: 2, ...extra }) });
    for (const extra of [{ logprobs: true }, { response_format: { type: "json_object" } }]) {
      const res = await post({ num_assistant_tokens: 4, ...extra });
      expect(res.status).toBe(400);
      const err = (await res.json()).error;
      expect(err.param).toBe("num_assistant_tokens");
      expect(err.message).toMatch(/cannot be combined with/);
    }
    // --prompt_lookup true is on for this server: a request with logprobs that says nothing is served (plainly).
    const plain = await post({ logprobs: true, top_logprobs: 1 });
    expect(plain.status).toBe(200);
    expect((await plain.json()).choices[0].logprobs.content.length).toBeGreaterThan(0);
  }, SLOW);
});
