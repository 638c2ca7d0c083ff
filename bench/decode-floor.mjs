#!/usr/bin/env node
// The engine's floor at one stream: ms per token of Keel's decode + greedy sample with no server around it
// (LlamaAdapter directly, as the engine calls it), interleaved with llama-server's own per-token decode time
// (`timings.predicted_per_token_ms` of /completion) on the same GGUF, one thread each. What is left between Keel's
// served tok/s and this floor is the server; what is between the two floors is llama.cpp's build (node-llama-cpp's
// prebuilt CPU variant vs the llama-server bench/build-llama-server.sh built). Prints medians; asserts nothing.
//
//   node bench/decode-floor.mjs [--model PATH] [--tokens 200] [--rounds 5] [--llama-server FILE]
import { spawn } from "node:child_process";
import http from "node:http";
import path from "node:path";
import { readFileSync } from "node:fs";
import { ROOT as root, arg, benchModel, median as med, openAdapter } from "./lib.mjs";

const modelPath = await benchModel();
const tokens = Number(arg("tokens", "200"));
const rounds = Number(arg("rounds", "5"));
const release = JSON.parse(readFileSync(path.join(root, "node_modules/node-llama-cpp/llama/binariesGithubRelease.json"), "utf8")).release;
const bin = arg("llama-server", path.join(process.env.HOME, ".cache/keel/llama-server", release, "build/bin/llama-server"));
const port = 18000 + (process.pid % 1000);
const ban = Array.from({ length: 128 }, (_, i) => [128 + i, false]); // non-ASCII byte tokens (random model)

const adapter = await openAdapter(modelPath, { sequences: 1, contextSize: 1024 });
const prompt = adapter.tokenize("hello there, the river");
const bias = new Map(ban.map(([t]) => [t, -Infinity]));
async function keelFloor() {
  adapter.clearSequence(0);
  const s = adapter.createSampler({ temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias, repetitionPenalty: 1 });
  let idx = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
  const t0 = performance.now();
  for (let k = 0; k < tokens; k++) {
    const tok = adapter.sampleMany ? adapter.sampleMany([{ batchLogitIndex: idx[0], sampler: s }])[0] : await adapter.sample(idx[0], s);
    idx = await adapter.decode([{ slot: 0, pos: prompt.length + k, tokens: [tok], wantsLogits: true }]);
  }
  s.dispose();
  return (performance.now() - t0) / tokens;
}
const server = spawn(bin, ["-m", modelPath, "--port", String(port), "--host", "127.0.0.1", "-np", "1", "-c", "1024", "-t", "1", "-tb", "1", "-fa", "off", "--no-webui", "--no-warmup"], { stdio: "ignore" });
process.on("exit", () => server.kill("SIGKILL"));
function post(body) {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify(body);
    const req = http.request({ host: "127.0.0.1", port, path: "/completion", method: "POST", agent: false, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) } }, (res) => {
      let b = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (b += d));
      res.on("end", () => (res.statusCode === 200 ? resolve(JSON.parse(b)) : reject(new Error(`${res.statusCode} ${b}`))));
    });
    req.on("error", reject);
    req.end(payload);
  });
}
for (let i = 0; ; i++) {
  try {
    await post({ prompt: "warm", n_predict: 1 });
    break;
  } catch (err) {
    if (i > 300) throw err;
    await new Promise((r) => setTimeout(r, 200));
  }
}
const otherFloor = async () => (await post({ prompt: "hello there, the river", n_predict: tokens, ignore_eos: true, temperature: 0, cache_prompt: false, logit_bias: ban })).timings.predicted_per_token_ms;
const res = { keel: [], other: [] };
await keelFloor();
for (let r = 0; r < rounds; r++) {
  for (const k of r % 2 ? ["other", "keel"] : ["keel", "other"]) res[k].push(k === "keel" ? await keelFloor() : await otherFloor());
}
console.log(`${path.basename(modelPath)}, ${tokens} tokens, 1 thread, median of ${rounds} interleaved rounds (addon: ${adapter.nativeAddon.kind}):`);
console.log(`  Keel engine decode + sample: ${med(res.keel).toFixed(3)} ms/token (${res.keel.map((x) => x.toFixed(2)).join(" ")})`);
console.log(`  llama-server predicted_per_token_ms: ${med(res.other).toFixed(3)} ms/token (${res.other.map((x) => x.toFixed(2)).join(" ")})`);
console.log(`  ratio Keel floor / llama-server decode: ${(med(res.keel) / med(res.other)).toFixed(2)}`);
await adapter.dispose();
server.kill("SIGKILL");
