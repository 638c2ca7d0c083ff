#!/usr/bin/env node
// Benchmark: the scheduler as clients see it, end to end over loopback HTTP. Prints tables; asserts nothing.
//
// It starts real `node bin/keel.mjs serve --rest_port 0 --rest_bind_address 127.0.0.1 ...` child processes (one per
// configuration; the port comes from the JSON "listening" log line, readiness from "engine_ready"), streams chat
// completions from raw node:http clients against the embedded demo model ("model": "keel-tiny", temperature 0,
// ignore_eos true), stops each server with SIGTERM, and prints console.table results for:
//
//   1. throughput — aggregate generated tok/s at client concurrency 1, 4, 8, 16 (server --max_num_seqs 8), each
//      client sending max(REQS_PER_CLIENT, ceil(MIN_REQS / concurrency)) requests of TOKENS tokens back to back;
//      tokens are the server's usage.completion_tokens, time is first request sent → last response ended; the median
//      of ROUNDS rounds, plus its ratio to concurrency 1.
//   2. prefill interference — SHORT_CLIENTS clients loop short-prompt requests (SHORT_TOKENS tokens each) while
//      LONG_CLIENTS closed-loop clients send LONG_REQS long-prefill requests (~LONG_PROMPT-token prompts, 8 tokens
//      each, a random 0..LONG_GAP_MS pause before each), under --max_num_batched_tokens 32 and 256 (--max_num_seqs 8,
//      so SHORT_CLIENTS + LONG_CLIENTS <= 8 keeps requests from queueing for a sequence). Client-side per-chunk
//      timestamps: TTFT = request written → first non-empty content chunk (long requests, and short requests that
//      overlap a long one, reported separately); ITL = gaps between consecutive content chunks of the short
//      (decode-only) requests that overlap a long request ("ITL p99 (all)" counts every gap).
//   3. abort-to-free — ABORTS streams from ABORT_CLIENTS clients hard-closed (socket.destroy()) at random points
//      (1/8 right after sending, 1/8 when the response headers arrive with a long prompt still prefilling, the rest
//      after 1..64 content chunks) while BYSTANDERS clients keep generating, so all 8 sequences are busy and a queue
//      forms. From the server's own log lines: abortLatencySteps of the "aborted" lines (p50/max), and the ms from
//      each "client_disconnect" line to the "aborted" line of the same requestId (pino "time", ms resolution), overall
//      and by the phase the "client_disconnect" line names.
//   4. prefix reuse — --enable_prefix_caching true vs false: PREFIX_REQS requests (PREFIX_CONC at a time, 16 tokens
//      each) that share a ~PREFIX_SYS-token system prompt with distinct short questions, after one warm-up request
//      with the same system prompt (not measured). TTFT p50/p99, keel_prefix_cache_hit_tokens_total from /metrics,
//      and the on/off ratio.
//
// Run (after a build; the embedded model is generated on first serve if missing):
//   npx tsc -p tsconfig.build.json && node bench/scheduler.mjs
//   node bench/scheduler.mjs throughput abort          # only some sections (throughput, ttft, abort, prefix)
//   ABORTS=80 LONG_REQS=24 node bench/scheduler.mjs     # bigger runs; every knob below is an env variable
// Defaults finish in about 100 s on the 2-core dev machine (102 s measured while other jobs shared the CPU); a
// watchdog kills the servers and exits with code 3 at MAX_SECONDS (default 420).
// Numbers depend on what else runs on the machine (the engine uses 1 thread; the gateway, the clients and this
// script share the other core). Prompt lengths are calibrated once against the server's usage.prompt_tokens.
import { spawn } from "node:child_process";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { lines } from "./lib.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const BIN = path.join(ROOT, "bin", "keel.mjs");

