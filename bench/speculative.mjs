#!/usr/bin/env node
// Benchmark: prompt-lookup (n-gram) speculative decoding on an agent-like workload. Keel with prompt lookup off vs on
// (per request: num_assistant_tokens 0 vs N, one server) and llama-server without and with its own n-gram
// speculation (--spec-type ngram-simple), same GGUF, greedy. Prints a table with ratios and whether Keel's greedy
// output is identical off/on (MATCH/DIFF). Run `node bench/speculative.mjs --help` for the options.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { freePort, httpGet as get, killGroup as kill, median, ROOT, serverGroups, waitReady } from "./lib.mjs";
import { TOOL_RESULT_MESSAGES, EDIT_FILE_MESSAGES } from "./speculative-workload.mjs";

const HELP = `Usage: node bench/speculative.mjs [--flag value ...]

Workloads (greedy, streaming, max_tokens --tokens, no ignore_eos):
  edit   an ~80-line source file in the prompt, returned whole with one function renamed
  tool   a chat whose tool message holds a long JSON result the answer must quote back
Per round (--rounds, interleaved ABBA): Keel off (num_assistant_tokens 0), Keel on (num_assistant_tokens --k,
max_ngram_size --ngram), llama-server off, llama-server on. Decode tok/s = (completion tokens - 1) / (last chunk -
first chunk); Keel's accepted rate from /metrics (keel_engine_accepted_draft_tokens_total / draft_tokens_total),
llama-server's from the response timings (draft_n_accepted / draft_n).

Options:
  --model NAME|FILE    a cached catalogue name or a .gguf (default qwen2.5-coder-0.5b-instruct)
  --gpu                offload every layer (Keel --target_device GPU, llama-server -ngl 999)
  --threads N          CPU threads of both engines (default: 1 on <= 2 CPUs, else CPUs - 1)
  --tokens N           max_tokens (default 256)       --rounds N   rounds (default 3)
  --k N                Keel num_assistant_tokens (default 5)      --ngram N   max_ngram_size (default 3)
  --llama-server FILE  (default ~/.cache/keel/llama-server/v0.4.0/build/bin/llama-server)
  --spec-args "..."    llama-server's speculative flags (default "--spec-type ngram-simple")
  --keel-args "..."    extra flags for keel serve     --other-args "..."   extra flags for both llama-servers
  --no-other           Keel only
`;

const argv = process.argv.slice(2);
if (argv.includes("--help")) {
  process.stdout.write(HELP);
  process.exit(0);
}
const flags = new Map();
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  if (!a.startsWith("--")) fail(`unexpected argument ${a}`);
  if (a === "--gpu" || a === "--no-other") flags.set(a.slice(2), "1");
  else if (a.includes("=")) flags.set(a.slice(2, a.indexOf("=")), a.slice(a.indexOf("=") + 1));
  else flags.set(a.slice(2), argv[++i]);
}
const KNOWN = new Set("model gpu threads tokens rounds k ngram llama-server spec-args keel-args other-args no-other".split(" "));
for (const k of flags.keys()) if (!KNOWN.has(k)) fail(`unknown option --${k} (see --help)`);
function fail(msg) {
  console.error(msg);
  process.exit(2);
}
const opt = (k, d) => flags.get(k) ?? d;
const GPU = flags.has("gpu");
const CFG = {
  model: opt("model", "qwen2.5-coder-0.5b-instruct"),
  threads: Number(opt("threads", os.availableParallelism() <= 2 ? 1 : os.availableParallelism() - 1)),
  tokens: Number(opt("tokens", 256)),
  rounds: Number(opt("rounds", 3)),
  k: Number(opt("k", 5)),
  ngram: Number(opt("ngram", 3)),
  llamaServer: opt("llama-server", path.join(os.homedir(), ".cache/keel/llama-server/v0.4.0/build/bin/llama-server")),
  specArgs: String(opt("spec-args", "--spec-type ngram-simple")).split(" ").filter(Boolean),
  keelArgs: String(opt("keel-args", "")).split(" ").filter(Boolean),
  otherArgs: String(opt("other-args", "")).split(" ").filter(Boolean),
  other: !flags.has("no-other"),
};
const CTX = 4096;

