/**
 * A model with a realistic vocabulary (151936 tokens, Qwen2.5's size; `keel make-model --vocab 151936`), streamed to
 * disk by the GGUF writer, is loaded by llama.cpp and served: greedy chats (unary and streamed alike) sample tokens
 * from the generated part of the vocabulary, with top-5 logprobs; seeded top-p sampling repeats.
 * The shape is small (2 layers, hidden 64) so the test runs in seconds; the vocabulary is the real size.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { unicodeToBytes } from "../../src/model/bpe.js";
import { writeGgufFile } from "../../src/model/gguf-writer.js";
import { resolveTinyModelOptions, tinyModelSpecialIds, tinyModelWriter, vocabFor } from "../../src/model/tiny-model.js";
import { chat } from "../support/chat-client.js";
import { startServer } from "../support/server.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-real-vocab-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const VOCAB = 151_936;
const opts = { layers: 2, hidden: 64, ff: 128, heads: 4, kvHeads: 2, vocab: VOCAB, f16: true };

type Logprobs = { content: { token: string; logprob: number; top_logprobs: { token: string; logprob: number }[] }[] };

describe("a served model with a 151936-token vocabulary", () => {
  it("loads, chats greedily from the generated tokens with top-5 logprobs, and repeats seeded top-p samples", async () => {
    const file = path.join(tmp, "vocab151936.gguf");
    writeGgufFile(file, tinyModelWriter(opts));
    expect(tinyModelSpecialIds(opts).vocabSize).toBe(VOCAB);
    // texts of the generated (non-corpus) tokens, decoded from the byte-unicode alphabet
    const b = unicodeToBytes();
    const corpusMerges = vocabFor(resolveTinyModelOptions(opts).merges).merges.length;
    const generated = new Set(
      vocabFor(resolveTinyModelOptions(opts).merges, VOCAB - 259).mergedTokens.slice(corpusMerges)
        .map((t) => Buffer.from([...t].map((ch) => b.get(ch)!)).toString("utf8")),
    );
    expect(generated.size).toBe(VOCAB - 259 - corpusMerges);

    const server = await startServer(["--model_path", file, "--max_num_seqs", "2"]);
    try {
      const body = { model: "vocab151936", messages: [{ role: "user", content: "Write a haiku about the sea." }], max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 5 };
      const [a, s] = await Promise.all([chat(server.baseUrl, body), chat(server.baseUrl, { ...body, stream: true })]);
      expect(a.status).toBe(200);
      expect(a.finishReason).toBe("length");
      expect(s.status).toBe(200);
      expect(s.text).toBe(a.text);
      const lp = (a.body as { choices: { logprobs: Logprobs }[] }).choices[0]!.logprobs.content;
      expect(lp).toHaveLength(12);
      expect(lp.map((t) => t.token).join("")).toBe(a.text);
      for (const t of lp) {
        expect(t.top_logprobs).toHaveLength(5);
        expect(t.top_logprobs[0]!.token).toBe(t.token); // greedy: the pick is the most likely token
        expect(t.top_logprobs.map((x) => x.logprob)).toEqual([...t.top_logprobs.map((x) => x.logprob)].sort((x, y) => y - x));
      }
      // with ~151k random output rows, the argmax is practically never one of the ~1k corpus tokens
      expect(lp.filter((t) => generated.has(t.token)).length).toBeGreaterThanOrEqual(10);

      const sampled = { ...body, logprobs: false, top_logprobs: undefined, temperature: 1, top_p: 0.9, seed: 7 };
      const [p1, p2] = await Promise.all([chat(server.baseUrl, sampled), chat(server.baseUrl, sampled)]);
      expect(p1.status).toBe(200);
      expect(p2.text).toBe(p1.text);
      expect(p1.text).not.toBe(a.text);
    } finally {
      await server.stop();
    }
  }, 120_000);
});
