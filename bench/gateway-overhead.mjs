#!/usr/bin/env node
// Benchmark: what the gateway (HTTP, validation, chat template, registry, SSE) costs on top of the engine.
// Prints tables; asserts nothing.
//
// The same streaming load — greedy, ignore_eos, TOKENS tokens per request, distinct short prompts — runs
//   (a) "http":   over loopback HTTP against a `keel serve` child this script starts (raw node:http SSE clients with a
//                 keep-alive agent), and
//   (b) "engine": straight into an engine process spawned the way src/gateway/supervision/engine-client.ts does it (the compiled
//                 dist/engine/main.js with one JSON config argument, length-prefixed JSON frames on fd 3), driven
//                 with `add` messages; no HTTP, no gateway.
// Both use the same engine configuration (the one `keel serve` builds from its flags: --max_num_seqs 8,
// --max_num_batched_tokens 256, --max_model_len 1024, 1 thread, f16 KV, flash attention off, prefix caching on) and
// the same prompt text (rendered with the gateway's own ChatTemplate from the model's template). At each client
// concurrency (closed loop: C clients, each sending REQS_PER_CLIENT requests back to back) the two modes alternate
// round by round, both processes staying up, so machine-load drift hits both alike.
//
// Per concurrency: aggregate generated tok/s (median over ROUNDS rounds; first request sent → last one finished) of
// both and their ratio http/engine; TTFT p50 (request written → first token: the first non-empty content chunk over
// HTTP, the first step output carrying a token for the engine) of both and the difference in ms; ITL p99 (gaps
// between consecutive token arrivals of one request; over HTTP, between content-carrying socket reads) of both.
//
// Run: npx tsc -p tsconfig.build.json && node bench/gateway-overhead.mjs
// Knobs (env): TOKENS (128), ROUNDS (8), REQS_PER_CLIENT (3), CONCURRENCY ("1,4,8"), MAX_SECONDS (280).
import { spawn } from "node:child_process";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { DEFAULT_ENGINE_COMMAND, spawnEngine } from "../dist/gateway/supervision/engine-client.js";
import { ChatTemplate } from "../dist/gateway/models/chat-template.js";
import { encodeFrame, FrameDecoder } from "../dist/protocol/framing.js";
import { PROTOCOL_VERSION } from "../dist/protocol/messages.js";
import { ensureDefaultModel } from "../dist/model/default-model.js";
import { CHATML_TEMPLATE } from "../dist/model/tiny-model.js";
import { lines } from "./lib.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const BIN = path.join(ROOT, "bin", "keel.mjs");
const env = (name, def) => (process.env[name] ? Number(process.env[name]) : def);
const CFG = {
  TOKENS: env("TOKENS", 128),
  ROUNDS: env("ROUNDS", 8),
  REQS_PER_CLIENT: env("REQS_PER_CLIENT", 3),
  CONCURRENCY: (process.env.CONCURRENCY ?? "1,4,8").split(",").map(Number),
  MAX_SECONDS: env("MAX_SECONDS", 280),
  MAX_NUM_SEQS: 8,
  MAX_NUM_BATCHED_TOKENS: 256,
  MAX_MODEL_LEN: 1024,
};

const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};
const median = (xs) => pct(xs, 50);
const r1 = (x) => (Number.isFinite(x) ? Math.round(x * 10) / 10 : null);
const r2 = (x) => (Number.isFinite(x) ? Math.round(x * 100) / 100 : null);

// ---------- child processes (killed on exit, whatever happens) ----------
const children = new Set();
process.on("exit", () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
});
for (const sig of ["SIGINT", "SIGTERM"]) process.on(sig, () => process.exit(130));
setTimeout(() => {
  console.error(`watchdog: ${CFG.MAX_SECONDS} s passed; killing the children and exiting`);
  process.exit(3);
}, CFG.MAX_SECONDS * 1000).unref();