// ---------- processes ----------
const live = serverGroups();
/** Start a server process; resolve once GET `ready` answers 200. */
async function start(name, cmd, args, port) {
  const proc = spawn(cmd, args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], detached: true });
  live.add(proc);
  // llama-server: /health 200 once loaded; Keel: /v2/health/ready 200 once its engine is up.
  const probe = name === "keel" ? "/v2/health/ready" : "/health";
  await waitReady(proc, name, async () => (await get(port, probe)).status === 200, { everyMs: 200, keepLines: 15 });
  return { name, port, proc };
}
async function stop(s) {
  const exited = new Promise((r) => (s.proc.exitCode !== null ? r() : s.proc.once("exit", r)));
  kill(s.proc, "SIGTERM");
  const t = setTimeout(() => kill(s.proc, "SIGKILL"), 10_000);
  await exited;
  clearTimeout(t);
  kill(s.proc, "SIGKILL");
  live.delete(s.proc);
}
async function startKeel(model) {
  const port = await freePort();
  const args = ["bin/keel.mjs", "serve", "--model_path", model, "--model_name", "bench", "--rest_port", String(port), "--rest_bind_address", "127.0.0.1", "--log_format", "json",
    "--max_num_seqs", "1", "--max_model_len", String(CTX), "--max_num_batched_tokens", "512", "--engine_threads", String(CFG.threads), "--flash_attention", "false",
    // A shared CPU can take longer than the default 30 s for one 512-token prefill step: not a stall.
    "--engine_stall_timeout", "600",
    ...(GPU ? ["--target_device", "GPU"] : []), ...CFG.keelArgs];
  return start("keel", process.execPath, args, port);
}
async function startLlamaServer(model, spec) {
  if (!existsSync(CFG.llamaServer)) fail(`no ${CFG.llamaServer}: run bash bench/build-llama-server.sh (or pass --llama-server)`);
  const port = await freePort();
  const args = ["-m", model, "--host", "127.0.0.1", "--port", String(port), "-np", "1", "-c", String(CTX), "-b", "512", "-ub", "512", "-t", String(CFG.threads), "-tb", String(CFG.threads),
    "-fa", "off", "-ngl", GPU ? "999" : "0", "--jinja", "--no-webui", "--alias", "bench", "--cache-ram", "0", ...(spec ? CFG.specArgs : []), ...CFG.otherArgs];
  return start(spec ? "llama-server spec" : "llama-server", CFG.llamaServer, args, port);
}

// ---------- one streamed greedy chat ----------
/** Stream one chat: text, completion tokens, chunk times, llama-server's timings (draft counts) when sent. */
function chat(port, messages, extra) {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify({ model: "bench", messages, stream: true, stream_options: { include_usage: true }, max_tokens: CFG.tokens, temperature: 0, ...extra });
    const r = { text: "", chunks: [], usage: null, timings: null, sent: NaN, logprobs: [] };
    const req = http.request({ host: "127.0.0.1", port, path: "/v1/chat/completions", method: "POST", agent: false, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(payload) } });
    req.on("error", reject);
    req.on("response", (res) => {
      if (res.statusCode !== 200) {
        let body = "";
        res.on("data", (d) => (body += d));
        res.on("end", () => reject(new Error(`HTTP ${res.statusCode}: ${body.slice(0, 300)}`)));
        return;
      }
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (d) => {
        const now = performance.now();
        buf += d;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const raw = buf.slice(0, i).trim();
          buf = buf.slice(i + 2);
          if (!raw.startsWith("data:") || raw === "data: [DONE]") continue;
          const ev = JSON.parse(raw.slice(5));
          if (ev.usage) r.usage = ev.usage;
          if (ev.timings) r.timings = ev.timings;
          r.logprobs.push(...(ev.choices?.[0]?.logprobs?.content ?? []));
          const c = ev.choices?.[0]?.delta?.content;
          if (c) {
            r.text += c;
            r.chunks.push(now);
          }
        }
      });
      res.on("end", () => resolve(r));
    });
    req.end(payload, () => (r.sent = performance.now()));
  });
}
/** Keel's cumulative draft counters from /metrics. */
async function keelDrafts(port) {
  const { body } = await get(port, "/metrics");
  const num = (re) => Number(body.match(re)?.[1] ?? 0);
  return { proposed: num(/^keel_engine_draft_tokens_total\{[^}]*\} (\S+)/m), accepted: num(/^keel_engine_accepted_draft_tokens_total\{[^}]*\} (\S+)/m) };
}

