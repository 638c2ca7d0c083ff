#!/usr/bin/env node
// Benchmark: Keel side by side with another OpenAI-compatible server (default: llama-server built from the llama.cpp
// source node-llama-cpp ships, bench/build-llama-server.sh), same GGUF, same settings. Prints tables; asserts nothing.
// Run `node bench/compare.mjs --help` for the options.
import { spawn } from "node:child_process";
import { appendFileSync, existsSync, mkdirSync, readFileSync } from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { freePort, httpGet, killGroup, lines, serverGroups, waitReady } from "./lib.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const KEEL_BIN = path.join(ROOT, "bin", "keel.mjs");

const HELP = `Usage: node bench/compare.mjs [--flag value ...] [sections]

Keel (node bin/keel.mjs serve, the built dist/: run \`node scripts/prepare.mjs\` first) against another
OpenAI-compatible server, same GGUF, greedy streaming chat with ignore_eos, tokens counted from the servers'
usage (stream_options.include_usage). Rounds are interleaved (Keel, other, other, Keel, ...) with both servers
up, so drift in machine load hits both alike. Per concurrency C both servers get C sequence slots.

Sections (default: all):
  throughput  C closed-loop clients, each sending --reqs requests (at least --min-reqs in all) of --tokens tokens;
              aggregate tok/s (median of --rounds rounds; first request sent -> last finished), TTFT p50/p99
              (request written -> first content chunk) and ITL p50/p99 (gaps between content chunks of one
              request), pooled over rounds; ratios Keel/other.
  mixed       --mixed-decoders clients decode --tokens-token answers back to back while --mixed-long clients send
              ~--long-prompt-token prompts (8 tokens each, a random 0..300 ms pause before each): decoders' tok/s,
              their ITL p99 while a long prompt is in flight, long-prompt TTFT p50/p99.
  storm       --storm-conc closed-loop clients; a quarter of the requests are hard-closed (socket.destroy) after a
              random 1..tokens-1 content chunks and the client goes on with its next request. Survivors' per-stream
              tok/s (completion tokens / (end - sent)) vs the same load with nothing killed; survivor failures.

Options (flag, or the env variable in brackets):
  --model NAME|FILE      keel-tiny (default), keel-tiny-qwen3, a \`keel fetch\` catalogue name (must be cached:
                         keel fetch NAME), or a .gguf path                                   [MODEL]
  --gpu                  GPU run: both servers offload every layer (Keel --target_device GPU, llama-server -ngl 999)
                         and the default concurrency becomes 1,8,32,64                       [GPU=1]
  --concurrency LIST     comma-separated (default 1,4,8,16; with --gpu 1,8,32,64)            [CONCURRENCY]
  --tokens N             max_tokens per request (default 200)                                [TOKENS]
  --rounds N             interleaved rounds per concurrency (default 3)                      [ROUNDS]
  --reqs N               requests per client per round (default 2)                           [REQS]
  --min-reqs N           at least this many requests per round in all (default 8)            [MIN_REQS]
  --ctx N                context per sequence slot (default 2048; llama-server gets -c ctx*slots) [CTX]
  --batch N              tokens per engine step: Keel --max_num_batched_tokens, llama-server -b/-ub (default 256) [BATCH]
  --threads N            CPU threads of both engines (default: 1 on <= 2 CPUs, else CPUs - 1)  [THREADS]
  --llama-server FILE    llama-server binary (default: the one bench/build-llama-server.sh built) [LLAMA_SERVER]
  --other-cmd CMD        start the other server with this shell command instead; placeholders {port} {slots}
                         {ctx} {kv} (= ctx*slots) {model} {threads} {batch} {ngl}; it must answer GET /health
                         or GET /v1/models with 200 when ready                                [OTHER_CMD]
  --other-name NAME      label of the other server (default llama-server)                     [OTHER_NAME]
  --flash-attention on|off  flash attention for both servers (Keel --flash_attention, llama-server -fa; default off)
                                                                                             [FLASH_ATTENTION]
  --temperature T        sampling temperature of every request (default 0: greedy); > 0 measures sampled
                         requests, with top_k 40, top_p 0.95, min_p 0.05 for both servers      [TEMPERATURE]
  --keel-args "..."      extra flags for keel serve (space-separated)                        [KEEL_ARGS]
  (env COMPARE_TRACE=DIR: each throughput request's timeline to DIR/requests.jsonl, Keel's log at TRACE to DIR/keel.log)
  --other-args "..."     extra flags for the default llama-server command                    [OTHER_ARGS]
  --mixed-decoders N (4) --mixed-long N (2) --long-reqs N (6) --long-prompt N (1500)
  --storm-conc N (8) --storm-reqs N (per client, 4)
  --seed N (7)  --max-seconds N (watchdog, default 1800)
  --help

Examples:
  bash bench/build-llama-server.sh && node scripts/prepare.mjs
  nice -n 19 node bench/compare.mjs                               # keel-tiny, everything
  nice -n 19 node bench/compare.mjs --model smollm2-135m-instruct throughput
  node bench/compare.mjs --gpu --llama-server /path/llama-server --model big.gguf
`;

