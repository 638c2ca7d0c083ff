#!/usr/bin/env node
// Measurement: which catalogue model `keel serve` should serve when none is named. Prints a table; asserts nothing.
//
// For each model it starts `node bin/keel.mjs serve --model_path <MODEL> --tool_parser hermes3 --max_num_seqs 1`
// (the default flags otherwise: CPU, the host's thread rule), then, one request at a time and greedy:
//   - five fixed questions, each checked by a rule: the capital of France (Paris), 17*23 (391), the largest planet
//     (Jupiter, and no other planet named), "good morning" in French (bonjour), and a one-line Python function squaring a number — the answer's
//     code (its fenced block, else from its `def`/`lambda` line) is run by python3 and must return 49 for 7 (no
//     python3: "n/a");
//   - one tool call: "What is the weather in Paris?" with a get_weather tool (tool_choice auto, unguided): correct when
//     the first call names get_weather and its arguments' city is Paris;
//   - speed: a streamed 128-token answer (ignore_eos), REPEATS times: median TTFT and decode tok/s (tokens after the
//     first over the time after the first).
// The size is the cached GGUF's. The machine is shared: the 1-minute load average before each model is printed, and
// tok/s moves with it.
//
// Run (after a build; both models are in the cache after `node scripts/prepare.mjs`, or `keel fetch NAME`):
//   node bench/default-model.mjs
//   MODELS=smollm2-135m-instruct REPEATS=5 node bench/default-model.mjs
//   VERBOSE=1 node bench/default-model.mjs        # also print every answer
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { lines, median, ROOT } from "./lib.mjs";

const MODELS = (process.env.MODELS ?? "smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct").split(",");
const REPEATS = Number(process.env.REPEATS ?? 3);
const VERBOSE = process.env.VERBOSE === "1";

/** [label, question, max_tokens, check(answer) → true/false, or null when the check cannot run here]. */
const QUESTIONS = [
  ["capital of France", "What is the capital of France?", 32, (a) => /\bparis\b/i.test(a)],
  ["17*23", "What is 17*23? Answer with the number.", 32, (a) => /\b391\b/.test(a)],
  ["largest planet", "Which is the largest planet in the solar system?", 32, (a) => /\bjupiter\b/i.test(a) && !/\b(saturn|neptune|uranus|earth|mars|venus|mercury)\b/i.test(a)],
  ["French greeting", "Translate 'good morning' into French.", 32, (a) => /\bbonjour\b/i.test(a)],
  ["Python one-liner", "Write a one-line Python function named square that returns the square of a number. Reply with the code only.", 64, pythonSquares],
];
const WEATHER_TOOL = {
  type: "function",
  function: { name: "get_weather", description: "Current weather in a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
};

/**
 * The answer's code — its first fenced block, else everything from its first `def`/`lambda` line — run by python3:
 * true when the function it defines squares 7 (one line or not: the check is that the code works). Null when python3
 * is missing.
 */
function pythonSquares(answer) {
  const fenced = /```(?:python)?\n([\s\S]*?)```/.exec(answer)?.[1];
  const all = answer.split("\n");
  const start = all.findIndex((l) => /^\s*def \w+\(|^\s*\w+\s*=\s*lambda\b/.test(l));
  const code = fenced ?? (start >= 0 ? all.slice(start).join("\n") : null);
  if (!code) return false;
  const probe = `${code}\nimport types\nf = [v for k, v in list(globals().items()) if isinstance(v, types.FunctionType)][-1]\nprint(f(7))`;
  const r = spawnSync("python3", ["-c", probe], { encoding: "utf8", timeout: 10_000 });
  if (r.error) return null;
  return r.status === 0 && r.stdout.trim() === "49";
}

/** POST `body` as JSON; resolves with the parsed answer. */
async function post(base, body) {
  const r = await fetch(`${base}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const j = await r.json();
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${JSON.stringify(j)}`);
  return j;
}

/** A streamed request of `maxTokens` tokens: TTFT (ms) and decode tok/s after the first token. */
async function timed(base, model, maxTokens) {
  const start = performance.now();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "Write a long story about a lighthouse keeper." }], max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } }),
  });
  let first = 0;
  let tokens = 0;
  let buf = "";
  for await (const chunk of r.body) {
    buf += Buffer.from(chunk).toString("utf8");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const j = JSON.parse(event.slice(6));
      if (first === 0 && j.choices?.[0]?.delta?.content) first = performance.now();
      if (j.usage) tokens = j.usage.completion_tokens;
    }
  }
  const end = performance.now();
  return { ttftMs: first - start, tokPerS: (tokens - 1) / ((end - first) / 1000) };
}

