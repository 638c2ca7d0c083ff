#!/usr/bin/env node
// Benchmark: what tool-guided generation costs on a real model. Prints tables; asserts nothing.
//
// Two `keel serve` children on the same model and flags, except --enable_tool_guided_generation (false / true), stay
// up side by side and are used one at a time (round by round, alternating, so machine-load drift hits both alike).
//  1. Per tool count (1, 10, 50 tools of 5 parameters each): the same streaming request (a distinct user question per
//     round, tools rendered in the prompt, greedy, max_tokens TOKENS) to the unguided server with tool_choice auto and
//     to the guided server with tool_choice "required" (constrained from the first token). Reported: TTFT p50 and
//     decode tok/s p50 (1 / mean inter-token latency), both from the server's own histograms read around each
//     request (a tool call streams whole, so the client cannot time its tokens).
//  2. Bystanders: BYSTANDERS plain streaming chats (no tools, ignore_eos, TOKENS tokens), alone and alongside one
//     50-tool request: unconstrained (tool_choice auto) on the unguided server, constrained (tool_choice required) on
//     the guided server. Reported: the bystanders' ITL p50 and p99 (gaps between their content deltas). The batch
//     grows by one sequence in both, so the grammar's per-step cost is the difference between the two "+" rows.
//
// Run: node scripts/prepare.mjs && node bench/guided.mjs
// Knobs (env): MODEL (qwen2.5-coder-0.5b-instruct), TOKENS (48), ROUNDS (3), TOOLS ("1,10,50"), BYSTANDERS (2),
//              MAX_SECONDS (900).
import { spawn } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { benchTools } from "./lib.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const BIN = path.join(ROOT, "bin", "keel.mjs");
const num = (k, d) => (process.env[k] ? Number(process.env[k]) : d);
const MODEL = process.env.MODEL ?? "qwen2.5-coder-0.5b-instruct";
const TOKENS = num("TOKENS", 48);
const ROUNDS = num("ROUNDS", 3);
const TOOL_COUNTS = (process.env.TOOLS ?? "1,10,50").split(",").map(Number);
const BYSTANDERS = num("BYSTANDERS", 2);
const MAX_SECONDS = num("MAX_SECONDS", 900);

const children = new Set();
process.on("exit", () => children.forEach((c) => c.exitCode === null && c.kill("SIGKILL")));
setTimeout(() => {
  console.error(`watchdog: ${MAX_SECONDS} s passed; exiting`);
  process.exit(3);
}, MAX_SECONDS * 1000).unref();

const pct = (xs, p) => {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};
const r1 = (x) => (Number.isFinite(x) ? (Math.round(x * 10) / 10).toFixed(1) : "n/a");


async function startServer(guided) {
  const proc = spawn(
    process.execPath,
    [BIN, "serve", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", "--model_path", MODEL, "--max_model_len", "8192",
      "--tool_parser", "hermes3", "--enable_tool_guided_generation", String(guided)],
    { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] },
  );
  children.add(proc);
  let port = 0;
  let ready = false;
  await new Promise((resolve, reject) => {
    for (const s of [proc.stdout, proc.stderr]) {
      let buf = "";
      s.setEncoding("utf8");
      s.on("data", (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          try {
            const j = JSON.parse(line);
            if (j.event === "listening" && j.address?.port) port = j.address.port;
            if (j.event === "engine_ready") ready = true;
          } catch {
            /* not JSON */
          }
          if (port && ready) resolve();
        }
      });
    }
    proc.once("exit", (c) => reject(new Error(`server exited (${c}) before ready`)));
  });
  const models = await (await fetch(`http://127.0.0.1:${port}/v3/models`)).json();
  return { url: `http://127.0.0.1:${port}/v3/chat/completions`, model: models.data[0].id };
}

/** One streaming chat; returns TTFT, arrival times of content/tool deltas, and usage. */
async function stream(server, body) {
  const t0 = performance.now();
  const res = await fetch(server.url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: server.model, stream: true, stream_options: { include_usage: true }, temperature: 0, ...body }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const arrivals = [];
  let usage = null;
  let buf = "";
  const dec = new TextDecoder();
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const j = JSON.parse(ev.slice(6));
      if (j.error) throw new Error(JSON.stringify(j.error));
      if (j.usage) usage = j.usage;
      const d = j.choices?.[0]?.delta;
      if (d && (d.content || d.tool_calls || d.reasoning_content)) arrivals.push(performance.now());
    }
  }
  return { t0, arrivals, usage, end: performance.now() };
}

