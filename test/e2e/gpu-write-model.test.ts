/**
 * bench/gpu/write-model.mjs, the writer of the H200 benchmark's model (docs/gpu-h200.md): the vocabulary padded to a
 * chosen size with extra BPE merges is a valid one for llama.cpp (every merge's result is a token, every padded token
 * is ASCII so the benchmark's non-ASCII ban leaves it usable), and llama.cpp loads it and maps padded ids to their text.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { getLlama } from "node-llama-cpp";
import { afterAll, describe, expect, it } from "vitest";
import { readGgufHeader } from "../../src/model/gguf-reader.js";
import { unicodeToBytes } from "../../src/model/bpe.js";
import { ROOT } from "../support/server.js";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-write-model-"));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe("bench/gpu/write-model.mjs --vocab", () => {
  const out = path.join(dir, "padded.gguf");
  const VOCAB = 4000;
  const run = spawnSync(process.execPath, [path.join(ROOT, "bench/gpu/write-model.mjs"), "--out", out, "--vocab", String(VOCAB),
    "--layers", "1", "--hidden", "64", "--ff", "128", "--heads", "4", "--kv-heads", "2", "--f16"], { encoding: "utf8" });

  it("writes a model of exactly that vocabulary whose padded merges are consistent and ASCII", () => {
    expect(run.status, run.stderr).toBe(0);
    const summary = JSON.parse(run.stdout) as { bytes: number; vocabSize: number };
    expect(summary.vocabSize).toBe(VOCAB);
    expect(fs.statSync(out).size).toBe(summary.bytes);
    expect(fs.existsSync(`${out}.part`)).toBe(false);
    const header = readGgufHeader(fs.readFileSync(out));
    const tokens = header.kv.get("tokenizer.ggml.tokens")!.value as string[];
    const merges = header.kv.get("tokenizer.ggml.merges")!.value as string[];
    expect(header.kv.get("llama.vocab_size")!.value).toBe(VOCAB);
    expect(tokens.length).toBe(VOCAB);
    expect(new Set(tokens).size).toBe(VOCAB);
    const known = new Set(tokens);
    // 256 byte tokens + one token per merge + the 3 control tokens.
    expect(merges.length).toBe(VOCAB - 256 - 3);
    for (const m of merges) {
      const [a, b, ...rest] = m.split(" ");
      expect(rest).toEqual([]);
      expect(known.has(a!) && known.has(b!) && known.has(a! + b!), m).toBe(true);
    }
    const toByte = unicodeToBytes();
    const unpadded = spawnSync(process.execPath, [path.join(ROOT, "bench/gpu/write-model.mjs"), "--out", path.join(dir, "plain.gguf"),
      "--layers", "1", "--hidden", "64", "--ff", "128", "--heads", "4", "--kv-heads", "2"], { encoding: "utf8" });
    const base = (JSON.parse(unpadded.stdout) as { vocabSize: number }).vocabSize - 3;
    const padded = merges.slice(base - 256).map((m) => m.replace(" ", ""));
    expect(padded.length).toBe(VOCAB - base - 3);
    for (const t of padded) expect([...t].every((ch) => (toByte.get(ch) ?? 0x80) < 0x80), t).toBe(true);
  });

  it("loads in llama.cpp, which maps padded ids to their text and round-trips text", async () => {
    const header = readGgufHeader(fs.readFileSync(out));
    const tokens = header.kv.get("tokenizer.ggml.tokens")!.value as string[];
    const toByte = unicodeToBytes();
    const textOf = (id: number): string => Buffer.from([...tokens[id]!].map((ch) => toByte.get(ch)!)).toString("latin1");
    const llama = await getLlama({ gpu: false, build: "never" });
    const model = await llama.loadModel({ modelPath: out });
    try {
      // The first and the last padded tokens (the 3 control tokens follow the last merge).
      for (const id of [VOCAB - 4, VOCAB - 4 - 1000]) expect(model.detokenize([id as never])).toBe(textOf(id));
      const sentence = "the queue batch token model server stream";
      expect(model.detokenize(model.tokenize(sentence))).toBe(sentence);
    } finally {
      await model.dispose();
      await llama.dispose();
    }
  });
});