/** Start `keel serve` on `model`; resolves once it is ready, with its base URL and a stop function. */
function serve(model) {
  const proc = spawn(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), "serve", "--model_path", model, "--rest_port", "0", "--rest_bind_address", "127.0.0.1", "--tool_parser", "hermes3", "--max_num_seqs", "1", "--log_format", "json"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  return new Promise((resolve, reject) => {
    let port = 0;
    let servedName = "";
    let ready = false;
    const onLine = (line) => {
      let j;
      try {
        j = JSON.parse(line);
      } catch {
        return;
      }
      if (j.event === "listening") port = j.address.port;
      if (j.event === "model") servedName = j.name;
      if (j.event === "engine_ready") ready = true;
      if (port && ready && servedName) resolve({ base: `http://127.0.0.1:${port}`, servedName, stop: () => new Promise((r) => (proc.once("exit", r), proc.kill("SIGTERM"))) });
    };
    lines(proc.stdout, onLine);
    lines(proc.stderr, onLine);
    proc.once("exit", (c) => reject(new Error(`keel serve ${model} exited (${c}) before ready`)));
  });
}

/** The cached file of catalogue model `name` (keel fetch prints its path; it is already cached). */
function cachedFile(name) {
  const r = spawnSync(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), "fetch", name], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`keel fetch ${name}: ${r.stderr}`);
  return r.stdout.trim().split("\n").pop();
}

const rows = [];
for (const model of MODELS) {
  const file = cachedFile(model);
  const load = os.loadavg()[0];
  const server = await serve(model);
  try {
    const name = server.servedName;
    const checks = [];
    for (const [label, q, maxTokens, check] of QUESTIONS) {
      const a = (await post(server.base, { model: name, messages: [{ role: "user", content: q }], max_tokens: maxTokens, temperature: 0 })).choices[0].message.content ?? "";
      const ok = check(a);
      checks.push([label, ok]);
      if (VERBOSE) console.log(`${model} | ${label} | ${ok} | ${JSON.stringify(a)}`);
    }
    const t = (await post(server.base, { model: name, messages: [{ role: "user", content: "What is the weather in Paris?" }], tools: [WEATHER_TOOL], max_tokens: 64, temperature: 0 })).choices[0];
    const call = t.message.tool_calls?.[0];
    let city = "";
    try {
      city = JSON.parse(call?.function?.arguments ?? "{}").city ?? "";
    } catch {
      /* not JSON: wrong */
    }
    const toolOk = call?.function?.name === "get_weather" && /paris/i.test(city);
    checks.push(["tool call", toolOk]);
    if (VERBOSE) console.log(`${model} | tool call | ${toolOk} | ${JSON.stringify(t.message)}`);
    const runs = [];
    for (let i = 0; i < REPEATS; i++) runs.push(await timed(server.base, name, 128));
    rows.push({ model, size: fs.statSync(file).size, load, checks, ttftMs: median(runs.map((r) => r.ttftMs)), tokPerS: median(runs.map((r) => r.tokPerS)) });
  } finally {
    await server.stop();
  }
}

const labels = [...QUESTIONS.map((q) => q[0]), "tool call"];
const mark = (ok) => (ok === null ? "n/a" : ok ? "yes" : "no");
console.log(`\ndefault-model candidates on ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? "?"}), greedy, --max_num_seqs 1; tok/s and TTFT: median of ${REPEATS} streamed 128-token answers\n`);
console.log(["model", "size MB", ...labels, "correct", "decode tok/s", "TTFT ms", "load avg"].join(" | "));
console.log(Array(labels.length + 6).fill("---").join(" | "));
for (const r of rows) {
  const passed = r.checks.filter(([, ok]) => ok === true).length;
  console.log([r.model, (r.size / 1e6).toFixed(0), ...r.checks.map(([, ok]) => mark(ok)), `${passed}/${r.checks.length}`, r.tokPerS.toFixed(1), r.ttftMs.toFixed(0), r.load.toFixed(2)].join(" | "));
}