const env = (name, def) => (process.env[name] !== undefined && process.env[name] !== "" ? Number(process.env[name]) : def);
const CFG = {
  TOKENS: env("TOKENS", 128),
  REQS_PER_CLIENT: env("REQS_PER_CLIENT", 3),
  MIN_REQS: env("MIN_REQS", 12),
  ROUNDS: env("ROUNDS", 3),
  CONCURRENCY: (process.env.CONCURRENCY ?? "1,4,8,16").split(",").map(Number),
  SHORT_CLIENTS: env("SHORT_CLIENTS", 4),
  SHORT_TOKENS: env("SHORT_TOKENS", 64),
  LONG_REQS: env("LONG_REQS", 12),
  LONG_PROMPT: env("LONG_PROMPT", 1500),
  LONG_CLIENTS: env("LONG_CLIENTS", 2),
  LONG_GAP_MS: env("LONG_GAP_MS", 300),
  ABORTS: env("ABORTS", 48),
  ABORT_CLIENTS: env("ABORT_CLIENTS", 6),
  BYSTANDERS: env("BYSTANDERS", 6),
  PREFIX_SYS: env("PREFIX_SYS", 1000),
  PREFIX_REQS: env("PREFIX_REQS", 24),
  PREFIX_CONC: env("PREFIX_CONC", 4),
  SEED: env("SEED", 7),
  MAX_SECONDS: env("MAX_SECONDS", 420),
};
const SECTIONS = process.argv.slice(2).length ? process.argv.slice(2) : ["throughput", "ttft", "abort", "prefix"];

// ---------- helpers ----------
function mulberry32(a) {
  return () => {
    a |= 0;
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(CFG.SEED);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};
const r1 = (x) => (Number.isFinite(x) ? Math.round(x * 10) / 10 : null);
const r2 = (x) => (Number.isFinite(x) ? Math.round(x * 100) / 100 : null);

const WORDS = "the queue batch token model server stream request engine slot cache prefix decode prefill budget step latency".split(" ");
let tokensPerWord = 2; // calibrated on the first server
const words = (n, rng = rand) => Array.from({ length: n }, () => WORDS[Math.floor(rng() * WORDS.length)]).join(" ");
/** Text of about `tokens` prompt tokens (body only; the chat template adds a few). */
const textOf = (tokens, rng = rand) => words(Math.max(1, Math.round(tokens / tokensPerWord)), rng);

// ---------- server processes ----------
const servers = new Set();
async function startServer(flags) {
  const proc = spawn(process.execPath, [BIN, "serve", "--model_path", "keel-tiny", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", ...flags], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  const s = { proc, port: 0, flags, logs: [], raw: [], enginePids: new Set() };
  servers.add(s);
  await new Promise((resolve, reject) => {
    let ready = false;
    const onLine = (line) => {
      s.raw.push(line);
      let j;
      try {
        j = JSON.parse(line);
      } catch {
        return;
      }
      s.logs.push(j);
      if (j.event === "listening" && j.address?.port) s.port = j.address.port;
      if (j.event === "engine_ready") {
        ready = true;
        if (j.enginePid) s.enginePids.add(j.enginePid);
      }
      if (s.port && ready) resolve();
    };
    for (const st of [proc.stdout, proc.stderr]) lines(st, onLine);
    proc.once("exit", (code, sig) => reject(new Error(`server exited before ready (${code ?? sig}): ${s.raw.slice(-5).join("\n")}`)));
  });
  return s;
}
async function stopServer(s) {
  servers.delete(s);
  if (s.proc.exitCode !== null || s.proc.signalCode !== null) return;
  const exited = new Promise((r) => s.proc.once("exit", r));
  s.proc.kill("SIGTERM");
  const t = setTimeout(() => s.proc.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(t);
}
async function withServer(flags, fn) {
  const s = await startServer(flags);
  try {
    return await fn(s);
  } finally {
    await stopServer(s);
  }
}
// Last resort (watchdog, Ctrl-C): SIGKILL the servers this script started and their engines (own process groups).
const killAll = () => {
  for (const s of servers) {
    if (s.proc.exitCode === null && s.proc.signalCode === null) s.proc.kill("SIGKILL");
    for (const pid of s.enginePids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        /* already gone */
      }
    }
  }
};
process.on("exit", killAll);
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(130));
const watchdog = setTimeout(() => {
  console.error(`watchdog: ${CFG.MAX_SECONDS} s passed; stopping the servers and exiting`);
  process.exit(3);
}, CFG.MAX_SECONDS * 1000);
watchdog.unref();

function getText(port, p) {
  return new Promise((resolve, reject) => {
    http
      .get({ host: "127.0.0.1", port, path: p, agent: false }, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (d) => (body += d));
        res.on("end", () => resolve(body));
      })
      .on("error", reject);
  });
}
async function metric(port, name) {
  const body = await getText(port, "/metrics");
  let sum = 0;
  for (const line of body.split("\n")) if (line.startsWith(name + " ") || line.startsWith(name + "{")) sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  return sum;
}
const waitFor = async (pred, ms = 10_000) => {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred()) return true;
    await sleep(20);
  }
  return false;
};

