#!/usr/bin/env node
// Benchmark: the same streaming load on both engines (llama.cpp and OpenVINO GenAI), same GGUF, this machine
// (issue #11). Prints tables; asserts nothing.
//
// For each model it starts `keel serve --engine llama.cpp` and `keel serve --engine openvino` (one at a time, never
// both: they would share the cores) and runs interleaved rounds: per concurrency C in CONCURRENCY, C clients each
// stream REQS_PER_CLIENT greedy chat completions of TOKENS tokens (ignore_eos) back to back. Per engine and C: aggregate
// tok/s (the server's usage.completion_tokens over first request sent → last response ended), TTFT p50/p99 (request
// written → first content chunk) and ITL p50/p99 (gaps between content chunks), medians over ROUNDS rounds. Then a
// small-pool run on OpenVINO: --num_kv_blocks SMALL_POOL_BLOCKS under C = 8, with the preemptions the engine
// counted (keel_engine_preemptions_total) and whether every stream equalled its solo run.
//
// Run (after `node scripts/prepare.mjs`):
//   node bench/engines.mjs                                  # keel-tiny-f16 and SmolLM2-135M, C = 1,4,8
//   MODELS=keel-tiny-f16 CONCURRENCY=1,8 ROUNDS=1 node bench/engines.mjs
//   MODELS=qwen2.5-coder-0.5b-instruct TOKENS=64 node bench/engines.mjs
//   MODELS= HYBRID=1 node bench/engines.mjs                 # only the tiny hybrid IR (OpenVINO only)
// Then (HYBRID=1, the default) the tiny hybrid (linear-attention) IR of `keel make-model --hybrid-ir` on OpenVINO
// only (llama.cpp cannot load an IR) with the seed's --enable_prefix_caching true --cache_interval_multiplier 64:
// the same load, and the small-pool run (HYBRID_POOL_BLOCKS) with its preemptions.
// Both engines run with 1 engine thread on the 2-core machine (the gateway and clients take the other core).
import { spawn, spawnSync } from "node:child_process";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const BIN = path.join(ROOT, "bin", "keel.mjs");
const env = (name, def) => (process.env[name] ? Number(process.env[name]) : def);
const CFG = {
  MODELS: (process.env.MODELS ?? "keel-tiny-f16,smollm2-135m-instruct").split(",").filter(Boolean),
  HYBRID: env("HYBRID", 1),
  HYBRID_POOL_BLOCKS: env("HYBRID_POOL_BLOCKS", 24),
  CONCURRENCY: (process.env.CONCURRENCY ?? "1,4,8").split(",").map(Number),
  TOKENS: env("TOKENS", 128),
  REQS_PER_CLIENT: env("REQS_PER_CLIENT", 2),
  ROUNDS: env("ROUNDS", 2),
  THREADS: env("THREADS", 1),
  SMALL_POOL_BLOCKS: env("SMALL_POOL_BLOCKS", 12),
  MAX_SECONDS: env("MAX_SECONDS", 1500),
};
const ENGINES = ["llama.cpp", "openvino"];
const PROMPTS = ["Write a story about a lighthouse keeper.", "Explain how a queue works.", "List some rivers of Europe.", "Describe a busy train station.", "What makes bread rise?", "Tell me about the moon.", "How do servers handle load?", "Describe autumn in a forest."];

const watchdog = setTimeout(() => {
  console.error(`bench/engines.mjs: watchdog (${CFG.MAX_SECONDS} s) — stopping`);
  for (const s of live) s.proc.kill("SIGKILL");
  process.exit(3);
}, CFG.MAX_SECONDS * 1000);
watchdog.unref();

/** Servers started and not yet stopped. */
const live = new Set();

