#!/usr/bin/env node
// Endurance benchmark (issue #22 item 7): a soak of N minutes at --streams concurrent streams, a share of them
// (--disconnect, 25 %) leaving at a random point (FIN or RST, at the headers or after a random number of chunks), on
// either engine. Prints the gateway's and the engine's RSS at the start and end of the soak and their slope per minute
// over its last third (a leak keeps rising; a warm-up levels off), the gateway's live V8 heap per third, and the
// survivors' decode tok/s against an undisturbed baseline run first on the same server. Prints figures; asserts nothing (docs/benchmarks.md "Soak").
//
// Usage: npx tsc -p tsconfig.build.json && node bench/soak.mjs [--engine llama.cpp|openvino] [--minutes 2]
//          [--streams 16] [--disconnect 0.25] [--max_tokens 96] [--baseline_s 20] [--sample_s 5] [--model M]
//          [--warm_min min(5, minutes/10)] [--serve_args '["--flag","value"]'] (env KEEL_OV_TRACEMALLOC=FILE: the OpenVINO worker's Python allocation growth)
//        The real run: --minutes 60.
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import { arg, freePort, httpGet, killGroup, lines, median, ROOT, serverGroups, waitReady } from "./lib.mjs";

const ENGINE = arg("engine", "llama.cpp");
const MINUTES = Number(arg("minutes", "2"));
const STREAMS = Number(arg("streams", "16"));
const DISCONNECT = Number(arg("disconnect", "0.25"));
const MAX_TOKENS = Number(arg("max_tokens", "96"));
const BASELINE_S = Number(arg("baseline_s", "20"));
const SAMPLE_S = Number(arg("sample_s", "5"));
/** Minutes after which a process counts as warm (V8 sizing its heap, lazily filled pools): growth is also printed from there. */
const WARM_MIN = Number(arg("warm_min", String(Math.min(5, MINUTES / 10))));
const MODEL = arg("model", ENGINE === "openvino" ? "keel-tiny-f16" : "keel-tiny");
/** Extra `keel serve` flags, one JSON array (e.g. '["--plugin_config","{\"CPU_RUNTIME_CACHE_CAPACITY\":\"100\"}"]'). */
const SERVE_ARGS = JSON.parse(arg("serve_args", "[]"));
const PROMPTS = ["Write a story about a lighthouse keeper.", "Explain how a queue works.", "List some rivers of Europe.", "Describe a busy train station.", "What makes bread rise?", "Tell me about the moon.", "How do servers handle load?", "Describe autumn in a forest."];

// A seeded generator, so that a run's disconnect pattern can be replayed.
let seed = Number(arg("seed", "22"));
const rand = () => ((seed = (seed * 1_103_515_245 + 12_345) & 0x7fffffff) / 0x7fffffff);

const live = serverGroups();
const port = await freePort();
const args = ["bin/keel.mjs", "serve", "--rest_port", String(port), "--rest_bind_address", "127.0.0.1", "--model_path", MODEL, "--model_name", "m", "--engine", ENGINE, "--max_num_seqs", String(STREAMS), "--max_queued_requests", String(STREAMS * 4), ...SERVE_ARGS];
const proc = spawn(process.execPath, args, { cwd: ROOT, detached: true, stdio: ["ignore", "pipe", "pipe"] });
live.add(proc);
let gatewayPid = 0;
let enginePid = 0;
let engineStarts = 0;
lines(proc.stdout, (l) => {
  try {
    const j = JSON.parse(l);
    if (j.component === "gateway" && j.pid) gatewayPid = j.pid;
    if (j.event === "engine_ready") (enginePid = j.enginePid), (engineStarts += 1);
  } catch {
    /* not JSON */
  }
});
await waitReady(proc, "keel", async () => (await httpGet(port, "/v2/health/ready")).status === 200);

/** Resident set size of `pid` in MB (0 when it is gone). */
function rssMb(pid) {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"));
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
}
const comm = (pid) => {
  try {
    return fs.readFileSync(`/proc/${pid}/comm`, "utf8").trim();
  } catch {
    return "?";
  }
};

/**
 * One streamed chat. `leave` = null reads it to the end; else { at: chunk index to leave after (0: at the headers),
 * mode: "fin" | "rst" }. Resolves { outcome: "done" | "left" | "broken" | "status <n>", tokens, decodeTokS }.
 */