// ---------- (a) keel serve over HTTP ----------
async function startServer() {
  const flags = ["--max_num_seqs", String(CFG.MAX_NUM_SEQS), "--max_num_batched_tokens", String(CFG.MAX_NUM_BATCHED_TOKENS), "--max_model_len", String(CFG.MAX_MODEL_LEN)];
  const proc = spawn(process.execPath, [BIN, "serve", "--model_path", "keel-tiny", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", ...flags], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  children.add(proc);
  const enginePids = [];
  let port = 0;
  const tail = [];
  await new Promise((resolve, reject) => {
    let ready = false;
    const onLine = (line) => {
      tail.push(line);
      if (tail.length > 5) tail.shift();
      try {
        const j = JSON.parse(line);
        if (j.event === "listening" && j.address?.port) port = j.address.port;
        if (j.event === "engine_ready") {
          ready = true;
          enginePids.push(j.enginePid);
        }
      } catch {
        /* not JSON */
      }
      if (port && ready) resolve();
    };
    lines(proc.stdout, onLine);
    lines(proc.stderr, onLine);
    proc.once("exit", (code, sig) => reject(new Error(`keel serve exited before ready (${code ?? sig}): ${tail.join("\n")}`)));
  });
  const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  return {
    name: "http",
    async stop() {
      agent.destroy();
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(t);
      for (const pid of enginePids) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          /* already gone */
        }
      }
    },
    /** One streaming request; resolves with { tokens, sentAt, tokenTimes }. */
    request(content) {
      const payload = JSON.stringify({
        model: "keel-tiny",
        messages: [{ role: "user", content }],
        max_tokens: CFG.TOKENS,
        temperature: 0,
        ignore_eos: true,
        stream: true,
        stream_options: { include_usage: true },
      });
      return new Promise((resolve, reject) => {
        const times = [];
        let tokens = 0;
        let sentAt = 0;
        const req = http.request({ host: "127.0.0.1", port, path: "/v3/chat/completions", method: "POST", agent, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) } }, (res) => {
          if (res.statusCode !== 200) return reject(new Error(`HTTP ${res.statusCode}`));
          let buf = "";
          res.setEncoding("utf8");
          res.on("data", (d) => {
            const now = performance.now();
            buf += d;
            let sawContent = false;
            let i;
            while ((i = buf.indexOf("\n\n")) >= 0) {
              const ev = buf.slice(0, i);
              buf = buf.slice(i + 2);
              if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
              const j = JSON.parse(ev.slice(6));
              if (j.error) return reject(new Error(j.error.message));
              if (j.choices?.[0]?.delta?.content) sawContent = true;
              if (j.usage) tokens = j.usage.completion_tokens;
            }
            if (sawContent) times.push(now);
          });
          res.on("end", () => resolve({ tokens, sentAt, tokenTimes: times }));
          res.on("error", reject);
        });
        req.on("error", reject);
        sentAt = performance.now();
        req.end(payload);
      });
    },
  };
}

// ---------- (b) the engine process, no HTTP ----------
async function startEngine(modelPath) {
  // The engine-neutral configuration `keel serve` builds from the same flags (src/protocol/engine-config.ts), started
  // through the default engine command as the gateway starts it.
  const config = {
    mode: "serve",
    modelPath,
    maxNumSeqs: CFG.MAX_NUM_SEQS,
    maxNumBatchedTokens: CFG.MAX_NUM_BATCHED_TOKENS,
    maxModelLen: CFG.MAX_MODEL_LEN,
    threads: 1,
    flashAttention: false,
    kvCacheType: "f16",
    prefixCaching: true,
    device: "cpu",
    generation: 1,
  };
  const child = spawnEngine(DEFAULT_ENGINE_COMMAND, config, ["ignore", "pipe", "pipe", "pipe"], false);
  children.add(child);
  child.stdout.resume();
  child.stderr.resume();
  const channel = child.stdio[3];
  const decoder = new FrameDecoder();
  /** Live requests: id → { onStep(output, now) }. */
  const live = new Map();
  let readyMsg = null;
  let onReady;
  const ready = new Promise((resolve, reject) => {
    onReady = resolve;
    child.once("exit", (code, sig) => reject(new Error(`engine exited before ready (${code ?? sig})`)));
  });
  channel.on("data", (chunk) => {
    const now = performance.now();
    for (const frame of decoder.push(chunk)) {
      if ("error" in frame) throw new Error(`bad frame from the engine: ${frame.error}`);
      const msg = frame.message;
      if (msg.type === "ready") {
        readyMsg = msg;
        onReady();
      } else if (msg.type === "step") {
        for (const o of msg.outputs) live.get(o.id)?.onOutput(o, now);
      } else if (msg.type === "request_error" || msg.type === "protocol_error" || msg.type === "fatal") {
        throw new Error(`engine: ${msg.type}: ${msg.message}`);
      }
    }
  });
  await ready;
  const m = readyMsg.model;
  const template = new ChatTemplate(m.chatTemplate ?? CHATML_TEMPLATE, { bosToken: m.bosToken, eosToken: m.eosToken });
  let next = 0;
  return {
    name: "engine",
    async stop() {
      const exited = new Promise((r) => child.once("exit", r));
      channel.write(encodeFrame({ v: PROTOCOL_VERSION, type: "shutdown" }));
      const t = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(t);
    },
    request(content) {
      const id = `bench-${++next}`;
      const text = template.render([{ role: "user", content }], { addGenerationPrompt: true });
      return new Promise((resolve, reject) => {
        const times = [];
        let tokens = 0;
        live.set(id, {
          onOutput(o, now) {
            if (o.tokens.length) {
              tokens += o.tokens.length;
              times.push(now);
            }
            if (o.finish) {
              live.delete(id);
              if (o.finish.reason === "error") reject(new Error(o.finish.error?.message ?? "engine error"));
              else resolve({ tokens, sentAt, tokenTimes: times });
            }
          },
        });
        const sentAt = performance.now();
        channel.write(
          encodeFrame({
            v: PROTOCOL_VERSION,
            type: "add",
            id,
            prompt: { text },
            params: { maxTokens: CFG.TOKENS, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: true },
          }),
        );
      });
    },
  };
}

