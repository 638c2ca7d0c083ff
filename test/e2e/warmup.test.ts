/**
 * `--warmup` (src/engine/warmup.ts): the llama.cpp engine decodes every batch shape before ready and clears it. On the
 * tiny model on CPU (`--warmup true`; `auto` warms GPU backends only) the first real requests must answer exactly
 * as on an engine that did not warm up: the warm-up leaves no KV behind.
 */
import { describe, expect, it } from "vitest";
import { chat } from "../support/chat-client.js";
import { startServer, type ServerHandle } from "../support/server.js";

type LogLine = Record<string, unknown>;
const events = (server: ServerHandle, name: string): LogLine[] =>
  server.logs.flatMap((l) => {
    try {
      // The gateway's own events, and the engine's lines it passes through under `engine`.
      const j = JSON.parse(l) as LogLine;
      const inner = (j["engine"] ?? {}) as LogLine;
      return j["event"] === name ? [j] : inner["event"] === name ? [inner] : [];
    } catch {
      return [];
    }
  });

/** The first request alone, then four at once (decode batches of several widths), greedy. */
async function firstAnswers(server: ServerHandle): Promise<string[]> {
  const body = (content: string) => ({ model: "keel-tiny", messages: [{ role: "user", content }], max_tokens: 24, temperature: 0, ignore_eos: true });
  const first = await chat(server.baseUrl, body("The first request after load."));
  const batch = await Promise.all(["alpha", "beta gamma", "delta epsilon zeta", "eta"].map((c) => chat(server.baseUrl, { ...body(c), stream: true })));
  for (const r of [first, ...batch]) expect(r.status).toBe(200);
  return [first, ...batch].map((r) => r.text);
}

describe("--warmup (llama.cpp engine)", () => {
  it("warms up before ready, says how long it took, and the first answers equal those of an engine without warm-up", async () => {
    const flags = ["--max_num_seqs", "4", "--max_num_batched_tokens", "64", "--log_format", "json"];
    const warm = await startServer([...flags, "--warmup", "true"]);
    let warmAnswers: string[];
    try {
      const ready = events(warm, "engine_ready")[0]!;
      expect(ready["warmupMs"]).toEqual(expect.any(Number));
      expect(ready["msg"]).toMatch(/^engine ready in \d+\.\d s; warm-up \d+\.\d\d s; backend cpu; /);
      // The engine's own line: the prefill chunk of the step budget, then decode widths 1..4.
      const line = events(warm, "warmup")[0]!;
      expect(line["widths"]).toEqual([64, 1, 2, 3, 4]);
      warmAnswers = await firstAnswers(warm);
    } finally {
      await warm.stop();
    }
    const cold = await startServer([...flags, "--warmup", "false"]);
    try {
      const ready = events(cold, "engine_ready")[0]!;
      expect(ready["warmupMs"]).toBeUndefined();
      expect(events(cold, "warmup")).toEqual([]);
      expect(await firstAnswers(cold)).toEqual(warmAnswers);
    } finally {
      await cold.stop();
    }
  }, 120_000);

  it("auto warms GPU backends only: on CPU the engine does not warm up", async () => {
    const server = await startServer(["--max_num_seqs", "2", "--log_format", "json"]);
    try {
      expect(events(server, "engine_ready")[0]!["warmupMs"]).toBeUndefined();
      expect(events(server, "warmup")).toEqual([]);
    } finally {
      await server.stop();
    }
  }, 60_000);
});
