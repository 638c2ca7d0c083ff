/**
 * Model preparation for the OpenVINO engine on the real models the tests pre-fetch: Qwen2.5-Coder-0.5B (Q4_K_M with
 * 133 Q5_0 tensors OpenVINO GenAI cannot read) loads and answers after prep, its IR gives the re-encoded GGUF's greedy
 * tokens, and a second prep reuses the folder; SmolLM2-135M (Q4_1) is prepared without re-encoding.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { check, prepCli } from "../support/openvino.js";
import { realModelPath } from "../support/real-models.js";

interface Generated {
  ok: boolean;
  error?: string;
  ids: number[][];
  texts: string[];
  eos: number;
}
interface Manifest {
  reencoded: { name: string; from: string; to: string }[];
  files: Record<string, number>;
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "keel-ov-prep-real-"));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));
const manifestOf = (dir: string): Manifest => JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8")) as Manifest;

describe("prep.py on Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)", () => {
  const qwen = realModelPath("qwen2.5-coder-0.5b-instruct");
  const cache = path.join(tmp, "qwen-cache");

  it("fails to load as shipped (Q5_0 tensors)", async () => {
    const raw = await check<Generated>("generate", qwen, "4");
    expect(raw.ok).toBe(false);
    expect(raw.error).toContain("gguf_tensor_to_f16 failed");
  }, 120_000);

  it("is prepared (every Q5_0 tensor re-encoded to Q8_0), answers coherently, and gives the re-encoded GGUF's greedy tokens", async () => {
    const prepared = await prepCli(qwen, cache);
    expect(prepared.status, prepared.stderr).toBe(0);
    const dir = prepared.path!;
    const manifest = manifestOf(dir);
    expect(manifest.reencoded).toHaveLength(133);
    expect(new Set(manifest.reencoded.map((r) => `${r.from}->${r.to}`))).toEqual(new Set(["Q5_0->Q8_0"]));
    expect(Object.keys(manifest.files)).not.toContain("model.gguf");

    const fromIr = await check<Generated>("generate", dir, "24");
    expect(fromIr.ok, fromIr.error).toBe(true);
    // A real instruct model answers a haiku request and a code prompt with words, not byte soup.
    for (const text of fromIr.texts) expect(text).toMatch(/[A-Za-z]{3,}.*\s.*[A-Za-z]{3,}/s);

    // The IR alone equals the GGUF it was saved from: why prep keeps only the IR.
    const reencoded = path.join(tmp, "qwen-reencoded.gguf");
    await check("reencode", qwen, reencoded);
    const fromGguf = await check<Generated>("generate", reencoded, "24");
    fs.rmSync(reencoded);
    expect(fromGguf.ok, fromGguf.error).toBe(true);
    expect(fromIr.ids).toEqual(fromGguf.ids);

    const again = await prepCli(qwen, cache);
    expect(again.path).toBe(dir);
    expect(again.stderr).toContain(`using the prepared model in ${dir}`);
  }, 600_000);
});

describe("prep.py on SmolLM2-135M-Instruct (Q4_1)", () => {
  it("is prepared without re-encoding and its IR gives the shipped GGUF's greedy tokens", async () => {
    const smol = realModelPath("smollm2-135m-instruct");
    const prepared = await prepCli(smol, path.join(tmp, "smol-cache"));
    expect(prepared.status, prepared.stderr).toBe(0);
    expect(manifestOf(prepared.path!).reencoded).toEqual([]);
    const fromGguf = await check<Generated>("generate", smol, "24");
    const fromIr = await check<Generated>("generate", prepared.path!, "24");
    expect(fromGguf.ok, fromGguf.error).toBe(true);
    expect(fromIr.ids).toEqual(fromGguf.ids);
    expect(fromIr.texts[0]).toMatch(/[A-Za-z]{3,}/);
  }, 300_000);
});