/**
 * One streaming chat request over raw node:http. Resolves with client-side timestamps (performance.now() ms):
 * sent (request fully written), chunks[] (arrival of each non-empty content chunk), end; plus usage and requestId.
 * `closeAfterChunks`: hard-close (socket.destroy) once this many content chunks arrived (0 = as soon as it is sent);
 * `closeOnHeaders`: hard-close when the response headers arrive (Keel sends them at admission, before prefill ends).
 */
function chat(port, { messages, maxTokens, closeAfterChunks = null, closeOnHeaders = false, timeoutMs = 120_000 }) {
  return new Promise((resolve) => {
    const r = { status: 0, t0: performance.now(), sent: NaN, chunks: [], end: NaN, usage: null, requestId: null, closed: false, done: false, error: null };
    const payload = JSON.stringify({ model: "keel-tiny", messages, stream: true, stream_options: { include_usage: true }, max_tokens: maxTokens, temperature: 0, ignore_eos: true });
    let socket = null;
    let settled = false;
    const settle = () => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      r.end = performance.now();
      resolve(r);
    };
    const hardClose = () => {
      if (r.closed) return;
      r.closed = true;
      socket?.destroy();
      settle();
    };
    const timer = setTimeout(() => {
      r.error = "timeout";
      hardClose();
    }, timeoutMs);
    const req = http.request({ host: "127.0.0.1", port, path: "/v3/chat/completions", method: "POST", agent: false, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) } });
    req.on("socket", (s) => (socket = s));
    req.on("error", (e) => {
      if (!r.closed) r.error = e.message;
      settle();
    });
    req.on("response", (res) => {
      r.status = res.statusCode;
      r.requestId = res.headers["x-request-id"] ?? null;
      if (closeOnHeaders) return hardClose();
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (d) => {
        if (r.closed) return;
        const now = performance.now();
        buf += d;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const raw = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!raw.startsWith("data: ")) continue;
          const data = raw.slice(6);
          if (data === "[DONE]") {
            r.done = true;
            continue;
          }
          const ev = JSON.parse(data);
          if (ev.error) r.error = ev.error.message;
          if (ev.usage) r.usage = ev.usage;
          if (ev.choices?.[0]?.delta?.content) {
            r.chunks.push(now);
            if (closeAfterChunks !== null && r.chunks.length >= closeAfterChunks) return hardClose();
          }
        }
      });
      res.on("end", settle);
      res.on("close", settle);
      res.on("error", settle);
    });
    req.end(payload, () => {
      r.sent = performance.now();
      if (closeAfterChunks === 0) hardClose();
    });
  });
}
const userMsg = (text) => [{ role: "user", content: text }];
const ttftOf = (r) => (r.chunks.length ? r.chunks[0] - r.sent : NaN);

// ---------- 0. calibration ----------
async function calibrate(port) {
  const n = 400;
  const r = await chat(port, { messages: userMsg(words(n)), maxTokens: 1 });
  const r0 = await chat(port, { messages: userMsg(words(1)), maxTokens: 1 });
  if (r.usage && r0.usage) tokensPerWord = (r.usage.prompt_tokens - r0.usage.prompt_tokens) / (n - 1);
  return { tokensPerWord: r2(tokensPerWord), templateTokens: r0.usage ? r0.usage.prompt_tokens - Math.round(tokensPerWord) : null };
}

// ---------- 1. throughput ----------
async function throughput() {
  return withServer(["--max_num_seqs", "8"], async (s) => {
    const cal = await calibrate(s.port);
    console.log(`calibration: ${cal.tokensPerWord} prompt tokens per word, ~${cal.templateTokens} template tokens`);
    await chat(s.port, { messages: userMsg("warm up"), maxTokens: 16 });
    const rows = [];
    for (const c of CFG.CONCURRENCY) {
      const perClient = Math.max(CFG.REQS_PER_CLIENT, Math.ceil(CFG.MIN_REQS / c));
      const rounds = [];
      for (let round = 0; round < CFG.ROUNDS; round++) {
        let tokens = 0;
        let errors = 0;
        const t0 = performance.now();
        await Promise.all(
          Array.from({ length: c }, async (_, ci) => {
            for (let k = 0; k < perClient; k++) {
              const r = await chat(s.port, { messages: userMsg(`client ${ci} request ${k}: ${words(12)}`), maxTokens: CFG.TOKENS });
              if (r.error || !r.done) errors++;
              tokens += r.usage?.completion_tokens ?? 0;
            }
          }),
        );
        const sec = (performance.now() - t0) / 1000;
        rounds.push({ tokens, sec, tps: tokens / sec, errors });
      }
      const tps = rounds.map((x) => x.tps).sort((a, b) => a - b);
      rows.push({
        concurrency: c,
        "requests/round": c * perClient,
        "tokens/round": rounds[0].tokens,
        "tok/s median": Math.round(tps[Math.floor((tps.length - 1) / 2)]),
        "tok/s min": Math.round(tps[0]),
        "tok/s max": Math.round(tps[tps.length - 1]),
        errors: rounds.reduce((a, x) => a + x.errors, 0),
      });
    }
    for (const row of rows) row["ratio vs c=1"] = r2(row["tok/s median"] / rows[0]["tok/s median"]);
    console.log(`\n1. Aggregate generated tok/s (--max_num_seqs 8, ${CFG.TOKENS} tokens per request, median of ${CFG.ROUNDS} rounds)`);
    console.table(rows);
  });
}

