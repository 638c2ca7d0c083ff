#!/usr/bin/env node
// Writes a random-weight llama GGUF of a realistic shape with Keel's own writer (dist/model/tiny-model.js), for the
// GPU benchmark (bench/gpu/run-h200.sh). Two things `keel make-model` does not do yet:
//   1. a vocabulary of a chosen size: the tiny training corpus yields ~1,100 BPE merges, so the vocabulary is padded
//      with extra merges of pairs of existing ASCII tokens (valid BPE: each merged token is in the vocabulary), which
//      keeps every padded token ASCII (the benchmark bans non-ASCII tokens on both servers, see bench/compare.mjs);
//   2. files over 2 GiB: fs.writeFileSync refuses one write of more than 2^31-1 bytes, so the buffer is written in
//      1 GiB slices.
//
//   node bench/gpu/write-model.mjs --out m.gguf --vocab 32000 [make-model flags: --layers --hidden --ff --heads
//        --kv-heads --ctx --seed --f16 ...]
// Prints one JSON line: {out, bytes, vocabSize, params, seconds}.
import { closeSync, openSync, renameSync, writeSync } from "node:fs";

const argv = process.argv.slice(2);
const vi = argv.indexOf("--vocab");
const vocabTarget = vi >= 0 ? Number(argv[vi + 1]) : 0;
const rest = vi >= 0 ? [...argv.slice(0, vi), ...argv.slice(vi + 2)] : argv;
if (vi >= 0 && !(Number.isInteger(vocabTarget) && vocabTarget > 0)) {
  console.error("--vocab needs a positive integer");
  process.exit(2);
}

const { parseMakeModelArgs } = await import("../../dist/model/make-model.js");
const tiny = await import("../../dist/model/tiny-model.js");
const { unicodeToBytes } = await import("../../dist/model/bpe.js");
const args = parseMakeModelArgs(rest);
const t0 = performance.now();

// 1. Pad the (memoised) vocabulary the builder will use: vocabFor returns the same object for the same merge count,
//    so extra merges appended here are what buildTinyModel and tinyModelSpecialIds see.
if (vocabTarget) {
  const merges = tiny.resolveTinyModelOptions(args.options).merges;
  const vocab = tiny.vocabFor(merges);
  const base = tiny.tinyModelSpecialIds(args.options).vocabSize;
  const need = vocabTarget - base;
  if (need < 0) {
    console.error(`--vocab ${vocabTarget} is below the unpadded vocabulary (${base})`);
    process.exit(2);
  }
  const toByte = unicodeToBytes();
  const ascii = (t) => [...t].every((ch) => (toByte.get(ch) ?? 0x80) < 0x80);
  const known = new Set([...vocab.byteTokens, ...vocab.mergedTokens]);
  const parts = vocab.mergedTokens.filter(ascii);
  let added = 0;
  // Pairs (a, b) in a fixed order: deterministic for a given corpus and merge count.
  for (let i = 0; i < parts.length && added < need; i++) {
    for (let j = 0; j < parts.length && added < need; j++) {
      const token = parts[i] + parts[j];
      if (known.has(token)) continue;
      known.add(token);
      vocab.merges.push(`${parts[i]} ${parts[j]}`);
      vocab.mergedTokens.push(token);
      added++;
    }
  }
  if (added < need) {
    console.error(`could only add ${added} of ${need} padding merges`);
    process.exit(1);
  }
}

// 2. Build and write in slices (at most 1 GiB per write), through a temporary name so no partial file is left.
const buf = tiny.buildTinyModel(args.options);
const tmp = `${args.out}.part`;
const fd = openSync(tmp, "w");
try {
  const SLICE = 1 << 30;
  for (let off = 0; off < buf.length; ) off += writeSync(fd, buf, off, Math.min(SLICE, buf.length - off));
} finally {
  closeSync(fd);
}
renameSync(tmp, args.out);
const o = tiny.resolveTinyModelOptions(args.options);
const V = tiny.tinyModelSpecialIds(args.options).vocabSize;
const H = o.hidden;
const KV = (o.kvHeads * H) / o.heads;
const params = o.layers * (2 * H * H + 2 * H * KV + 3 * H * o.ff + 2 * H) + 2 * V * H + H;
console.log(JSON.stringify({ out: args.out, bytes: buf.length, vocabSize: V, params, seconds: Math.round((performance.now() - t0) / 100) / 10 }));