function streamChat(leave) {
  return new Promise((resolve) => {
    const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: PROMPTS[Math.floor(rand() * PROMPTS.length)] }], max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    let first = 0;
    let last = 0;
    let chunks = 0;
    let usage = 0;
    let done = false;
    let settled = false;
    const settle = (r) => !settled && ((settled = true), resolve(r));
    const req = http.request({ host: "127.0.0.1", port, path: "/v3/chat/completions", method: "POST", agent: false, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        return res.on("end", () => settle({ outcome: `status ${res.statusCode}`, tokens: 0, decodeTokS: 0 }));
      }
      const leaveNow = () => {
        if (leave.mode === "rst") req.socket.resetAndDestroy();
        else req.socket.destroy();
        settle({ outcome: "left", tokens: chunks, decodeTokS: 0 });
      };
      if (leave && leave.at === 0) return leaveNow();
      let buf = "";
      res.setEncoding("utf8");
      res.on("data", (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0 && !settled) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (ev === "data: [DONE]") done = true;
          if (!ev.startsWith("data: {")) continue;
          const j = JSON.parse(ev.slice(6));
          if (j.usage) usage = j.usage.completion_tokens;
          if (j.choices?.[0]?.delta?.content) {
            last = performance.now();
            if (chunks === 0) first = last;
            chunks += 1;
            if (leave && chunks === leave.at) return leaveNow();
          }
        }
      });
      res.on("end", () => settle({ outcome: done ? "done" : "broken", tokens: usage, decodeTokS: usage > 1 && last > first ? (usage - 1) / ((last - first) / 1000) : 0 }));
      res.on("error", () => settle({ outcome: "broken", tokens: usage, decodeTokS: 0 }));
    });
    req.on("error", () => settle({ outcome: leave ? "left" : "broken", tokens: 0, decodeTokS: 0 }));
    req.end(body);
  });
}

/** `STREAMS` clients back to back for `seconds`; a share `disconnectShare` of the requests leave early. */
async function phase(seconds, disconnectShare) {
  const results = [];
  const end = Date.now() + seconds * 1000;
  const client = async () => {
    while (Date.now() < end) {
      const leave = rand() < disconnectShare ? { at: Math.floor(rand() * (MAX_TOKENS / 2)), mode: rand() < 0.5 ? "fin" : "rst" } : null;
      results.push({ leaving: leave !== null, ...(await streamChat(leave)) });
    }
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: STREAMS }, client));
  return { results, seconds: (performance.now() - t0) / 1000 };
}

function summary(name, { results, seconds }) {
  const survivors = results.filter((r) => !r.leaving);
  const done = survivors.filter((r) => r.outcome === "done");
  const tokens = done.reduce((a, r) => a + r.tokens, 0);
  const outcomes = {};
  for (const r of results) outcomes[r.outcome] = (outcomes[r.outcome] ?? 0) + 1;
  return { phase: name, seconds: seconds.toFixed(0), requests: results.length, left: results.filter((r) => r.leaving).length, survivors: survivors.length, "survivors done": done.length, outcomes: JSON.stringify(outcomes), "survivors tok/s (sum)": (tokens / seconds).toFixed(0), "per-stream decode tok/s (median)": (median(done.map((r) => r.decodeTokS)) ?? 0).toFixed(1) };
}

/** Least-squares slope of y over x. */
function slope(points) {
  const n = points.length;
  if (n < 2) return 0;
  const mx = points.reduce((a, p) => a + p[0], 0) / n;
  const my = points.reduce((a, p) => a + p[1], 0) / n;
  const num = points.reduce((a, p) => a + (p[0] - mx) * (p[1] - my), 0);
  const den = points.reduce((a, p) => a + (p[0] - mx) ** 2, 0);
  return den === 0 ? 0 : num / den;
}

/** The sum of `name`'s samples on /metrics; NaN when the server exports no such family (an older gateway). */
const metric = async (name) => {
  const text = (await httpGet(port, "/metrics")).body;
  const values = text.split("\n").filter((l) => l.startsWith(name)).map((l) => Number(l.split(" ").pop()));
  return values.length === 0 ? NaN : values.reduce((a, v) => a + v, 0);
};