// ---------- 2. TTFT / ITL with long prefills ----------
async function ttftRun(budget) {
  return withServer(["--max_num_seqs", "8", "--max_num_batched_tokens", String(budget)], async (s) => {
    await chat(s.port, { messages: userMsg("warm up"), maxTokens: 8 });
    const longWindows = []; // [start, end] of each long request, to tag ITL gaps that overlap a prefill
    let stop = false;
    const shorts = [];
    const shortLoops = Array.from({ length: CFG.SHORT_CLIENTS }, async (_, ci) => {
      for (let k = 0; !stop; k++) {
        const r = await chat(s.port, { messages: userMsg(`short ${ci}.${k}: ${words(6)}`), maxTokens: CFG.SHORT_TOKENS });
        shorts.push(r);
      }
    });
    await sleep(300); // let the shorts reach steady decode
    // LONG_CLIENTS closed-loop clients share LONG_REQS long requests, with a random 0..LONG_GAP_MS pause before each:
    // SHORT_CLIENTS + LONG_CLIENTS <= --max_num_seqs, so nothing queues for a sequence and TTFT is prefill, not queueing.
    let nextLong = 0;
    const longs = [];
    await Promise.all(
      Array.from({ length: CFG.LONG_CLIENTS }, async () => {
        while (nextLong < CFG.LONG_REQS) {
          const i = nextLong++;
          await sleep(rand() * CFG.LONG_GAP_MS);
          // A distinct leading marker keeps the prefix cache out of it.
          const r = await chat(s.port, { messages: userMsg(`long ${i} ${Math.floor(rand() * 1e9)} ${textOf(CFG.LONG_PROMPT)}`), maxTokens: 8 });
          longWindows.push([r.sent, r.end]);
          longs.push(r);
        }
      }),
    );
    stop = true;
    await Promise.all(shortLoops);
    const overlaps = (a, b) => longWindows.some(([x, y]) => a < y && b > x);
    const itlAll = [];
    const itlDuring = [];
    for (const r of shorts) {
      for (let i = 1; i < r.chunks.length; i++) {
        const g = r.chunks[i] - r.chunks[i - 1];
        itlAll.push(g);
        if (overlaps(r.chunks[i - 1], r.chunks[i])) itlDuring.push(g);
      }
    }
    const shortDuring = shorts.filter((r) => overlaps(r.sent, r.end));
    const longPrompt = longs.map((r) => r.usage?.prompt_tokens ?? 0);
    const errs = [...shorts, ...longs].filter((r) => r.error || !r.done).length;
    return {
      "--max_num_batched_tokens": budget,
      "long reqs": longs.length,
      "long prompt tok": Math.round(longPrompt.reduce((a, b) => a + b, 0) / Math.max(1, longPrompt.length)),
      "long TTFT p50": r1(pct(longs.map(ttftOf), 50)),
      "long TTFT p99": r1(pct(longs.map(ttftOf), 99)),
      "short reqs": shortDuring.length,
      "short TTFT p50": r1(pct(shortDuring.map(ttftOf), 50)),
      "short TTFT p99": r1(pct(shortDuring.map(ttftOf), 99)),
      "short ITL p50": r1(pct(itlDuring, 50)),
      "short ITL p99": r1(pct(itlDuring, 99)),
      "ITL p99 (all)": r1(pct(itlAll, 99)),
      "ITL max": r1(Math.max(...itlDuring)),
      errors: errs,
    };
  });
}
async function ttft() {
  const rows = [];
  for (const b of [32, 256]) rows.push(await ttftRun(b));
  console.log(
    `\n2. TTFT / ITL in ms (--max_num_seqs 8): ${CFG.LONG_REQS} long-prefill requests (~${CFG.LONG_PROMPT}-token prompts, 8 tokens) from ${CFG.LONG_CLIENTS} closed-loop clients ` +
      `(0-${CFG.LONG_GAP_MS} ms pause before each) while ${CFG.SHORT_CLIENTS} clients loop short requests (${CFG.SHORT_TOKENS} tokens). ` +
      `"short" = short requests overlapping a long one; "short ITL" = gaps between content chunks that overlap a long request; "ITL p99 (all)" = every gap`,
  );
  console.table(rows);
}