// ---------- options ----------
const argv = process.argv.slice(2);
if (argv.includes("--help") || argv.includes("-h")) {
  process.stdout.write(HELP);
  process.exit(0);
}
const flags = new Map();
const sections = [];
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (!a.startsWith("--")) {
    sections.push(a);
    continue;
  }
  const eq = a.indexOf("=");
  if (eq > 0) flags.set(a.slice(2, eq), a.slice(eq + 1));
  else if (a === "--gpu") flags.set("gpu", "1");
  else flags.set(a.slice(2), argv[++i]);
}
const KNOWN = new Set("flash-attention model gpu concurrency tokens rounds reqs min-reqs ctx batch threads llama-server other-cmd other-name keel-args other-args mixed-decoders mixed-long long-reqs long-prompt storm-conc storm-reqs seed max-seconds temperature".split(" "));
for (const k of flags.keys()) if (!KNOWN.has(k)) fail(`unknown option --${k} (see --help)`);
for (const s of sections) if (!["throughput", "mixed", "storm"].includes(s)) fail(`unknown section ${s} (throughput, mixed, storm)`);
function fail(msg) {
  console.error(msg);
  process.exit(2);
}
/** Flag, else env variable (upper case, - → _), else default. */
const opt = (name, def) => flags.get(name) ?? (process.env[name.toUpperCase().replaceAll("-", "_")] || def);
const num = (name, def) => {
  const v = Number(opt(name, def));
  if (!Number.isFinite(v) || v < 0) fail(`--${name} must be a number`);
  return v;
};
const GPU = opt("gpu", "") === "1" || opt("gpu", "") === "true";
/** COMPARE_TRACE=DIR: throughput requests' timelines (requests.jsonl) and Keel's log at TRACE (keel.log) go there. */
const TRACE_DIR = process.env.COMPARE_TRACE || "";
if (TRACE_DIR) mkdirSync(TRACE_DIR, { recursive: true });
const CFG = {
  model: opt("model", "keel-tiny"),
  concurrency: String(opt("concurrency", GPU ? "1,8,32,64" : "1,4,8,16")).split(",").map(Number),
  tokens: num("tokens", 200),
  rounds: num("rounds", 3),
  reqs: num("reqs", 2),
  minReqs: num("min-reqs", 8),
  ctx: num("ctx", 2048),
  batch: num("batch", 256),
  threads: num("threads", os.availableParallelism() <= 2 ? 1 : os.availableParallelism() - 1),
  otherCmd: opt("other-cmd", ""),
  otherName: opt("other-name", "llama-server"),
  keelArgs: String(opt("keel-args", "")).split(" ").filter(Boolean),
  otherArgs: String(opt("other-args", "")).split(" ").filter(Boolean),
  mixedDecoders: num("mixed-decoders", 4),
  mixedLong: num("mixed-long", 2),
  longReqs: num("long-reqs", 6),
  longPrompt: num("long-prompt", 1500),
  stormConc: num("storm-conc", 8),
  stormReqs: num("storm-reqs", 4),
  flashAttention: opt("flash-attention", "off"),
  temperature: num("temperature", 0),
  seed: num("seed", 7),
  maxSeconds: num("max-seconds", 1800),
};
if (!["on", "off"].includes(CFG.flashAttention)) fail("--flash-attention must be on or off");
/** Sampled requests name llama-server's default chain (top_k 40, top_p 0.95, min_p 0.05), so both servers run the same one. */
const SAMPLED = CFG.temperature > 0 ? { top_k: 40, top_p: 0.95, min_p: 0.05 } : {};
const SECTIONS = sections.length ? sections : ["throughput", "mixed", "storm"];