console.log(`soak: engine ${ENGINE}, model ${MODEL}, ${STREAMS} streams, ${DISCONNECT * 100} % leaving, max_tokens ${MAX_TOKENS}, baseline ${BASELINE_S} s, soak ${MINUTES} min`);
console.log(`processes: gateway ${gatewayPid} (${comm(gatewayPid)}), engine ${enginePid} (${comm(enginePid)})`);
const baseline = await phase(BASELINE_S, 0);
/** [minute, gateway RSS MB, engine RSS MB, gateway V8 heap used MB (live objects and garbage not yet collected)]. */
const samples = [];
const t0 = Date.now();
/** The sample being taken (its heap read is a request): awaited before the last one, so samples stay in time order. */
let sampling = Promise.resolve();
const sample = () =>
  (sampling = sampling.then(async () => {
    const at = (Date.now() - t0) / 60_000;
    const [gateway, engine] = [rssMb(gatewayPid), rssMb(enginePid)];
    const heap = (await metric("nodejs_heap_size_used_bytes").catch(() => NaN)) / 1024 / 1024;
    samples.push([at, gateway, engine, heap]);
  }));
await sample();
const sampler = setInterval(sample, SAMPLE_S * 1000);
const soak = await phase(MINUTES * 60, DISCONNECT);
clearInterval(sampler);
await sampling;
// Back to idle before the last sample: what is left then is what stays.
for (let i = 0; i < 200 && ((await metric("keel_requests_running")) > 0 || (await metric("keel_engine_sequences_active")) > 0); i++) await new Promise((r) => setTimeout(r, 50));
await sample();

console.table([summary("baseline (undisturbed)", baseline), summary("soak", soak)]);
const lastThird = samples.filter((s) => s[0] >= (samples.at(-1)[0] * 2) / 3);
const rssRow = (name, col) => {
  const start = samples[0][col];
  const warm = (samples.find((s) => s[0] >= WARM_MIN) ?? samples.at(-1))[col];
  const end = samples.at(-1)[col];
  const pct = (from) => (((end - from) / from) * 100).toFixed(1);
  return { process: name, "start MB": start.toFixed(1), [`at ${WARM_MIN} min`]: warm.toFixed(1), "max MB": Math.max(...samples.map((s) => s[col])).toFixed(1), "end MB": end.toFixed(1), "change %": pct(start), "change from warm %": pct(warm), "slope MB/min (last third)": slope(lastThird.map((s) => [s[0], s[col]])).toFixed(2) };
};
console.table([rssRow("gateway", 1), rssRow(`engine (${ENGINE})`, 2)]);
// The gateway's live heap: the least "heap used" in each third of the soak is close to what survives a full
// collection (V8 collects the old generation every few minutes under this load). A leak raises it third by third;
// V8 sizing its heap raises RSS but not this floor.
// Thirds are half-open ([k/3, (k+1)/3) of the soak's length, the last one closed); a third without a heap reading
// (samples sparser than a third, or a gateway without the metric) prints n/a.
const span = samples.at(-1)[0];
const inThird = (k, at) => at >= (span * k) / 3 && (k === 2 ? at <= span : at < (span * (k + 1)) / 3);
const floors = [0, 1, 2].map((k) => {
  const heaps = samples.filter((s) => inThird(k, s[0]) && Number.isFinite(s[3])).map((s) => s[3]);
  return heaps.length > 0 ? Math.min(...heaps) : NaN;
});
const mb = (v) => (Number.isFinite(v) ? v.toFixed(1) : "n/a");
const heaps = samples.map((s) => s[3]).filter(Number.isFinite);
const change = Number.isFinite(floors[0]) && Number.isFinite(floors[2]) ? `${(((floors[2] - floors[0]) / floors[0]) * 100).toFixed(1)} %` : "n/a";
console.log(`gateway V8 heap used, least per third of the soak: ${floors.map(mb).join(" / ")} MB (last vs first ${change}); max ${mb(heaps.length > 0 ? Math.max(...heaps) : NaN)} MB`);
console.log(`RSS samples (min, gateway MB, engine MB): ${samples.map((s) => `${s[0].toFixed(1)}:${s[1].toFixed(0)}/${s[2].toFixed(0)}`).join(" ")}`);
const disconnects = await metric("keel_client_disconnects_total");
const restarts = await metric("keel_engine_restarts_total");
const ratio = Number(summary("", soak)["per-stream decode tok/s (median)"]) / Number(summary("", baseline)["per-stream decode tok/s (median)"]);
console.log(`survivors' per-stream decode tok/s vs baseline: ${ratio.toFixed(2)}; client disconnects counted: ${disconnects}; engine restarts: ${restarts}; engine starts seen: ${engineStarts}; running after: ${await metric("keel_requests_running")}, waiting after: ${await metric("keel_requests_waiting")}`);

live.delete(proc);
const gone = new Promise((r) => proc.once("exit", r));
killGroup(proc, "SIGTERM");
await gone;
process.exit(0);