/**
 * Where Keel's greedy text with speculation first differs from the text without, and how close the two best tokens
 * were there without speculation (one more run of the off variant with top_logprobs 2): a margin of a few
 * thousandths of a nat is a tie that the batch shape's rounding (k + 1 positions a decode vs one) decides, not a
 * wrong acceptance.
 */
async function divergence(port, messages, off, on) {
  let at = 0;
  while (at < off.length && off[at] === on[at]) at++;
  const r = await chat(port, messages, { num_assistant_tokens: 0, logprobs: true, top_logprobs: 2 });
  if (r.text !== off) return `char ${at}; the off run's text changed between runs`;
  let seen = 0;
  for (const [i, lp] of r.logprobs.entries()) {
    const next = seen + lp.token.length;
    if (next > at) {
      const [a, b] = lp.top_logprobs ?? [];
      const margin = a && b ? Math.abs(a.logprob - b.logprob) : NaN;
      return `token ${i} (char ${at}): off ${JSON.stringify(lp.token)}, top-2 margin ${Number.isFinite(margin) ? margin.toFixed(4) : "?"} nats`;
    }
    seen = next;
  }
  return `char ${at}: past the off run's tokens`;
}

// ---------- the measurement ----------
const VARIANTS = [
  { key: "keel off", server: "keel", extra: { num_assistant_tokens: 0 } },
  { key: "keel on", server: "keel", extra: { num_assistant_tokens: CFG.k, max_ngram_size: CFG.ngram } },
  { key: "llama-server off", server: "llama-server" },
  { key: "llama-server on", server: "llama-server spec" },
];
const WORKLOADS = { edit: EDIT_FILE_MESSAGES, tool: TOOL_RESULT_MESSAGES };

async function resolveModel(name) {
  if (name.endsWith(".gguf")) return path.resolve(name);
  const cache = await import("../dist/model/model-cache.js");
  const file = cache.isCatalogueName(name) ? await cache.findCachedModel(cache.catalogueModel(name)) : null;
  if (!file) fail(`${name} is not a cached catalogue model or a .gguf file (keel fetch ${name})`);
  return file;
}

