/**
 * The schedule that wedges raw OpenVINO GenAI on the tiny hybrid IR (upstream.contract.test.ts: root-cause §6 scaled to
 * the CPU block, the block_manager assert at step 2 and every step after it), sent through Keel: the same model, pool
 * and flags (`--num_kv_blocks 27 --enable_prefix_caching true --cache_interval_multiplier 64`, split-fuse on) and three
 * greedy 8-token requests of 320, 320 and 200 prompt tokens at once. Keel admits by pool occupancy and preempts whole,
 * so the server stays up, no engine restarts, and every stream equals its solo run. Also with multiplier 1 (prefix
 * caching is off on hybrid models either way: docs/openvino.md, hybrid-prefix.test.ts).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hybridModel } from "../support/openvino.js";
import { metrics, startServer, type ServerHandle } from "../support/server.js";

const post = async (baseUrl: string, route: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> => {
  const r = await fetch(`${baseUrl}${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, json: (await r.json()) as Record<string, unknown> };
};

/** Distinct text for each request (no shared prefix), long enough for any target. */
const source = (tag: string): string => Array.from({ length: 120 }, (_, i) => `${tag} item ${i * 7 + tag.length}: ${tag.repeat(1 + (i % 3))} moves`).join("; ");

for (const multiplier of ["64", "1"]) describe(`the seed's schedule through Keel on the hybrid IR (--cache_interval_multiplier ${multiplier})`, () => {
  let server: ServerHandle;
  /** The three prompts, exactly 320, 320 and 200 tokens (the tokenizer's own count). */
  const prompts: string[] = [];

  /** The longest prefix of `text` with at most `target` tokens, by bisection on characters over /v3/tokenize. */
  async function promptOf(text: string, target: number): Promise<string> {
    const count = async (t: string): Promise<number> => ((await post(server.baseUrl, "/v3/tokenize", { model: "h", text: t })).json["tokens"] as number[]).length;
    let lo = 1;
    let hi = text.length;
    while (lo < hi) {
      const mid = Math.ceil((lo + hi) / 2);
      if ((await count(text.slice(0, mid))) <= target) lo = mid;
      else hi = mid - 1;
    }
    return text.slice(0, lo);
  }

  const complete = (prompt: string) => post(server.baseUrl, "/v3/completions", { model: "h", prompt, max_tokens: 8, temperature: 0, ignore_eos: true });

  beforeAll(async () => {
    server = await startServer(["--model_path", await hybridModel(), "--model_name", "h", "--num_kv_blocks", "27", "--enable_prefix_caching", "true", "--cache_interval_multiplier", multiplier, "--max_num_seqs", "16", "--max_num_batched_tokens", "4096"], {}, { engine: "openvino" });
    for (const [tag, n] of [["alpha", 320], ["bravo", 320], ["victim", 200]] as const) prompts.push(await promptOf(source(tag), n));
  });

  afterAll(async () => {
    await server?.stop();
  });

  it("three requests at once: the server stays up, no engine restart, every stream equals its solo run", async () => {
    const solo: Awaited<ReturnType<typeof complete>>[] = [];
    for (const p of prompts) solo.push(await complete(p));
    expect(solo.map((r) => (r.json["usage"] as { prompt_tokens: number }).prompt_tokens)).toEqual([320, 320, 200]);
    const together = await Promise.all(prompts.map(complete));
    together.forEach((r, i) => {
      expect(r.status).toBe(200);
      const choice = (r.json["choices"] as { text: string; finish_reason: string }[])[0]!;
      expect(choice.finish_reason).toBe("length");
      expect(choice.text, `request ${i}`).toBe((solo[i]!.json["choices"] as { text: string }[])[0]!.text);
    });
    const m = await metrics(server.baseUrl);
    for (const reason of ["exit", "signal", "watchdog", "protocol"]) expect(m.get(`keel_engine_restarts_total{reason="${reason}"}`)).toBe(0);
    expect(server.logs.some((l) => l.includes('"event":"step_failed"'))).toBe(false);
    expect(server.proc.exitCode).toBeNull();
  });
});
