#!/usr/bin/env node
// Profiles Keel's per-token overhead: starts `keel serve` with V8's CPU profiler on in the gateway and the engine
// (bench/cpu-prof-preload.cjs through NODE_OPTIONS=--require, inherited by the engine child), streams REQS greedy chat requests of TOKENS tokens,
// CONCURRENCY at a time, stops the server with SIGTERM (the profiles are written at exit) and prints
// bench/cpuprof-summary.mjs for each process with µs per generated token. The engine's native decode runs on a
// libuv worker thread, so the main threads' busy time is the JS and binding overhead around it.
//
//   node scripts/prepare.mjs && nice -n 19 node bench/profile-keel.mjs
//   MODEL=/path/model.gguf REQS=20 TOKENS=200 CONCURRENCY=1 PROF_DIR=/tmp/keel-prof KEEL_ARGS="--target_device GPU" node bench/profile-keel.mjs
import { spawn, execFileSync } from "node:child_process";
import { mkdirSync, readdirSync, rmSync } from "node:fs";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const MODEL = process.env.MODEL || "keel-tiny";
const REQS = Number(process.env.REQS || 16);
const TOKENS = Number(process.env.TOKENS || 200);
const CONCURRENCY = Number(process.env.CONCURRENCY || 1);
// PROF_DIR (OUT is still read): on the device machine OUT is the folder whose files come back, emptied first.
const OUT = process.env.PROF_DIR || process.env.OUT || "/tmp/keel-prof";
/** Extra `keel serve` flags, e.g. "--target_device GPU --engine_threads 2". */
const KEEL_ARGS = (process.env.KEEL_ARGS || "").split(" ").filter(Boolean);

rmSync(OUT, { recursive: true, force: true });
mkdirSync(OUT, { recursive: true });
const proc = spawn(process.execPath, [path.join(ROOT, "bin/keel.mjs"), "serve", "--model_path", MODEL, "--model_name", "bench", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", "--log_format", "json", "--max_num_seqs", String(Math.max(1, CONCURRENCY)), "--max_model_len", "2048", ...KEEL_ARGS], {
  cwd: ROOT,
  stdio: ["ignore", "pipe", "inherit"],
  // node refuses --cpu-prof in NODE_OPTIONS: a preloaded script starts the profiler in both processes instead.
  env: { ...process.env, NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ""} --require ${path.join(ROOT, "bench/cpu-prof-preload.cjs")}`, KEEL_CPU_PROF_DIR: OUT },
});
const port = await new Promise((resolve, reject) => {
  let buf = "";
  let port = 0;
  proc.stdout.setEncoding("utf8");
  proc.stdout.on("data", (d) => {
    buf += d;
    for (let i; (i = buf.indexOf("\n")) >= 0; buf = buf.slice(i + 1)) {
      try {
        const j = JSON.parse(buf.slice(0, i));
        if (j.event === "listening") port = j.address.port;
        if (j.event === "engine_ready" && port) resolve(port);
      } catch {
        /* not JSON */
      }
    }
  });
  proc.once("exit", () => reject(new Error("keel exited before ready")));
});

/** One streaming request; resolves with its usage.completion_tokens. */
const chat = (k) =>
  new Promise((resolve, reject) => {
    const body = JSON.stringify({ model: "bench", messages: [{ role: "user", content: `request ${k}: the queue batch token model` }], stream: true, stream_options: { include_usage: true }, max_tokens: TOKENS, temperature: 0, ignore_eos: true });
    const req = http.request({ host: "127.0.0.1", port, path: "/v1/chat/completions", method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => {
        const m = [...text.matchAll(/"completion_tokens":(\d+)/g)].pop();
        resolve(m ? Number(m[1]) : 0);
      });
    });
    req.on("error", reject);
    req.end(body);
  });
let next = 0;
let tokens = 0;
const t0 = performance.now();
await Promise.all(
  Array.from({ length: CONCURRENCY }, async () => {
    // Not `tokens += await chat(...)`: that reads `tokens` before the await, so concurrent clients overwrite each
    // other's counts (this script undercounted that way at concurrency > 1).
    while (next < REQS) {
      const n = await chat(next++);
      tokens += n;
    }
  }),
);
const sec = (performance.now() - t0) / 1000;
console.log(`${tokens} tokens in ${sec.toFixed(2)} s: ${(tokens / sec).toFixed(0)} tok/s at concurrency ${CONCURRENCY} (profiler on)`);
const exited = new Promise((r) => proc.once("exit", r));
proc.kill("SIGTERM");
await exited;
const files = readdirSync(OUT).filter((f) => f.endsWith(".cpuprofile")).map((f) => path.join(OUT, f));
console.log(`profiles (<pid>-keel = gateway, <pid>-main = engine): ${files.join(" ")}`);
console.log(execFileSync(process.execPath, [path.join(ROOT, "bench/cpuprof-summary.mjs"), ...files, "--tokens", String(tokens), "--top", process.env.TOP || "20"], { encoding: "utf8" }));