// ---------- small helpers ----------
function mulberry32(a) {
  return () => {
    a |= 0;
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(CFG.seed);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = Float64Array.from(xs).sort();
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};
const median = (xs) => pct(xs, 50);
const r0 = (x) => (Number.isFinite(x) ? Math.round(x) : null);
const r1 = (x) => (Number.isFinite(x) ? Math.round(x * 10) / 10 : null);
const r2 = (x) => (Number.isFinite(x) ? Math.round(x * 100) / 100 : null);
const WORDS = "the queue batch token model server stream request engine slot cache prefix decode prefill budget step latency".split(" ");
const words = (n) => Array.from({ length: n }, () => WORDS[Math.floor(rand() * WORDS.length)]).join(" ");

// ---------- the model file both servers load ----------
async function resolveModel(name) {
  if (name.endsWith(".gguf")) {
    if (!existsSync(name)) fail(`no such model file ${name}`);
    return path.resolve(name);
  }
  const tiny = await import("../dist/model/default-model.js");
  if (tiny.isTinyModelName(name)) return tiny.ensureTinyModel(name);
  const cache = await import("../dist/model/model-cache.js");
  if (cache.isCatalogueName(name)) {
    const file = await cache.findCachedModel(cache.catalogueModel(name));
    if (!file) fail(`${name} is not cached: run node bin/keel.mjs fetch ${name}`);
    return file;
  }
  fail(`unknown model ${name}: a .gguf path, a keel-tiny name or a catalogue name`);
}

/**
 * A logit_bias banning every token whose bytes are not ASCII, for the random-weight keel-tiny models: their greedy
 * text is random bytes, and llama-server's chat output parser rejects invalid UTF-8 at the end of a stream (a 500
 * "does not match the expected ... format"), where Keel sends U+FFFD. Both servers get the same bias.
 */
async function asciiOnlyBias(info) {
  const { unicodeToBytes } = await import("../dist/model/bpe.js");
  const tokens = info.tokens;
  const toByte = unicodeToBytes();
  const bias = {};
  tokens.forEach((t, id) => {
    if ([...t].some((ch) => (toByte.get(ch) ?? 0) >= 0x80)) bias[id] = -100;
  });
  return bias;
}
/**
 * The model's name and token strings, from its GGUF metadata (node-llama-cpp's reader: any tensor type, any size;
 * Keel's own header reader knows only the types its writer emits).
 */
async function readModelInfo(file) {
  const { readGgufFileInfo } = await import("node-llama-cpp");
  const info = await readGgufFileInfo(file, { readTensorInfo: false });
  return { name: String(info.metadata?.general?.name ?? ""), tokens: info.metadata?.tokenizer?.ggml?.tokens ?? [] };
}
/** Extra body fields of every request (the ASCII bias for keel-tiny models). */
let extraBody = {};

// ---------- processes (own process groups; killed on exit whatever happens) ----------
const live = serverGroups();
setTimeout(() => {
  console.error(`watchdog: ${CFG.maxSeconds} s passed; stopping the servers and exiting`);
  process.exit(3);
}, CFG.maxSeconds * 1000).unref();
/** Keel's cumulative step-phase sums (seconds) and counts from /metrics (keel_engine_step_phase_seconds, step requests). */
async function keelPhases(port) {
  const { body: text } = await httpGet(port, "/metrics");
  const num = (re) => Number(text.match(re)?.[1] ?? NaN);
  const ph = (name) => num(new RegExp(`^keel_engine_step_phase_seconds_sum\\{phase="${name}"\\} (\\S+)`, "m"));
  return {
    decode: ph("decode"),
    sample: ph("sample"),
    other: ph("other"),
    steps: num(/^keel_engine_step_phase_seconds_count\{phase="decode"\} (\S+)/m),
    seqs: num(/^keel_engine_step_requests_sum (\S+)/m),
    ttft: Object.fromEntries(["accept", "engine", "deliver"].map((k) => [k, num(new RegExp(`^keel_request_ttft_phase_seconds_sum\\{phase="${k}"\\} (\\S+)`, "m"))])),
    ttftCount: num(/^keel_request_ttft_phase_seconds_count\{phase="accept"\} (\S+)/m),
    queue: num(/^keel_request_queue_time_seconds_sum (\S+)/m),
    queueCount: num(/^keel_request_queue_time_seconds_count (\S+)/m),
    at: performance.now(),
  };
}
/** Per decoding step in a window between two keelPhases snapshots: ms in decode / sample / other, and between steps. */
function phaseRow(a, b) {
  const steps = b.steps - a.steps;
  if (!(steps > 0)) return null;
  const per = (k) => ((b[k] - a[k]) * 1000) / steps;
  const wall = (b.at - a.at) / steps;
  const seqs = (b.seqs - a.seqs) / steps;
  return { steps, seqsPerStep: seqs, decode: per("decode"), sample: per("sample"), other: per("other"), between: wall - per("decode") - per("sample") - per("other"), samplePerSeqUs: (per("sample") * 1000) / Math.max(seqs, 1e-9) };
}
/** Mean ms per request of each first-token phase (keel_request_ttft_phase_seconds) and of the engine's queue time in a window. */
function ttftRow(a, b) {
  const n = b.ttftCount - a.ttftCount;
  if (!(n > 0)) return null;
  const ms = (k) => ((b.ttft[k] - a.ttft[k]) * 1000) / n;
  const queue = ((b.queue - a.queue) * 1000) / Math.max(1, b.queueCount - a.queueCount);
  return { requests: n, accept: ms("accept"), engine: ms("engine"), "of which queue": queue, deliver: ms("deliver") };
}

/** Whether Keel's engine_ready line (which names the GPU backend it loaded) was printed once. */
let keelBackendShown = false;
/** A running server: { name, port, stop() }. */
async function startKeel(model, slots) {
  const args = [KEEL_BIN, "serve", "--model_path", model, "--model_name", "bench", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", "--log_format", "json",
    "--max_num_seqs", String(slots), "--max_model_len", String(CFG.ctx), "--max_num_batched_tokens", String(Math.max(CFG.batch, slots)),
    "--engine_threads", String(CFG.threads), "--flash_attention", String(CFG.flashAttention === "on"), "--max_queued_requests", "4096", ...(GPU ? ["--target_device", "GPU"] : []), ...(TRACE_DIR ? ["--log_level", "TRACE"] : []), ...CFG.keelArgs];
  const proc = spawn(process.execPath, args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], detached: true });
  live.add(proc);
  const tail = [];
  const port = await new Promise((resolve, reject) => {
    let port = 0;
    let ready = false;
    const onLine = (line) => {
      if (TRACE_DIR) appendFileSync(path.join(TRACE_DIR, "keel.log"), line + "\n");
      tail.push(line);
      if (tail.length > 20) tail.shift();
      let j;
      try {
        j = JSON.parse(line);
      } catch {
        return;
      }
      if (j.event === "listening" && j.address?.port) port = j.address.port;
      if (j.event === "engine_ready") {
        ready = true;
        if (!keelBackendShown) console.log(`keel engine_ready: ${JSON.stringify(Object.fromEntries(Object.entries(j).filter(([k]) => /gpu|device|backend|model|addon|warmup/i.test(k))))}`);
        keelBackendShown = true;
      }
      if (port && ready) resolve(port);
    };
    lines(proc.stdout, onLine);
    lines(proc.stderr, onLine);
    proc.once("exit", (code, sig) => reject(new Error(`keel exited before ready (${code ?? sig}):\n${tail.join("\n")}`)));
  });
  return { name: "keel", port, stop: () => stopProc(proc) };
}
function defaultOtherCmd() {
  const bin = opt("llama-server", "") || buildOutput();
  return [bin, "-m", "{model}", "--host", "127.0.0.1", "--port", "{port}", "-np", "{slots}", "-c", "{kv}", "-b", "{batch}", "-ub", "{batch}",
    "-t", "{threads}", "-tb", "{threads}", "-fa", CFG.flashAttention, "-ngl", "{ngl}", "--jinja", "--no-webui", "--alias", "bench", "--no-warmup", ...CFG.otherArgs];
}
/** The llama-server bench/build-llama-server.sh leaves in the cache (without building: that is the setup step). */
function buildOutput() {
  const rel = JSON.parse(readFileSync(path.join(ROOT, "node_modules/node-llama-cpp/llama/binariesGithubRelease.json"), "utf8")).release;
  const bin = path.join(process.env.KEEL_CACHE_DIR || path.join(os.homedir(), ".cache", "keel"), "llama-server", rel, "build", "bin", "llama-server");
  if (!existsSync(bin)) fail(`no ${bin}: run bash bench/build-llama-server.sh first (or pass --llama-server / --other-cmd)`);
  return bin;
}
async function startOther(model, slots) {
  const port = await freePort();
  const vars = { port, slots, ctx: CFG.ctx, kv: CFG.ctx * slots, model, threads: CFG.threads, batch: Math.max(CFG.batch, slots), ngl: GPU ? 999 : 0 };
  const fill = (s) => s.replace(/\{(\w+)\}/g, (m, k) => (k in vars ? String(vars[k]) : m));
  const proc = CFG.otherCmd
    ? spawn("sh", ["-c", fill(CFG.otherCmd)], { stdio: ["ignore", "pipe", "pipe"], detached: true })
    : spawn(fill(defaultOtherCmd()[0]), defaultOtherCmd().slice(1).map(fill), { stdio: ["ignore", "pipe", "pipe"], detached: true });
  live.add(proc);
  // Poll for readiness: /health answers 503 while loading, then 200; some servers only have /v1/models.
  await waitReady(proc, CFG.otherName, async () => (await httpGet(port, "/health")).status === 200 || (await httpGet(port, "/v1/models")).status === 200);
  return { name: CFG.otherName, port, stop: () => stopProc(proc) };
}
async function stopProc(proc) {
  if (proc.exitCode !== null || proc.signalCode !== null) return live.delete(proc);
  const exited = new Promise((r) => proc.once("exit", r));
  killGroup(proc, "SIGTERM");
  const t = setTimeout(() => killGroup(proc, "SIGKILL"), 10_000);
  await exited;
  clearTimeout(t);
  killGroup(proc, "SIGKILL"); // stragglers of the group (Keel's engine child)
  live.delete(proc);
}

