#!/usr/bin/env node
// A/B on one running Keel: the same closed-loop streaming load with and without a logit_bias of N entries (the
// ASCII-only bias compare.mjs sends for Keel-written models), interleaved rounds. Prints aggregate tok/s per round and
// the median per arm. Isolates the cost of a request-level bias in Keel's step loop from everything else.
//
//   node bench/gpu/bias-ab.mjs --port 8000 --conc 8 --tokens 128 --rounds 3 --bias-size 128
//   (start Keel first: node bin/keel.mjs serve --model_path m.gguf --model_name bench --max_num_seqs 8 ...)
import http from "node:http";

const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : def;
};
const port = Number(arg("port", "8000"));
const conc = Number(arg("conc", "8"));
const tokens = Number(arg("tokens", "128"));
const rounds = Number(arg("rounds", "3"));
const biasSize = Number(arg("bias-size", "128"));
// Tokens 128..255 are byte tokens of non-ASCII bytes in Keel's writer: banning them is what compare.mjs does.
const bias = Object.fromEntries(Array.from({ length: biasSize }, (_, i) => [128 + i, -100]));

function chat(body) {
  return new Promise((resolve) => {
    const payload = JSON.stringify(body);
    let usage = null;
    const req = http.request({ host: "127.0.0.1", port, path: "/v1/chat/completions", method: "POST", agent: false,
      headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) } }, (res) => {
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const line = buf.slice(0, i).trim();
          buf = buf.slice(i + 2);
          if (line.startsWith("data:") && line.includes('"usage"')) {
            try { usage = JSON.parse(line.slice(5)).usage ?? usage; } catch { /* not JSON */ }
          }
        }
      });
      res.on("end", () => resolve(usage?.completion_tokens ?? 0));
    });
    req.on("error", () => resolve(0));
    req.end(payload);
  });
}
async function round(withBias, r) {
  const t0 = performance.now();
  const done = await Promise.all(Array.from({ length: conc }, (_, c) => chat({ model: "bench", stream: true, stream_options: { include_usage: true },
    messages: [{ role: "user", content: `round ${r} client ${c}: the queue batch token` }], max_tokens: tokens, temperature: 0, ignore_eos: true,
    ...(withBias ? { logit_bias: bias } : {}) })));
  return done.reduce((a, b) => a + b, 0) / ((performance.now() - t0) / 1000);
}
await round(false, -1); // warm-up
const res = { bias: [], none: [] };
for (let r = 0; r < rounds; r++) {
  for (const withBias of r % 2 ? [true, false] : [false, true]) {
    const tps = await round(withBias, r);
    res[withBias ? "bias" : "none"].push(tps);
    console.log(`round ${r} ${withBias ? `bias(${biasSize})` : "no bias"}: ${tps.toFixed(0)} tok/s`);
  }
}
const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
console.log(`C=${conc} ${tokens} tokens: median no bias ${med(res.none).toFixed(0)} tok/s, bias(${biasSize}) ${med(res.bias).toFixed(0)} tok/s, ratio ${(med(res.bias) / med(res.none)).toFixed(2)}`);
