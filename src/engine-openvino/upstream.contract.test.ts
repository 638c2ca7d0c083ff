/**
 * OpenVINO GenAI behaviours the worker works around (docs/upstream.md, "OpenVINO GenAI"), shown on the raw library
 * (src/engine-openvino/upstream_contract.py) with the embedded tiny model in F16 and, for hybrid (linear-attention)
 * models, the tiny hybrid IR. If a release fixes one, its test fails here and the workaround can be reconsidered.
 */
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { DEFAULT_MODEL_OPTIONS, ensureDefaultModel } from "../model/default-model.js";
import { hybridModel, openvinoPython } from "../../test/support/openvino.js";

const run = promisify(execFile);
const SCRIPT = path.join(path.dirname(new URL(import.meta.url).pathname), "upstream_contract.py");

const tinyF16 = (): Promise<string> => ensureDefaultModel({ model: { ...DEFAULT_MODEL_OPTIONS, f16: true } });

/** Runs one check of upstream_contract.py on a model (default: the tiny attention-only GGUF in F16). */
async function check(name: string, model?: string): Promise<Record<string, unknown>> {
  const { stdout } = await run(await openvinoPython(), [SCRIPT, model ?? (await tinyF16()), name], { timeout: 120_000 });
  return JSON.parse(stdout.trim().split("\n").pop()!) as Record<string, unknown>;
}

describe("OpenVINO GenAI upstream contracts (worked around in worker.py)", { timeout: 120_000 }, () => {
  it("a live request id added twice wedges the pipeline: every later step() raises (worker: ids from a counter)", async () => {
    const r = (await check("reused_id")) as { stepErrors: (string | null)[] };
    expect(r.stepErrors).toHaveLength(3);
    for (const e of r.stepErrors) expect(e).not.toBeNull();
  });

  it("a sequence outgrowing the pool ends IGNORED with no exception and a truncated answer (worker: refused at add)", async () => {
    const r = (await check("outgrow_pool")) as { statuses: string[]; generated: number[]; raised: string | null };
    expect(r.raised).toBeNull();
    expect(r.statuses[1]).toBe("IGNORED");
    expect(r.generated[1]).toBeLessThan(400);
  });

  it("ignore_eos also ignores custom stop_token_ids (worker: ends the request at a stop token itself)", async () => {
    const r = (await check("ignore_eos_stop_ids")) as { stopToken: number; generated: number[] };
    expect(r.generated[0]).toBe(r.stopToken);
    expect(r.generated).toHaveLength(4);
  });

  it("decode() drops a byte that is not valid UTF-8 instead of U+FFFD (worker: text from the GGUF's token bytes)", async () => {
    const r = (await check("detok_drops_invalid_utf8")) as { token: number; text: string };
    expect(r.text).toBe("");
  });

  it("get_vocab_vector() raises on byte tokens that are not UTF-8 (worker: vocabulary read from the GGUF)", async () => {
    expect((await check("vocab_vector_fails")).raised).toBe("UnicodeDecodeError");
  });

  it("encode() cuts a text of 10,000 words at 8,192 tokens without a word, whatever max_length or truncation ask (worker: tokenizer_limit.py refuses such a prompt)", async () => {
    expect(await check("tokenizer_cuts_long_text")).toEqual({ plain: 8192, maxLength: 8192, noTruncation: 8192, words: 10000 });
  });
});

interface SeedRun {
  stepErrors: (string | null)[];
  unfinished: boolean;
  generated: number[];
}
interface Variance {
  soloVsBatched: number;
  sameTokens: boolean;
  otherContentVsBatched: number | null;
  serialVsSolo: number | null;
}