// ---------- 3. abort-to-free ----------
async function abort() {
  return withServer(["--max_num_seqs", "8"], async (s) => {
    await chat(s.port, { messages: userMsg("warm up"), maxTokens: 8 });
    let stop = false;
    let bystanderErrors = 0;
    let bystanderDone = 0;
    const bystanders = Array.from({ length: CFG.BYSTANDERS }, async (_, ci) => {
      for (let k = 0; !stop; k++) {
        const r = await chat(s.port, { messages: userMsg(`bystander ${ci}.${k}: ${words(20)}`), maxTokens: 96 });
        if (r.error || !r.done) bystanderErrors++;
        else bystanderDone++;
      }
    });
    await sleep(200);
    let next = 0;
    const closes = [];
    const aborters = Array.from({ length: CFG.ABORT_CLIENTS }, async () => {
      while (next < CFG.ABORTS) {
        const i = next++;
        // 1 in 8 closes right after sending (queued), 1 in 8 on the response headers with a ~1200-token prompt
        // (prefill), the rest after 1..64 content chunks (decode; a quarter of them with ~600-token prompts).
        const u = rand();
        const mode = u < 0.125 ? "send" : u < 0.25 ? "headers" : "chunks";
        const after = mode === "send" ? 0 : mode === "chunks" ? 1 + Math.floor(rand() * 64) : null;
        const promptTok = mode === "headers" ? 1200 : mode === "chunks" && rand() < 0.25 ? 600 : 0;
        const r = await chat(s.port, { messages: userMsg(`aborter ${i} ${Math.floor(rand() * 1e9)}: ${promptTok ? textOf(promptTok) : words(10)}`), maxTokens: 256, closeAfterChunks: after, closeOnHeaders: mode === "headers" });
        closes.push({ mode, closed: r.closed, requestId: r.requestId });
        await sleep(rand() * 50);
      }
    });
    await Promise.all(aborters);
    stop = true;
    await Promise.all(bystanders);
    // Let the server log the last aborts.
    await waitFor(async () => (await metric(s.port, "keel_requests_running")) === 0 && (await metric(s.port, "keel_requests_waiting")) === 0, 15_000);
    await sleep(200);
    const disc = new Map();
    const abortedLines = [];
    for (const j of s.logs) {
      if (j.event === "client_disconnect" && j.requestId) disc.set(j.requestId, j);
      if (j.event === "aborted") abortedLines.push(j);
    }
    const steps = abortedLines.map((j) => j.abortLatencySteps).filter((x) => typeof x === "number");
    const ms = [];
    const byPhase = {};
    for (const a of abortedLines) {
      const d = disc.get(a.requestId);
      const ph = d?.phase ?? a.phase ?? "?";
      (byPhase[ph] ??= { steps: [], ms: [] });
      if (typeof a.abortLatencySteps === "number") byPhase[ph].steps.push(a.abortLatencySteps);
      if (d) {
        ms.push(a.time - d.time);
        byPhase[ph].ms.push(a.time - d.time);
      }
    }
    const row = (label, st, m, n) => ({
      phase: label,
      "aborted lines": n,
      "with steps": st.length,
      "steps p50": pct(st, 50),
      "steps max": st.length ? Math.max(...st) : null,
      "disconnect→aborted ms p50": pct(m, 50),
      "ms p99": pct(m, 99),
      "ms max": m.length ? Math.max(...m) : null,
    });
    const rows = [row("all", steps, ms, abortedLines.length)];
    const order = ["queued", "prefill", "decode"];
    const phases = Object.entries(byPhase).sort(([a], [b]) => (order.indexOf(a) + 4) % 4 - (order.indexOf(b) + 4) % 4);
    for (const [ph, v] of phases) rows.push(row(ph, v.steps, v.ms, abortedLines.filter((a) => (disc.get(a.requestId)?.phase ?? a.phase ?? "?") === ph).length));
    const disconnects = await metric(s.port, "keel_client_disconnects_total");
    const finishedAbort = Number((await getText(s.port, "/metrics")).match(/keel_requests_finished_total\{finish_reason="abort"\} (\d+)/)?.[1] ?? NaN);
    console.log(
      `\n3. Abort-to-free (${CFG.ABORTS} hard closes from ${CFG.ABORT_CLIENTS} clients, ${CFG.BYSTANDERS} bystander clients, --max_num_seqs 8): ` +
        `client closes that happened ${closes.filter((c) => c.closed).length}, client_disconnect lines ${disc.size}, ` +
        `keel_client_disconnects_total ${disconnects}, finished{abort} ${finishedAbort}, bystanders completed ${bystanderDone} with ${bystanderErrors} errors`,
    );
    console.table(rows);
  });
}