// ---------- one streaming chat request ----------
/**
 * Streams one chat completion over raw node:http. Resolves with client-side timestamps (performance.now() ms):
 * sent (request fully written), chunks[] (arrival of each content-carrying chunk), end; usage; done ([DONE] seen).
 * `closeAfterChunks`: hard-close the socket once this many content chunks arrived.
 */
function chat(port, { content, maxTokens, closeAfterChunks = null, timeoutMs = 600_000 }) {
  return new Promise((resolve) => {
    const r = { status: 0, sent: NaN, chunks: [], end: NaN, usage: null, closed: false, done: false, error: null };
    const payload = JSON.stringify({ model: "bench", messages: [{ role: "user", content }], stream: true, stream_options: { include_usage: true }, max_tokens: maxTokens, temperature: CFG.temperature, ...SAMPLED, ignore_eos: true, ...extraBody });
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
      r.closed = true;
      socket?.destroy();
      settle();
    };
    const timer = setTimeout(() => {
      r.error = "timeout";
      hardClose();
    }, timeoutMs);
    const req = http.request({ host: "127.0.0.1", port, path: "/v1/chat/completions", method: "POST", agent: false, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) } });
    req.on("socket", (s) => (socket = s));
    req.on("error", (e) => {
      if (!r.closed) r.error = e.message;
      settle();
    });
    req.on("response", (res) => {
      r.status = res.statusCode;
      if (res.statusCode !== 200) r.error = `HTTP ${res.statusCode}`;
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (d) => {
        if (r.closed) return;
        const now = performance.now();
        buf += d;
        let i;
        // SSE events end with a blank line; llama-server and Keel both write "\n\n".
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const raw = buf.slice(0, i).trim();
          buf = buf.slice(i + 2);
          if (!raw.startsWith("data:")) continue;
          const data = raw.slice(5).trim();
          if (data === "[DONE]") {
            r.done = true;
            continue;
          }
          let ev;
          try {
            ev = JSON.parse(data);
          } catch {
            r.error = `bad SSE data: ${data.slice(0, 80)}`;
            continue;
          }
          if (ev.error) r.error = ev.error.message ?? String(ev.error);
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
    req.end(payload, () => (r.sent = performance.now()));
  });
}
const ttftOf = (r) => (r.chunks.length ? r.chunks[0] - r.sent : NaN);
const gapsOf = (r) => r.chunks.slice(1).map((t, i) => t - r.chunks[i]);
const okOf = (r) => !r.error && r.done && r.usage && !r.closed;

