#!/usr/bin/env node
// Benchmark: where a streamed request's first token goes, by phase (keel_request_ttft_phase_seconds): accept (HTTP
// request received → its add written: body, validation, chat template, admission), engine (add written → the step
// message with the first token read back) and deliver (that message → the first byte to the client), plus the
// client's own TTFT. Starts `keel serve` (the embedded model unless --model), sends ROUNDS rounds of C simultaneous
// streaming requests (greedy, 1 token unless --tokens) for each C of --concurrency, and prints the mean and p50 of
// each phase per C from the server's own histogram sums and the client's clock. Prints tables; asserts nothing.
//
//   npx tsc -p tsconfig.build.json && node bench/ttft-phases.mjs [--concurrency 1,8] [--rounds 40] [--tokens 1]
//     [--model PATH] [--prompt-words 60] [--args "--target_device GPU"]
import { spawn } from "node:child_process";
import http from "node:http";
import path from "node:path";
import { arg, benchModel, freePort, httpGet, killGroup, median, ROOT, waitReady } from "./lib.mjs";

const CONCURRENCY = arg("concurrency", "1,8").split(",").map(Number);
const ROUNDS = Number(arg("rounds", "40"));
const TOKENS = Number(arg("tokens", "1"));
const WORDS = Number(arg("prompt-words", "60"));
const EXTRA = arg("args", "").split(" ").filter(Boolean);
const model = await benchModel();
const port = await freePort();
const slots = Math.max(...CONCURRENCY);
const proc = spawn(process.execPath, [path.join(ROOT, "bin/keel.mjs"), "serve", "--model_path", model, "--model_name", "bench", "--rest_port", String(port), "--rest_bind_address", "127.0.0.1", "--log_level", "WARNING", "--max_num_seqs", String(slots), "--max_model_len", "1024", ...EXTRA], { cwd: ROOT, stdio: ["ignore", "pipe", process.env.TRACE ? "inherit" : "pipe"], detached: true });
try {
  await waitReady(proc, "keel", async () => (await httpGet(port, "/v2/health/ready")).status === 200);
  const agent = new http.Agent({ keepAlive: true, maxSockets: slots });
  const words = "the queue batch token model step engine prefix cache stream".split(" ");
  let k = 0;
  /** One streamed request; resolves with the client's TTFT (ms: request written → first content chunk). */
  const one = () =>
    new Promise((resolve, reject) => {
      const n = k++;
      const content = `request ${n}: ` + Array.from({ length: WORDS }, (_, i) => words[(i * 7 + n) % words.length]).join(" ");
      const body = JSON.stringify({ model: "bench", messages: [{ role: "user", content }], stream: true, max_tokens: TOKENS, temperature: 0, ignore_eos: true });
      const t0 = performance.now();
      let first = null;
      const req = http.request({ host: "127.0.0.1", port, path: "/v1/chat/completions", method: "POST", agent, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
        res.setEncoding("utf8");
        res.on("data", (d) => {
          if (first === null && d.includes('"content":"') && !d.includes('"content":""')) first = performance.now() - t0;
        });
        res.on("end", () => (res.statusCode === 200 ? resolve(first ?? performance.now() - t0) : reject(new Error(`status ${res.statusCode}`))));
      });
      req.on("error", reject);
      req.end(body);
    });
  /** The phase histogram's sums and counts now. */
  const phases = async () => {
    const text = (await httpGet(port, "/metrics")).body;
    const read = (kind, phase) => Number(new RegExp(`^keel_request_ttft_phase_seconds_${kind}\\{phase="${phase}"\\} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
    return Object.fromEntries(["accept", "engine", "deliver"].map((p) => [p, { sum: read("sum", p), count: read("count", p) }]));
  };
  for (let r = 0; r < 3; r++) await Promise.all(Array.from({ length: slots }, one)); // warm-up
  console.log(`model ${path.basename(model)}, ${TOKENS} token(s), ~${WORDS}-word prompts, ${ROUNDS} rounds per C`);
  console.log("| C | client TTFT p50 ms | client TTFT mean ms | accept mean ms | engine mean ms | deliver mean ms |");
  console.log("| --: | --: | --: | --: | --: | --: |");
  for (const c of CONCURRENCY) {
    const before = await phases();
    const ttft = [];
    for (let r = 0; r < ROUNDS; r++) ttft.push(...(await Promise.all(Array.from({ length: c }, one))));
    const after = await phases();
    const mean = (p) => ((after[p].sum - before[p].sum) / Math.max(1, after[p].count - before[p].count)) * 1000;
    const f = (x) => x.toFixed(3);
    console.log(`| ${c} | ${f(median(ttft))} | ${f(ttft.reduce((a, b) => a + b, 0) / ttft.length)} | ${f(mean("accept"))} | ${f(mean("engine"))} | ${f(mean("deliver"))} |`);
  }
  agent.destroy();
} finally {
  killGroup(proc, "SIGTERM");
}