const [plain, guided] = [await startServer(false), await startServer(true)];
const questions = ["Weather in Paris?", "Is it warm in Rome?", "Forecast for Oslo, 3 days", "Weather in Lima in fahrenheit", "How is the weather in Cairo?"];

/** Sum and count of a Prometheus histogram on a server's /metrics. */
async function histogram(server, name) {
  const text = await (await fetch(server.url.replace(/\/v3\/chat\/completions$/, "/metrics"))).text();
  const num = (suffix) => Number(new RegExp(`^${name}_${suffix}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(text)?.[1] ?? NaN);
  return { sum: num("sum"), count: num("count") };
}

console.log(`model ${MODEL}; ${TOKENS} max tokens; ${ROUNDS} rounds; greedy`);
console.log("(TTFT and decode speed from the server's keel_time_to_first_token / keel_inter_token_latency histograms: a call streams whole)");
console.log("tools  unguided TTFT ms  guided TTFT ms  unguided tok/s  guided tok/s  guided/unguided tok/s");
for (const n of TOOL_COUNTS) {
  const t = benchTools(n);
  const m = { plain: { ttft: [], tps: [] }, guided: { ttft: [], tps: [] } };
  for (let r = 0; r < ROUNDS + 1; r++) {
    const q = questions[r % questions.length];
    for (const [name, server, choice] of [["plain", plain, "auto"], ["guided", guided, "required"]]) {
      const [ttft0, itl0] = [await histogram(server, "keel_time_to_first_token_seconds"), await histogram(server, "keel_inter_token_latency_seconds")];
      await stream(server, { messages: [{ role: "user", content: `${q} (#${r})` }], tools: t, tool_choice: choice, max_tokens: TOKENS });
      const [ttft1, itl1] = [await histogram(server, "keel_time_to_first_token_seconds"), await histogram(server, "keel_inter_token_latency_seconds")];
      if (r === 0) continue; // warm-up: fills the prefix cache with the tool prompt, as an agent fleet's steady state
      m[name].ttft.push((ttft1.sum - ttft0.sum) * 1000);
      const gaps = itl1.count - itl0.count;
      if (gaps > 0) m[name].tps.push(gaps / (itl1.sum - itl0.sum));
    }
  }
  const pt = pct(m.plain.tps, 50);
  const gt = pct(m.guided.tps, 50);
  console.log(`${String(n).padStart(5)}  ${r1(pct(m.plain.ttft, 50)).padStart(16)}  ${r1(pct(m.guided.ttft, 50)).padStart(14)}  ${r1(pt).padStart(14)}  ${r1(gt).padStart(12)}  ${r1(gt / pt).padStart(21)}`);
}

// Bystanders' inter-token latency: alone, and next to one 50-tool request — unconstrained on the unguided server,
// constrained ("required") on the guided one. The batch grows by one sequence in both; the difference is the grammar.
const t50 = benchTools(50);
const gaps = (s) => s.arrivals.slice(1).map((t, i) => t - s.arrivals[i]);
console.log(`\nbystanders (${BYSTANDERS} plain streams of ${TOKENS} tokens) ITL ms        p50    p99`);
for (const [label, server, extra] of [
  ["unguided server, alone", plain, null],
  ["unguided server, + 50-tool auto", plain, { tool_choice: "auto" }],
  ["guided server, alone", guided, null],
  ["guided server, + 50-tool required (guided)", guided, { tool_choice: "required" }],
]) {
  const all = [];
  for (let r = 0; r < ROUNDS; r++) {
    const jobs = Array.from({ length: BYSTANDERS }, (_, i) =>
      stream(server, { messages: [{ role: "user", content: `Tell me a story about boat number ${r * 10 + i}.` }], max_tokens: TOKENS, ignore_eos: true }),
    );
    if (extra) jobs.push(stream(server, { messages: [{ role: "user", content: `Weather in Paris, please (#b${r})` }], tools: t50, max_tokens: TOKENS * 2, ...extra }).then(() => null));
    const done = await Promise.all(jobs);
    for (const s of done.slice(0, BYSTANDERS)) all.push(...gaps(s));
  }
  console.log(`${label.padEnd(48)} ${r1(pct(all, 50)).padStart(6)} ${r1(pct(all, 99)).padStart(6)}`);
}
process.exit(0);