/** Runs `fn(server)` for both servers in an order that alternates with the round (ABBA…), returning {keel, other}. */
async function interleaved(servers, round, fn) {
  const order = round % 2 === 0 ? servers : [...servers].reverse();
  const out = {};
  for (const s of order) out[s.name === "keel" ? "keel" : "other"] = await fn(s);
  return out;
}
async function withServers(model, slots, fn) {
  const keel = await startKeel(model, slots);
  let other;
  try {
    other = await startOther(model, slots);
    // Warm-up (not measured): one request each, so first-use costs (allocation, graph build) are out of the rounds.
    for (const s of [keel, other]) {
      // A server may answer its models route before its engine is up (503 meanwhile): retry those.
      let w = await chat(s.port, { content: "warm up", maxTokens: 16 });
      for (const end = Date.now() + 300_000; w.status === 503 && Date.now() < end; await sleep(200)) w = await chat(s.port, { content: "warm up", maxTokens: 16 });
      if (s.name === "keel" && w.status === 200) await calibrate(s.port);
      if (!okOf(w)) throw new Error(`${s.name} warm-up failed: ${w.error ?? (w.usage ? "no [DONE]" : "no usage in the stream (stream_options.include_usage)")}`);
    }
    return await fn([keel, other]);
  } finally {
    await keel.stop();
    await other?.stop();
  }
}