// ---------- load ----------
let promptNo = 0;
/** Distinct short prompts (a unique number first, so no two share more than the template's prefix). */
const prompt = () => `${++promptNo} tell me about the queue, the batch and the engine`;

/** C closed-loop clients, each REQS_PER_CLIENT requests back to back. */
async function round(target, concurrency, prompts) {
  const results = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async (_, c) => {
      for (let k = 0; k < CFG.REQS_PER_CLIENT; k++) results.push(await target.request(prompts[c * CFG.REQS_PER_CLIENT + k]));
    }),
  );
  const ms = performance.now() - t0;
  const tokens = results.reduce((s, r) => s + r.tokens, 0);
  const ttft = results.map((r) => r.tokenTimes[0] - r.sentAt);
  const itl = results.flatMap((r) => r.tokenTimes.slice(1).map((t, i) => t - r.tokenTimes[i]));
  return { tokS: (tokens / ms) * 1000, tokens, ttft, itl };
}

// ---------- main ----------
const started = performance.now();
const modelPath = await ensureDefaultModel();
const server = await startServer();
const engine = await startEngine(modelPath);
console.log(`bench/gateway-overhead.mjs — config ${JSON.stringify(CFG)}`);
try {
  // Warm-up (not measured): both processes load pages, JIT, first KV use.
  for (const t of [server, engine]) await round(t, CFG.MAX_NUM_SEQS, Array.from({ length: CFG.MAX_NUM_SEQS * CFG.REQS_PER_CLIENT }, prompt));

  const rows = [];
  for (const c of CFG.CONCURRENCY) {
    const acc = { http: { tokS: [], ttft: [], itl: [] }, engine: { tokS: [], ttft: [], itl: [] } };
    let tokensPerRound = 0;
    for (let r = 0; r < CFG.ROUNDS; r++) {
      // The same prompts for both modes in this round; alternate which goes first.
      const prompts = Array.from({ length: c * CFG.REQS_PER_CLIENT }, prompt);
      const order = r % 2 === 0 ? [server, engine] : [engine, server];
      for (const t of order) {
        const res = await round(t, c, prompts);
        acc[t.name].tokS.push(res.tokS);
        acc[t.name].ttft.push(...res.ttft);
        acc[t.name].itl.push(...res.itl);
        tokensPerRound = res.tokens;
      }
    }
    const h = acc.http;
    const e = acc.engine;
    rows.push({
      concurrency: c,
      "requests/round": c * CFG.REQS_PER_CLIENT,
      "tokens/round": tokensPerRound,
      "http tok/s": Math.round(median(h.tokS)),
      "engine tok/s": Math.round(median(e.tokS)),
      "ratio http/engine": r2(median(h.tokS) / median(e.tokS)),
      "http TTFT p50 ms": r1(median(h.ttft)),
      "engine TTFT p50 ms": r1(median(e.ttft)),
      "TTFT diff ms": r1(median(h.ttft) - median(e.ttft)),
      "http ITL p99 ms": r1(pct(h.itl, 99)),
      "engine ITL p99 ms": r1(pct(e.itl, 99)),
    });
  }
  console.log(`\nGateway overhead: greedy, ignore_eos, ${CFG.TOKENS} tokens per request, median tok/s of ${CFG.ROUNDS} rounds per mode (alternating), TTFT/ITL over all requests of those rounds`);
  console.table(rows);
  console.log(`total ${r1((performance.now() - started) / 1000)} s`);
} finally {
  await Promise.all([server.stop(), engine.stop()]);
}