describe("OpenVINO GenAI on a hybrid (linear-attention) model: the seed's crash and exactness", { timeout: 180_000 }, () => {
  it("the seed's schedule (prefix caching, pool full after step 1): step 2 asserts in the block manager, every later step raises, nothing finishes; prefix caching off or one spare block runs through", async () => {
    const r = (await check("hybrid_seed_assert", await hybridModel())) as Record<"traced" | "prefixOff" | "spareBlock", SeedRun>;
    const [first, second, ...later] = r.traced.stepErrors;
    expect(first).toBeNull();
    expect(second).toMatch(/^Check 'm_block_table\.count\(seq_id\) > 0' failed at block_manager\.hpp:\d+: Invalid sequence group/);
    expect(later.length).toBeGreaterThanOrEqual(3);
    for (const e of later) expect(e).toMatch(/already in scheduling phase/);
    expect(r.traced.unfinished).toBe(true);
    for (const ok of [r.prefixOff, r.spareBlock]) {
      expect(ok.stepErrors.every((e) => e === null)).toBe(true);
      expect(ok.unfinished).toBe(false);
      expect(ok.generated).toEqual([8, 8, 8]);
    }
  });

  it("a greedy request's log-probs depend on the other sequences in its steps (their lengths, not their content); one sequence per step is exact; attention-only is exact", async () => {
    const hybrid = (await check("batch_variance", await hybridModel())) as unknown as Variance;
    expect(hybrid.soloVsBatched).toBeGreaterThan(1e-3); // far above f32 rounding
    expect(hybrid.otherContentVsBatched).toBe(0); // no state leak between sequences
    expect(hybrid.serialVsSolo).toBe(0); // max_num_seqs=1
    const attention = (await check("batch_variance")) as unknown as Variance;
    expect(attention.soloVsBatched).toBe(0);
    expect(attention.sameTokens).toBe(true);
  });

  it("a resumed stream (prompt + generated re-added) and a chunked prefill differ from the uninterrupted whole-prompt run on the hybrid; within f32 rounding on attention-only", async () => {
    const hybrid = (await check("resume_variance", await hybridModel())) as Record<string, number>;
    expect(hybrid["resumedVsUninterrupted"]).toBeGreaterThan(1e-3);
    expect(hybrid["chunkedVsWhole"]).toBeGreaterThan(1e-3);
    const attention = (await check("resume_variance")) as Record<string, number>;
    expect(attention["resumedVsUninterrupted"]).toBeLessThan(1e-4);
    expect(attention["chunkedVsWhole"]).toBeLessThan(1e-4);
  });

  it("the paged hybrid is off from the same IR run as a stateful model after a multi-token prompt (not after a 1-token one)", async () => {
    const r = (await check("hybrid_vs_stateful", await hybridModel())) as Record<string, number>;
    expect(r["prompt1"]).toBeLessThan(1e-3);
    expect(r["prompt4"]).toBeGreaterThan(1e-2);
  });

  it("prefix-cache hits restore linear-attention state only at checkpoints (every 32 x cache_interval_multiplier tokens); a hit equals the cold run only when the cold run's chunks end on checkpoints", async () => {
    type Hit = { coldSteps: number; repeatSteps: number; gap: number };
    const r = (await check("prefix_hits", await hybridModel())) as Record<string, Hit>;
    expect([r["mbt32_cim1"]!.repeatSteps, r["mbt32_cim2"]!.repeatSteps, r["mbt32_cim4"]!.repeatSteps]).toEqual([1, 2, 4]); // 96, 64, 0 tokens hit
    for (const k of ["mbt32_cim1", "mbt32_cim2", "mbt32_cim4"]) expect(r[k]!.gap).toBe(0);
    expect(r["mbt48_cim2"]!.repeatSteps).toBeLessThan(r["mbt48_cim2"]!.coldSteps);
    expect(r["mbt48_cim2"]!.gap).toBeGreaterThan(1e-3);
    const attention = (await check("prefix_hits")) as Record<string, Hit>;
    for (const hit of Object.values(attention)) expect([hit.repeatSteps, hit.gap]).toEqual([1, 0]);
  });

  it("the cause: the exported IR leaves position_ids unused (rotary positions from an in-graph arange); rewired by rope_positions.py the paged hybrid is batch-, chunk- and resume-invariant and matches the stateful model", async () => {
    const r = (await check("hybrid_positions", await hybridModel())) as { positionIdsUnused: boolean; rewired: string[]; rewiredTwice: boolean; fixed: Record<string, number | boolean | null> };
    expect(r.positionIdsUnused).toBe(true);
    expect(r.rewired).toEqual(["__module.model.model/aten::expand/Broadcast"]);
    expect(r.rewiredTwice).toBe(false); // a rewired IR reads position_ids: nothing left to rewire
    expect(r.fixed).toMatchObject({ soloVsBatched: 0, sameTokens: true, serialVsSolo: 0, chunkedVsWhole: 0 });
    expect(r.fixed["resumedVsUninterrupted"]).toBeLessThan(1e-4);
    expect(r.fixed["prompt4"]).toBeLessThan(1e-4);
  });

  it("a prefix-cache hit restores another prompt's linear-attention state: with 64-token checkpoints (multiplier 2), a prompt sharing A's first block but not the interval corrupts A's next hit (content-dependent); multiplier 1, or sharing <32 or >=64 tokens, is exact", async () => {
    type Run = { gap: number; firstLogprob: number };
    const r = (await check("prefix_checkpoint_leak", await hybridModel())) as Record<string, Run>;
    expect(r["shared40_cim2_tail8"]!.gap).toBeGreaterThan(1e-3);
    expect(r["shared40_cim2_tail77"]!.gap).toBeGreaterThan(1e-3);
    expect(r["shared40_cim2_tail8"]!.firstLogprob).not.toBe(r["shared40_cim2_tail77"]!.firstLogprob); // X's content leaks into A
    for (const k of ["shared20_cim2_tail8", "shared70_cim2_tail8", "shared40_cim1_tail8"]) expect(r[k]!.gap).toBe(0);
  });

  it("num_linear_attention_blocks on a model without linear attention refuses to load the pipeline", async () => {
    expect((await check("la_blocks_on_attention_model")).raised).toMatch(/num_linear_attention_blocks can be set only for models with linear attention/);
  });
});