const model = await resolveModel(CFG.model);
console.log(`model ${model}; ${GPU ? "GPU" : "CPU"}; threads ${CFG.threads}; max_tokens ${CFG.tokens}; Keel num_assistant_tokens ${CFG.k} max_ngram_size ${CFG.ngram}; llama-server ${CFG.specArgs.join(" ")}`);
const servers = {};
try {
  servers["keel"] = await startKeel(model);
  if (CFG.other) {
    servers["llama-server"] = await startLlamaServer(model, false);
    servers["llama-server spec"] = await startLlamaServer(model, true);
  }
  const variants = VARIANTS.filter((v) => servers[v.server]);
  // Warm-up (not measured): each variant once on a short chat.
  for (const v of variants) await chat(servers[v.server].port, [{ role: "user", content: "Say hi." }], { ...v.extra, max_tokens: 8 });
  /** Per workload and variant: decode tok/s, end-to-end tok/s per round; texts; draft counts. */
  const acc = {};
  for (let round = 0; round < CFG.rounds; round++) {
    for (const [w, messages] of Object.entries(WORKLOADS)) {
      // Interleaved: the order reverses every round, so drift in machine load hits every variant alike.
      for (const v of round % 2 === 0 ? variants : [...variants].reverse()) {
        const s = servers[v.server];
        const before = s.name === "keel" ? await keelDrafts(s.port) : null;
        const r = await chat(s.port, messages, v.extra ?? {});
        const after = s.name === "keel" ? await keelDrafts(s.port) : null;
        const a = ((acc[w] ??= {})[v.key] ??= { decode: [], e2e: [], texts: [], proposed: 0, accepted: 0, tokens: [] });
        const n = r.usage?.completion_tokens ?? 0;
        a.decode.push(((n - 1) / (r.chunks.at(-1) - r.chunks[0])) * 1000);
        a.e2e.push((n / (r.chunks.at(-1) - r.sent)) * 1000);
        a.texts.push(r.text);
        (a.messages ??= messages);
        a.tokens.push(n);
        if (before && after) {
          a.proposed += after.proposed - before.proposed;
          a.accepted += after.accepted - before.accepted;
        } else if (r.timings?.draft_n !== undefined) {
          a.proposed += r.timings.draft_n;
          a.accepted += r.timings.draft_n_accepted ?? 0;
        }
      }
    }
    console.log(`  round ${round + 1}/${CFG.rounds} done`);
  }
  const r0 = (x) => (Number.isFinite(x) ? Math.round(x * 10) / 10 : null);
  const rows = [];
  for (const [w, byVariant] of Object.entries(acc)) {
    const dec = (k) => median(byVariant[k]?.decode ?? [NaN]);
    for (const [k, a] of Object.entries(byVariant)) {
      rows.push({
        workload: w,
        variant: k,
        "decode tok/s": r0(median(a.decode)),
        "e2e tok/s": r0(median(a.e2e)),
        tokens: median(a.tokens),
        "accepted/proposed": a.proposed > 0 ? `${a.accepted}/${a.proposed} (${Math.round((100 * a.accepted) / a.proposed)} %)` : "-",
      });
    }
    const same = (k1, k2) => (byVariant[k1] && byVariant[k2] ? (byVariant[k1].texts.every((t, i) => t === byVariant[k2].texts[i]) ? "MATCH" : "DIFF") : "-");
    rows.push({
      workload: w,
      variant: "ratios",
      "decode tok/s": `keel on/off ${r0(dec("keel on") / dec("keel off"))}; llama on/off ${r0(dec("llama-server on") / dec("llama-server off"))}; keel on / llama on ${r0(dec("keel on") / dec("llama-server on"))}`,
      "e2e tok/s": "",
      tokens: "",
      "accepted/proposed": `keel off/on ${same("keel off", "keel on")}; llama off/on ${same("llama-server off", "llama-server on")}; keel/llama off ${same("keel off", "llama-server off")}`,
    });
  }
  console.log(`\nPrompt-lookup decoding, median of ${CFG.rounds} interleaved rounds (decode tok/s excludes the first token; greedy texts compared round by round)`);
  console.table(rows);
  for (const [w, byVariant] of Object.entries(acc)) {
    const off = byVariant["keel off"];
    const on = byVariant["keel on"];
    const i = off && on ? off.texts.findIndex((t, k) => t !== on.texts[k]) : -1;
    if (i >= 0) console.log(`${w}: Keel on/off first differ at ${await divergence(servers["keel"].port, off.messages, off.texts[i], on.texts[i])}`);
  }
} catch (err) {
  fail(`speculative: ${err.message}`);
} finally {
  for (const s of Object.values(servers)) await stop(s);
}
process.exit(0);
