import {writeFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {buildTinyRecurrentModel, isBatchInvariantRecurrentShape} from "/tmp/rec/out/model/tiny-recurrent-model.js";
const logs = [];
const llama = await getLlama({gpu: false, build: "never", maxThreads: 1, logLevel: LlamaLogLevel.info, logger: (l, m) => logs.push(m)});
const chat = (t) => `<|im_start|>user\n${t}<|im_end|>\n<|im_start|>assistant\n`;
async function measure(opts) {
  const file = `/tmp/rec/m-${JSON.stringify(opts).replace(/\W/g, "")}.gguf`;
  const buf = buildTinyRecurrentModel(opts); writeFileSync(file, buf);
  logs.length = 0;
  const t0 = performance.now();
  const model = await llama.loadModel({modelPath: file});
  const ctx = await model.createContext({contextSize: 256, sequences: 2, batchSize: 64, threads: 1, flashAttention: false});
  const tLoad = performance.now() - t0;
  const native = ctx._ctx;
  const S = () => { const s = new llama._bindings.AddonSampler(model._model); s.applyConfig({temperature: 0}); return s; };
  async function stepLoop(prompts, starts, n, budget) {
    const reqs = prompts.map((prompt, seq) => ({prompt, seq, start: starts[seq], pos: 0, out: [], probs: [], sampler: S()}));
    for (let step = 0; reqs.some((r) => r.out.length < n); step++) {
      const items = []; let left = budget;
      for (const r of reqs) if (r.start <= step && r.pos >= r.prompt.length && r.out.length < n) { items.push({r, toks: [r.out.at(-1)], logits: true}); left--; }
      for (const r of reqs) { if (r.start > step || r.pos >= r.prompt.length || left <= 0) continue; const k = Math.min(left, r.prompt.length - r.pos); items.push({r, toks: r.prompt.slice(r.pos, r.pos + k), logits: r.pos + k === r.prompt.length}); left -= k; }
      if (!items.length) continue;
      native.initBatch(items.reduce((a, it) => a + it.toks.length, 0));
      for (const it of items) it.idx = native.addToBatch(it.r.seq, it.r.pos, Uint32Array.from(it.toks), it.logits ? Uint32Array.of(it.toks.length - 1) : new Uint32Array(0))[0];
      await native.decodeBatch();
      for (const it of items) { it.r.pos += it.toks.length; if (!it.logits) continue; const [t, p] = await native.sampleToken(it.idx, it.r.sampler, true); it.r.out.push(t); it.r.probs.push(p[1]); }
    }
    for (const r of reqs) { native.disposeSequence(r.seq); r.sampler.dispose(); }
    return reqs;
  }
  const p0 = Array.from(model.tokenize(chat("Once upon a time there was a fox who lived by the sea and watched the ships"), true));
  const p1 = Array.from(model.tokenize(chat("{\"name\": \"Alice\", \"age\": 30}"), true));
  const t1 = performance.now();
  const [solo0] = await stepLoop([p0], [0], 32, 64);
  const tSolo = performance.now() - t1;
  const [solo1] = await stepLoop([p1], [0], 32, 64);
  const [b0, b1] = await stepLoop([p0, p1], [0, 3], 32, 5);
  const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);
  let firstTokDiff = b0.out.findIndex((t, i) => t !== solo0.out[i]);
  const r = {opts, invariantShape: isBatchInvariantRecurrentShape(opts), bytes: buf.length, loadMs: Math.round(tLoad), solo32tokMs: Math.round(tSolo),
    prompt0Len: p0.length, solo0: solo0.out.join(" "), text0: JSON.stringify(model.detokenize(solo0.out)),
    tokensEqual: eq(b0.out, solo0.out) && eq(b1.out, solo1.out), probsEqual: eq(b0.probs, solo0.probs) && eq(b1.probs, solo1.probs), firstTokDiff,
    maxProbDiff: Math.max(...b0.probs.map((p, i) => Math.abs(p - solo0.probs[i])), ...b1.probs.map((p, i) => Math.abs(p - solo1.probs[i]))),
    memLogs: logs.filter((l) => /RS buffer|KV buffer|llama_memory_recurrent: size|llama_kv_cache: size|n_seq_max|n_ctx /.test(l)).map((l) => l.trim())};
  console.log(JSON.stringify(r, null, 1));
  await ctx.dispose(); await model.dispose();
}
await measure({arch: "mamba"});
await measure({arch: "jamba"});
await measure({arch: "mamba", hidden: 64, dtRank: 4});
await measure({arch: "jamba", hidden: 64, heads: 4, ff: 256, dtRank: 4});
await llama.dispose();