function startServer(model, engine, extra = [], prefixFlags = ["--enable_prefix_caching", "false"]) {
  return new Promise((resolve, reject) => {
    const args = [BIN, "serve", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", "--log_format", "json", "--model_path", model, "--model_name", "m", "--engine", engine, "--engine_threads", String(CFG.THREADS), "--max_num_seqs", "8", ...prefixFlags, ...extra];
    const proc = spawn(process.execPath, args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
    const server = { proc, port: 0 };
    live.add(server);
    let ready = false;
    let tail = [];
    const onData = (d) => {
      for (const line of d.toString().split("\n")) {
        if (!line) continue;
        tail = [...tail.slice(-8), line];
        try {
          const j = JSON.parse(line);
          if (j.event === "listening") server.port = j.address.port;
          if (j.event === "engine_ready") ready = true;
        } catch {
          /* not JSON */
        }
        if (ready && server.port) resolve(server);
      }
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    proc.once("exit", (c) => reject(new Error(`server (${engine}, ${model}) exited ${c}: ${tail.join("\n")}`)));
  });
}

async function stopServer(s) {
  live.delete(s);
  const gone = new Promise((r) => s.proc.once("exit", r));
  s.proc.kill("SIGTERM");
  await gone;
}

/** One streamed chat: TTFT, chunk gaps, completion tokens and text. */
function streamChat(port, prompt, tokens) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: prompt }], max_tokens: tokens, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    const t0 = performance.now();
    let first = null;
    let last = null;
    const gaps = [];
    let usage = 0;
    let text = "";
    let buf = "";
    const req = http.request({ host: "127.0.0.1", port, path: "/v3/chat/completions", method: "POST", headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
      res.setEncoding("utf8");
      res.on("data", (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
          const j = JSON.parse(ev.slice(6));
          if (j.usage) usage = j.usage.completion_tokens;
          const c = j.choices?.[0]?.delta?.content;
          if (c) {
            const now = performance.now();
            if (first === null) first = now - t0;
            else gaps.push(now - last);
            last = now;
            text += c;
          }
        }
      });
      res.on("end", () => resolve({ ttft: first ?? NaN, gaps, usage, text }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

const pct = (xs, p) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const median = (xs) => pct(xs, 50);

/** C clients, each REQS_PER_CLIENT requests back to back. */
async function load(port, c) {
  const t0 = performance.now();
  const results = await Promise.all(
    Array.from({ length: c }, async (_, k) => {
      const out = [];
      for (let r = 0; r < CFG.REQS_PER_CLIENT; r++) out.push(await streamChat(port, PROMPTS[(k + r) % PROMPTS.length], CFG.TOKENS));
      return out;
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  const all = results.flat();
  return { tokS: all.reduce((a, r) => a + r.usage, 0) / secs, ttfts: all.map((r) => r.ttft), gaps: all.flatMap((r) => r.gaps) };
}

async function metric(port, name) {
  const text = await new Promise((resolve, reject) => http.get({ host: "127.0.0.1", port, path: "/metrics" }, (res) => {
    let b = "";
    res.on("data", (d) => (b += d));
    res.on("end", () => resolve(b));
  }).on("error", reject));
  const line = text.split("\n").find((l) => l.startsWith(name) && !l.startsWith("#"));
  return line ? Number(line.split(" ").pop()) : NaN;
}

const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : "n/a");

for (const model of CFG.MODELS) {
  /** engine → concurrency → per-round results */
  const res = Object.fromEntries(ENGINES.map((e) => [e, Object.fromEntries(CFG.CONCURRENCY.map((c) => [c, []]))]));
  const loadMs = {};
  for (let round = 0; round < CFG.ROUNDS; round++) {
    // Interleaved: each round runs both engines, alternating which goes first.
    for (const engine of round % 2 === 0 ? ENGINES : [...ENGINES].reverse()) {
      const t = performance.now();
      const s = await startServer(model, engine);
      loadMs[engine] ??= performance.now() - t;
      await streamChat(s.port, PROMPTS[0], 8); // warm-up
      for (const c of CFG.CONCURRENCY) res[engine][c].push(await load(s.port, c));
      await stopServer(s);
    }
  }
  const rows = [];
  for (const c of CFG.CONCURRENCY) {
    const row = { concurrency: c };
    for (const e of ENGINES) {
      const rs = res[e][c];
      row[`${e} tok/s`] = f(median(rs.map((r) => r.tokS)));
      row[`${e} TTFT p50/p99 ms`] = `${f(pct(rs.flatMap((r) => r.ttfts), 50), 0)} / ${f(pct(rs.flatMap((r) => r.ttfts), 99), 0)}`;
      row[`${e} ITL p50/p99 ms`] = `${f(pct(rs.flatMap((r) => r.gaps), 50))} / ${f(pct(rs.flatMap((r) => r.gaps), 99))}`;
    }
    row["openvino / llama.cpp tok/s"] = f(median(res.openvino[c].map((r) => r.tokS)) / median(res["llama.cpp"][c].map((r) => r.tokS)), 2);
    rows.push(row);
  }
  console.log(`\n## ${model}: ${CFG.TOKENS} tokens per request, ${CFG.REQS_PER_CLIENT} requests per client, median of ${CFG.ROUNDS} rounds; server start to ready: llama.cpp ${f(loadMs["llama.cpp"] / 1000)} s, openvino ${f(loadMs.openvino / 1000)} s`);
  console.table(rows);

  await smallPool(model, CFG.SMALL_POOL_BLOCKS);
}

/** Small pool on OpenVINO: preemption actually happening, streams still equal to their solo runs. */
async function smallPool(model, blocks, prefixFlags, label = model) {
  const s = await startServer(model, "openvino", ["--num_kv_blocks", String(blocks), "--max_model_len", String(blocks * 32 - 32)], prefixFlags);
  const solo = [];
  for (const p of PROMPTS) solo.push((await streamChat(s.port, p, CFG.TOKENS)).text);
  const t0 = performance.now();
  const together = await Promise.all(PROMPTS.map((p) => streamChat(s.port, p, CFG.TOKENS)));
  const secs = (performance.now() - t0) / 1000;
  const preemptions = await metric(s.port, "keel_engine_preemptions_total");
  await stopServer(s);
  console.log(`\n## ${label}: OpenVINO with a ${blocks}-block pool (${blocks * 32} tokens), ${PROMPTS.length} streams of ${CFG.TOKENS} tokens at once`);
  console.table([{
    "tok/s": f(together.reduce((a, r) => a + r.usage, 0) / secs),
    "TTFT p50/p99 ms": `${f(pct(together.map((r) => r.ttft), 50), 0)} / ${f(pct(together.map((r) => r.ttft), 99), 0)}`,
    "ITL p50/p99 ms": `${f(pct(together.flatMap((r) => r.gaps), 50))} / ${f(pct(together.flatMap((r) => r.gaps), 99))}`,
    preemptions,
    "streams equal to solo": `${together.filter((r, i) => r.text === solo[i]).length}/${PROMPTS.length}`,
  }]);
}

if (CFG.HYBRID) {
  // The tiny hybrid IR (made once into Keel's cache; this prints its folder).
  const made = spawnSync(process.execPath, [BIN, "make-model", "--hybrid-ir"], { cwd: ROOT, encoding: "utf8" });
  if (made.status !== 0) throw new Error(`keel make-model --hybrid-ir failed: ${made.stderr}`);
  const ir = made.stdout.trim().split("\n").pop();
  const seed = ["--enable_prefix_caching", "true", "--cache_interval_multiplier", "64"];
  const rows = [];
  const t = performance.now();
  const s = await startServer(ir, "openvino", [], seed);
  const startS = (performance.now() - t) / 1000;
  await streamChat(s.port, PROMPTS[0], 8); // warm-up
  for (const c of CFG.CONCURRENCY) {
    const rs = [];
    for (let round = 0; round < CFG.ROUNDS; round++) rs.push(await load(s.port, c));
    rows.push({
      concurrency: c,
      "openvino tok/s": f(median(rs.map((r) => r.tokS))),
      "TTFT p50/p99 ms": `${f(pct(rs.flatMap((r) => r.ttfts), 50), 0)} / ${f(pct(rs.flatMap((r) => r.ttfts), 99), 0)}`,
      "ITL p50/p99 ms": `${f(pct(rs.flatMap((r) => r.gaps), 50))} / ${f(pct(rs.flatMap((r) => r.gaps), 99))}`,
    });
  }
  await stopServer(s);
  console.log(`\n## keel-hybrid-tiny (hybrid IR, OpenVINO only, ${seed.join(" ")}): ${CFG.TOKENS} tokens per request, ${CFG.REQS_PER_CLIENT} requests per client, median of ${CFG.ROUNDS} rounds; start to ready ${f(startS)} s`);
  console.table(rows);
  await smallPool(ir, CFG.HYBRID_POOL_BLOCKS, seed, `keel-hybrid-tiny (${seed.join(" ")})`);
}
clearTimeout(watchdog);
