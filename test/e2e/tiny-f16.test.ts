/**
 * `--model_path keel-tiny-f16`: the tiny model with F16 matrices (the one both engines load; OpenVINO GenAI refuses
 * F32 matrices) is served by the llama.cpp engine under its own name and chats deterministically, and both engines
 * start the same greedy answer from it (same weights, tokenizer and template).
 */
import { describe, expect, it } from "vitest";
import { ensureTinyModel } from "../../src/model/default-model.js";
import { chat } from "../support/chat-client.js";
import { check } from "../support/openvino.js";
import { get, startServer } from "../support/server.js";

type LogLine = { event?: string; name?: string; kind?: string; path?: string };
const modelEvents = (logs: string[]): LogLine[] =>
  logs.flatMap((l) => {
    try {
      const j = JSON.parse(l) as LogLine;
      return j.event === "model" ? [j] : [];
    } catch {
      return [];
    }
  });

describe("keel serve --model_path keel-tiny-f16 (llama.cpp engine)", () => {
  it("serves the F16 tiny model under its name; greedy chats complete and repeat exactly", async () => {
    const server = await startServer(["--model_path", "keel-tiny-f16", "--max_num_seqs", "2"]);
    try {
      const [model] = modelEvents(server.logs);
      expect(model).toEqual(expect.objectContaining({ name: "keel-tiny-f16", kind: "tiny" }));
      expect(model!.path).toMatch(/keel-tiny-f16-[0-9a-f]{16}\.gguf$/);
      const models = JSON.parse((await get(server.baseUrl, "/v1/models")).body) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id)).toEqual(["keel-tiny-f16"]);
      const body = { model: "keel-tiny-f16", messages: [{ role: "user", content: "Write a haiku about the sea." }], max_tokens: 12, temperature: 0 };
      const [a, b] = await Promise.all([chat(server.baseUrl, body), chat(server.baseUrl, { ...body, stream: true })]);
      expect(a.status).toBe(200);
      expect(a.finishReason).toBe("length");
      expect(a.text.length).toBeGreaterThan(0);
      expect(b.status).toBe(200);
      expect(b.text).toBe(a.text);
    } finally {
      await server.stop();
    }
  }, 60_000);

  it("starts the same greedy answer as OpenVINO GenAI loading the same file", async () => {
    // Random weights have near-ties, and the two engines sum in different orders: they agree for the first tokens
    // only (measured: 16 of 24 here), so 4 are compared.
    const file = await ensureTinyModel("keel-tiny-f16");
    const openvino = await check<{ ok: boolean; texts: string[] }>("generate", file, "4");
    expect(openvino.ok).toBe(true);
    const server = await startServer(["--model_path", "keel-tiny-f16", "--max_num_seqs", "1"]);
    try {
      const r = await chat(server.baseUrl, { model: "keel-tiny-f16", messages: [{ role: "user", content: "Write a haiku about the sea." }], max_tokens: 4, temperature: 0 });
      expect(r.status).toBe(200);
      expect(r.text).toBe(openvino.texts[0]);
    } finally {
      await server.stop();
    }
  }, 60_000);
});