// ---------- 4. prefix reuse ----------
async function prefixRun(on, sysText) {
  return withServer(["--max_num_seqs", "8", "--enable_prefix_caching", String(on)], async (s) => {
    const rng = mulberry32(CFG.SEED + 1); // same questions for on and off
    await chat(s.port, { messages: [{ role: "system", content: sysText }, { role: "user", content: "warm up question" }], maxTokens: 16 });
    const hits0 = await metric(s.port, "keel_prefix_cache_hit_tokens_total");
    let next = 0;
    const results = [];
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: CFG.PREFIX_CONC }, async () => {
        while (next < CFG.PREFIX_REQS) {
          const i = next++;
          results.push(await chat(s.port, { messages: [{ role: "system", content: sysText }, { role: "user", content: `question ${i}: ${words(8, rng)}?` }], maxTokens: 16 }));
        }
      }),
    );
    const sec = (performance.now() - t0) / 1000;
    const hits = (await metric(s.port, "keel_prefix_cache_hit_tokens_total")) - hits0;
    const t = results.map(ttftOf);
    const prompt = results.reduce((a, r) => a + (r.usage?.prompt_tokens ?? 0), 0) / results.length;
    return {
      "--enable_prefix_caching": on,
      requests: results.length,
      "prompt tok": Math.round(prompt),
      "TTFT p50": r1(pct(t, 50)),
      "TTFT p99": r1(pct(t, 99)),
      "prefix hit tokens": hits,
      "hit tok / req": Math.round(hits / results.length),
      seconds: r2(sec),
      errors: results.filter((r) => r.error || !r.done).length,
    };
  });
}
async function prefix() {
  const sysText = `You are a support assistant. ${textOf(CFG.PREFIX_SYS, mulberry32(CFG.SEED + 2))}`;
  const onRow = await prefixRun(true, sysText);
  const offRow = await prefixRun(false, sysText);
  const ratio = {
    "--enable_prefix_caching": "ratio on/off",
    requests: null,
    "prompt tok": null,
    "TTFT p50": r2(onRow["TTFT p50"] / offRow["TTFT p50"]),
    "TTFT p99": r2(onRow["TTFT p99"] / offRow["TTFT p99"]),
    "prefix hit tokens": null,
    "hit tok / req": null,
    seconds: r2(onRow.seconds / offRow.seconds),
    errors: null,
  };
  console.log(`\n4. Prefix reuse: ${CFG.PREFIX_REQS} requests, ${CFG.PREFIX_CONC} at a time, sharing a ~${CFG.PREFIX_SYS}-token system prompt (16 tokens each; TTFT in ms; after one unmeasured warm-up)`);
  console.table([onRow, offRow, ratio]);
}

// ---------- main ----------
const tStart = performance.now();
console.log(`bench/scheduler.mjs — sections: ${SECTIONS.join(", ")}; config: ${JSON.stringify(CFG)}`);
if (!SECTIONS.includes("throughput")) {
  // Calibrate prompt lengths on a short-lived server.
  await withServer([], async (s) => console.log(`calibration: ${JSON.stringify(await calibrate(s.port))}`));
}
const run = { throughput, ttft, abort, prefix };
for (const name of SECTIONS) {
  if (!run[name]) throw new Error(`unknown section "${name}" (throughput, ttft, abort, prefix)`);
  await run[name]();
}
console.log(`\ntotal ${r1((performance.now() - tStart) / 1000)} s`);
clearTimeout(watchdog);