/** Prompt tokens per word of {@link words} text on this model, measured from usage.prompt_tokens (for the long prompts). */
let tokensPerWord = 0;
async function calibrate(port) {
  if (tokensPerWord) return;
  const n = 300;
  const long = await chat(port, { content: words(n), maxTokens: 1 });
  const short = await chat(port, { content: words(1), maxTokens: 1 });
  if (long.usage && short.usage) tokensPerWord = (long.usage.prompt_tokens - short.usage.prompt_tokens) / (n - 1);
}

// ---------- 1. throughput ----------
async function loadRound(port, clients, perClient, tag, server = "") {
  const reqs = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async (_, ci) => {
      for (let k = 0; k < perClient; k++) {
        const r = await chat(port, { content: `${tag} client ${ci} request ${k}: ${words(12)}`, maxTokens: CFG.tokens });
        reqs.push(r);
        // COMPARE_TRACE: each request's timeline (ms from the round's start; wall clock to match Keel's TRACE lines).
        if (TRACE_DIR) appendFileSync(path.join(TRACE_DIR, "requests.jsonl"), JSON.stringify({ server, C: clients, tag, client: ci, k, wallSent: Math.round(performance.timeOrigin + r.sent), sent: r2(r.sent - t0), ttft: r2(ttftOf(r)), end: r2(r.end - t0) }) + "\n");
      }
    }),
  );
  const sec = (performance.now() - t0) / 1000;
  const tokens = reqs.reduce((a, r) => a + (r.usage?.completion_tokens ?? 0), 0);
  const chunks = reqs.reduce((a, r) => a + r.chunks.length, 0);
  return { tps: tokens / sec, tokens, chunks, errors: reqs.filter((r) => !okOf(r)).length, ttft: reqs.map(ttftOf).filter(Number.isFinite), itl: reqs.flatMap(gapsOf) };
}
async function throughput(model) {
  const rows = [];
  /** Keel's engine step phases per round (ms per decoding step), from its /metrics. */
  const phaseRows = [];
  /** Keel's mean first-token phases per round (ms per request), from its /metrics. */
  const ttftRows = [];
  for (const c of CFG.concurrency) {
    const perClient = Math.max(CFG.reqs, Math.ceil(CFG.minReqs / c));
    const acc = { keel: [], other: [] };
    await withServers(model, c, async (servers) => {
      for (let round = 0; round < CFG.rounds; round++) {
        const res = await interleaved(servers, round, async (s) => {
          if (s.name !== "keel") return loadRound(s.port, c, perClient, `r${round}`, s.name);
          const before = await keelPhases(s.port);
          const r = await loadRound(s.port, c, perClient, `r${round}`, s.name);
          const after = await keelPhases(s.port);
          const ph = phaseRow(before, after);
          const tt = ttftRow(before, after);
          if (tt) ttftRows.push({ C: c, round, ...Object.fromEntries(Object.entries(tt).map(([k, v]) => [k, k === "requests" ? v : r2(v)])) });
          if (ph) phaseRows.push({ C: c, round, ...Object.fromEntries(Object.entries(ph).map(([k, v]) => [k, k === "steps" ? v : r2(v)])) });
          return r;
        });
        acc.keel.push(res.keel);
        acc.other.push(res.other);
      }
    });
    const sum = (rs) => ({
      tps: median(rs.map((x) => x.tps)),
      ttft: rs.flatMap((x) => x.ttft),
      itl: rs.flatMap((x) => x.itl),
      errors: rs.reduce((a, x) => a + x.errors, 0),
      chunkPerTok: rs.reduce((a, x) => a + x.chunks, 0) / Math.max(1, rs.reduce((a, x) => a + x.tokens, 0)),
    });
    const k = sum(acc.keel);
    const o = sum(acc.other);
    rows.push({
      C: c,
      "keel tok/s": r0(k.tps),
      [`${CFG.otherName} tok/s`]: r0(o.tps),
      "tok/s ratio": r2(k.tps / o.tps),
      "keel TTFT p50/p99": `${r1(pct(k.ttft, 50))} / ${r1(pct(k.ttft, 99))}`,
      "other TTFT p50/p99": `${r1(pct(o.ttft, 50))} / ${r1(pct(o.ttft, 99))}`,
      "TTFT p50 ratio": r2(pct(k.ttft, 50) / pct(o.ttft, 50)),
      "keel ITL p50/p99": `${r1(pct(k.itl, 50))} / ${r1(pct(k.itl, 99))}`,
      "other ITL p50/p99": `${r1(pct(o.itl, 50))} / ${r1(pct(o.itl, 99))}`,
      "ITL p99 ratio": r2(pct(k.itl, 99) / pct(o.itl, 99)),
      "errors k/o": `${k.errors}/${o.errors}`,
      "chunks/token k/o": `${r2(k.chunkPerTok)}/${r2(o.chunkPerTok)}`,
    });
    // The whole row at once: a run stopped by its watchdog (or a device call's limit) keeps what it measured.
    console.log(`  C=${c} done: keel ${r0(k.tps)} vs ${CFG.otherName} ${r0(o.tps)} tok/s; ${JSON.stringify(rows.at(-1))}`);
  }
  console.log(`\n1. Throughput: ${CFG.tokens} tokens per request, median tok/s of ${CFG.rounds} interleaved rounds; TTFT/ITL in ms, pooled (ratios are keel/${CFG.otherName})`);
  console.table(rows);
  if (phaseRows.length > 0) {
    console.log("\n1b. Where Keel's engine time went, ms per decoding step (keel_engine_step_phase_seconds): decode = native batch decode, sample = all sequences' sampling, other = scheduling/bookkeeping, between = outside steps (frame write, event loop, waiting for work)");
    console.table(phaseRows);
  }
  if (ttftRows.length > 0) {
    console.log("\n1c. Keel's time to first token by phase, mean ms per streamed request (keel_request_ttft_phase_seconds): accept = HTTP request received -> add written to the engine (body, template, admission), engine = add written -> the first token's step message read back (of which queue = the engine's wait for a slot and a step boundary, keel_request_queue_time_seconds), deliver = that message read -> first token written");
    console.table(ttftRows);
  }
}

// ---------- 2. mixed load: long prefills arriving during decode ----------
async function mixedRound(port) {
  const decodes = [];
  const longs = [];
  let longsLeft = CFG.longReqs;
  let stop = false;
  const t0 = performance.now();
  const decoders = Array.from({ length: CFG.mixedDecoders }, async (_, ci) => {
    for (let k = 0; !stop; k++) decodes.push(await chat(port, { content: `decoder ${ci} request ${k}: ${words(12)}`, maxTokens: CFG.tokens }));
  });
  const longClients = Array.from({ length: CFG.mixedLong }, async () => {
    while (longsLeft-- > 0) {
      await sleep(rand() * 300);
      longs.push(await chat(port, { content: words(Math.round(CFG.longPrompt / (tokensPerWord || 1.5))), maxTokens: 8 }));
    }
  });
  await Promise.all(longClients);
  stop = true;
  await Promise.all(decoders);
  // Decoders' throughput over the whole mixed phase (their usage tokens / first sent → last decoder finished).
  const decodeTokens = decodes.reduce((a, r) => a + (r.usage?.completion_tokens ?? 0), 0);
  const tEnd = performance.now();
  const inLong = (t) => longs.some((l) => t >= l.sent && t <= l.end);
  const overlapGaps = decodes.flatMap((r) => r.chunks.slice(1).flatMap((t, i) => (inLong(t) ? [t - r.chunks[i]] : [])));
  return {
    tps: decodeTokens / ((tEnd - t0) / 1000),
    itlOverlap: overlapGaps,
    itlAll: decodes.flatMap(gapsOf),
    longTtft: longs.map(ttftOf).filter(Number.isFinite),
    promptTokens: median(longs.map((l) => l.usage?.prompt_tokens ?? NaN).filter(Number.isFinite)),
    errors: [...decodes, ...longs].filter((r) => !okOf(r)).length,
  };
}
async function mixed(model) {
  const slots = CFG.mixedDecoders + CFG.mixedLong;
  const acc = { keel: [], other: [] };
  await withServers(model, slots, async (servers) => {
    for (let round = 0; round < CFG.rounds; round++) {
      const res = await interleaved(servers, round, (s) => mixedRound(s.port));
      acc.keel.push(res.keel);
      acc.other.push(res.other);
    }
  });
  const row = (name, rs) => ({
    server: name,
    "decode tok/s": r0(median(rs.map((x) => x.tps))),
    "ITL p50 (overlap)": r1(pct(rs.flatMap((x) => x.itlOverlap), 50)),
    "ITL p99 (overlap)": r1(pct(rs.flatMap((x) => x.itlOverlap), 99)),
    "ITL p99 (all)": r1(pct(rs.flatMap((x) => x.itlAll), 99)),
    "long TTFT p50": r1(pct(rs.flatMap((x) => x.longTtft), 50)),
    "long TTFT p99": r1(pct(rs.flatMap((x) => x.longTtft), 99)),
    "long prompt tokens": rs[0].promptTokens,
    errors: rs.reduce((a, x) => a + x.errors, 0),
  });
  const k = row("keel", acc.keel);
  const o = row(CFG.otherName, acc.other);
  const ratio = { server: "ratio keel/other" };
  for (const key of Object.keys(k)) if (typeof k[key] === "number" && key !== "errors" && key !== "long prompt tokens") ratio[key] = r2(k[key] / o[key]);
  console.log(`\n2. Mixed load: ${CFG.mixedDecoders} decoders (${CFG.tokens} tokens each) while ${CFG.mixedLong} clients send ${CFG.longReqs} ~${CFG.longPrompt}-token prompts; ${slots} slots, step budget ${CFG.batch}; ms`);
  console.table([k, o, ratio]);
}

// ---------- 3. disconnect storm ----------
/** Which requests a storm round kills and after how many chunks (null = none): drawn once, used for both servers. */
function stormPlan(killShare) {
  return Array.from({ length: CFG.stormConc }, () => Array.from({ length: CFG.stormReqs }, () => (rand() < killShare ? 1 + Math.floor(rand() * (CFG.tokens - 1)) : null)));
}
async function stormRound(port, plan) {
  const done = [];
  await Promise.all(
    plan.map(async (perClient, ci) => {
      for (let k = 0; k < perClient.length; k++) {
        const r = await chat(port, { content: `storm client ${ci} request ${k}: ${words(12)}`, maxTokens: CFG.tokens, closeAfterChunks: perClient[k] });
        r.killed = perClient[k] !== null;
        done.push(r);
      }
    }),
  );
  const survivors = done.filter((r) => !r.killed);
  return {
    perStream: survivors.filter(okOf).map((r) => (r.usage.completion_tokens / (r.end - r.sent)) * 1000),
    killed: done.length - survivors.length,
    survivors: survivors.length,
    failed: survivors.filter((r) => !okOf(r)).length,
  };
}
async function storm(model) {
  const acc = { keel: { calm: [], storm: [] }, other: { calm: [], storm: [] } };
  await withServers(model, CFG.stormConc, async (servers) => {
    for (let round = 0; round < CFG.rounds; round++) {
      for (const [mode, share] of round % 2 === 0 ? [["calm", 0], ["storm", 0.25]] : [["storm", 0.25], ["calm", 0]]) {
        const plan = stormPlan(share);
        const res = await interleaved(servers, round, (s) => stormRound(s.port, plan));
        acc.keel[mode].push(res.keel);
        acc.other[mode].push(res.other);
      }
    }
  });
  const row = (name, a) => {
    const calm = median(a.calm.flatMap((x) => x.perStream));
    const stormy = median(a.storm.flatMap((x) => x.perStream));
    return {
      server: name,
      "undisturbed tok/s per stream": r1(calm),
      "survivors tok/s per stream": r1(stormy),
      "survivors/undisturbed": r2(stormy / calm),
      killed: a.storm.reduce((s, x) => s + x.killed, 0),
      survivors: a.storm.reduce((s, x) => s + x.survivors, 0),
      "failed survivors": a.storm.reduce((s, x) => s + x.failed, 0) + a.calm.reduce((s, x) => s + x.failed, 0),
    };
  };
  console.log(`\n3. Disconnect storm: ${CFG.stormConc} clients x ${CFG.stormReqs} requests, ~25 % hard-closed mid-stream; per-stream tok/s medians (completion tokens / request time)`);
  console.table([row("keel", acc.keel), row(CFG.otherName, acc.other)]);
}

// ---------- main ----------
const model = await resolveModel(CFG.model);
// Random-weight models from Keel's writer (keel-tiny*, bench/gpu/write-model.mjs) are recognised by their general.name.
const info = await readModelInfo(model);
if (path.basename(model).startsWith("keel-tiny") || info.name.startsWith("keel-tiny")) {
  extraBody = { logit_bias: await asciiOnlyBias(info) };
  console.log(`keel-tiny: ${Object.keys(extraBody.logit_bias).length} non-ASCII tokens banned by logit_bias on both servers (llama-server's chat parser refuses invalid UTF-8)`);
}
console.log(`model ${model}; ${GPU ? "GPU" : "CPU"}; threads ${CFG.threads}; flash attention ${CFG.flashAttention}; ctx/slot ${CFG.ctx}; step budget ${CFG.batch}; other: ${CFG.otherCmd || defaultOtherCmd().join(" ")}`);
try {
  for (const s of SECTIONS) {
    if (s === "throughput") await throughput(model);
    if (s === "mixed") await mixed(model);
    if (s === "storm") await storm(model);
  }
} catch (err) {
  // A server that cannot start (e.g. --gpu where there is no GPU) says why in its own words: print that, not a trace.
  fail(`compare: ${err.message}`);
}
process.exit(0);
