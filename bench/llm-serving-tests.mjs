#!/usr/bin/env node
// Measurement: the third-party suite aldehir/llm-serving-tests (`llm-serve-test`: chat, tool calls — single, parallel,
// required, complex nested schema, long code in arguments —, json_schema output, agentic multi-turn) against Keel and
// against llama.cpp's own llama-server on the same GGUF, one server after the other on this machine. Prints per-test
// pass counts side by side, the scores per mode and their ratio, and every failure with the suite's message and the
// log holding the request and the answer. Asserts nothing (not part of `npm test`).
// Run `node bench/llm-serving-tests.mjs --help` for the options.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync, readdirSync, openSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { freePort, httpGet, killGroup, lines, serverGroups } from "./lib.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

const HELP = `Usage: node bench/llm-serving-tests.mjs --suite BIN [--flag value ...]

Setup (once): the suite's binary (bash bench/build-llm-serving-tests.sh SRC_DIR: Debian's Go, offline), llama-server
(bash bench/build-llama-server.sh) and Keel's dist/ and models (node scripts/prepare.mjs).

  --suite BIN          the llm-serve-test binary                                    [LLM_SERVE_TEST]
  --llama-server BIN   llama-server (default: the one bench/build-llama-server.sh built)
  --model NAME|FILE    catalogue name or .gguf (default qwen2.5-coder-0.5b-instruct)
  --class C            the suite's --class: standard | reasoning | interleaved (default standard)
  --mode M             the suite's --mode: blocking | streaming | both (default both)
  --all                the suite's --all: also its disabled-by-default tests (agentic_long_response,
                       agentic_incident_investigation)
  --filter TEXT        the suite's --filter: only tests whose name contains TEXT
  --extra K:=JSON      the suite's --extra, for both servers (repeatable), e.g. --extra temperature:=0
  --rounds N           rounds; each round runs Keel then llama-server (alternating order) (default 1)
  --timeout D          the suite's per-request --timeout (default 300s: this measures behaviour, not speed,
                       on a slow shared host; the suite's own default is 30s)
  --slots N            sequence slots on both servers (Keel --max_num_seqs, llama-server -np; default 2)
  --ctx N              tokens per slot (Keel --max_model_len, llama-server -c N*slots; default 4096)
  --threads N          Keel --engine_threads and llama-server -t/-tb (default: Keel's rule, 1 on <= 2 CPUs)
  --keel-args "..."    Keel's tool flags (default "--tool_parser hermes3 --enable_tool_guided_generation true")
  --stall-timeout S    Keel --engine_stall_timeout (default 600: on a starved shared host one 256-token prefill
                       step can outlast the default 30 s and the watchdog restarts the engine again and again;
                       pass 30 to measure Keel's default)
  --llama-args "..."   extra llama-server flags (default none; --jinja is always given)
  --only keel|llama-server   run one server only
  --out DIR            where the suite's logs and the servers' logs go (default /tmp/llm-serving-tests-<time>)
  --merge A.json,B.json  run nothing: print the tables from earlier runs' results.json (e.g. two --only runs)

Example:
  bash bench/build-llama-server.sh && node scripts/prepare.mjs
  BIN=$(bash bench/build-llm-serving-tests.sh /tmp/lst | tail -1)
  nice -n 15 node bench/llm-serving-tests.mjs --suite $BIN --rounds 2
`;

// ---------- options ----------
const argv = process.argv.slice(2);
if (argv.includes("--help") || argv.includes("-h")) {
  console.log(HELP);
  process.exit(0);
}
const FLAGS = new Set(["all"]);
const KNOWN = new Set("suite llama-server model class mode all filter extra rounds timeout slots ctx threads keel-args stall-timeout llama-args only out merge".split(" "));
const opts = { extra: [] };
for (let i = 0; i < argv.length; i++) {
  const name = argv[i].replace(/^--/, "");
  if (!argv[i].startsWith("--") || !KNOWN.has(name)) fail(`unknown argument ${argv[i]} (--help)`);
  if (FLAGS.has(name)) opts[name] = true;
  else if (name === "extra") opts.extra.push(argv[++i]);
  else opts[name] = argv[++i];
}
const CFG = {
  suite: opts.suite ?? process.env.LLM_SERVE_TEST,
  model: opts.model ?? "qwen2.5-coder-0.5b-instruct",
  class: opts.class ?? "standard",
  mode: opts.mode ?? "both",
  all: Boolean(opts.all),
  extra: opts.extra,
  rounds: Number(opts.rounds ?? 1),
  timeout: opts.timeout ?? "300s",
  slots: Number(opts.slots ?? 2),
  ctx: Number(opts.ctx ?? 4096),
  threads: Number(opts.threads ?? (os.cpus().length <= 2 ? 1 : os.cpus().length - 1)),
  keelArgs: (opts["keel-args"] ?? "--tool_parser hermes3 --enable_tool_guided_generation true").split(/\s+/).filter(Boolean),
  stallTimeout: Number(opts["stall-timeout"] ?? 600),
  llamaArgs: (opts["llama-args"] ?? "").split(/\s+/).filter(Boolean),
  only: opts.only,
  out: opts.out ?? path.join(os.tmpdir(), `llm-serving-tests-${new Date().toISOString().replace(/[:.]/g, "-")}`),
};
if (!opts.merge && (!CFG.suite || !existsSync(CFG.suite))) fail(`--suite BIN: the llm-serve-test binary (bash bench/build-llm-serving-tests.sh SRC_DIR)`);
if (CFG.only && !["keel", "llama-server"].includes(CFG.only)) fail("--only keel | llama-server");

function fail(msg) {
  console.error(`llm-serving-tests: ${msg}`);
  process.exit(2);
}

// ---------- processes ----------
/** Servers still running, killed (process group) when this script exits. */
const live = serverGroups();
/** GET a path: its status (0 when the server cannot be reached). */
const httpStatus = async (port, p) => (await httpGet(port, p)).status;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The GGUF both servers load: a .gguf path, or a catalogue name from Keel's cache. */
async function resolveModel(name) {
  if (name.endsWith(".gguf")) return existsSync(name) ? path.resolve(name) : fail(`no such model file ${name}`);
  const cache = await import(path.join(ROOT, "dist/model/model-cache.js"));
  if (!cache.isCatalogueName(name)) fail(`unknown model ${name}: a .gguf path or a catalogue name`);
  const file = await cache.findCachedModel(cache.catalogueModel(name));
  return file ?? fail(`${name} is not cached: run node bin/keel.mjs fetch ${name}`);
}

/** llama-server from --llama-server, else the cache bench/build-llama-server.sh fills. */
function llamaServerBin() {
  if (opts["llama-server"]) return opts["llama-server"];
  const rel = JSON.parse(readFileSync(path.join(ROOT, "node_modules/node-llama-cpp/llama/binariesGithubRelease.json"), "utf8")).release;
  const bin = path.join(process.env.KEEL_CACHE_DIR || path.join(os.homedir(), ".cache", "keel"), "llama-server", rel, "build", "bin", "llama-server");
  return existsSync(bin) ? bin : fail(`no ${bin}: run bash bench/build-llama-server.sh first (or pass --llama-server)`);
}

/** The command line of each server on `port`; both serve the model as "bench". */
function serverCommand(name, model, port) {
  if (name === "keel") {
    return [process.execPath, [path.join(ROOT, "bin/keel.mjs"), "serve", "--model_path", model, "--model_name", "bench", "--rest_port", String(port),
      "--rest_bind_address", "127.0.0.1", "--log_format", "text", "--max_num_seqs", String(CFG.slots), "--max_model_len", String(CFG.ctx),
      "--engine_threads", String(CFG.threads), "--engine_stall_timeout", String(CFG.stallTimeout), ...CFG.keelArgs]];
  }
  return [llamaServerBin(), ["-m", model, "--jinja", "--host", "127.0.0.1", "--port", String(port), "--alias", "bench", "-np", String(CFG.slots),
    "-c", String(CFG.ctx * CFG.slots), "-t", String(CFG.threads), "-tb", String(CFG.threads), "--no-webui", ...CFG.llamaArgs]];
}

/** Start a server, its output into `logFile`; resolves when /v1/models answers 200. */
async function startServer(name, model, logFile) {
  const port = await freePort();
  const [cmd, args] = serverCommand(name, model, port);
  const fd = openSync(logFile, "a");
  const proc = spawn(cmd, args, { cwd: ROOT, stdio: ["ignore", fd, fd], detached: true });
  live.add(proc);
  let exited = false;
  proc.once("exit", () => (exited = true));
  for (const end = Date.now() + 600_000; Date.now() < end; await sleep(250)) {
    if (exited) fail(`${name} exited before it was ready; see ${logFile}`);
    if ((await httpStatus(port, "/v1/models")) === 200 && (name !== "keel" || (await httpStatus(port, "/v2/health/ready")) === 200)) {
      return { port, stop: () => stopServer(proc) };
    }
  }
  fail(`${name} not ready after 600 s; see ${logFile}`);
}
async function stopServer(proc) {
  if (proc.exitCode === null && proc.signalCode === null) {
    const exited = new Promise((r) => proc.once("exit", r));
    killGroup(proc, "SIGTERM");
    const t = setTimeout(() => killGroup(proc, "SIGKILL"), 15_000);
    await exited;
    clearTimeout(t);
  }
  killGroup(proc, "SIGKILL"); // stragglers of the group (Keel's engine child)
  live.delete(proc);
}

// ---------- one suite run ----------
/** `✓ name (mode) (12ms)` / `✗ name (mode) - message`, the suite's sequential result lines (no colour off a TTY). */
const RESULT = /^\s*(✓|✗) (\S+) \((blocking|streaming)\)(?: \((\d+)ms\)| - (.*))?$/;

/** Run the suite against `port` in `dir` (its logs/ go there): [{ test, mode, pass, ms, message }]. */
async function runSuite(port, dir) {
  mkdirSync(dir, { recursive: true });
  const args = ["--base-url", `http://127.0.0.1:${port}/v1`, "--model", "bench", "--class", CFG.class, "--mode", CFG.mode, "--timeout", CFG.timeout,
    ...(CFG.all ? ["--all"] : []), ...(opts.filter ? ["--filter", opts.filter] : []), ...CFG.extra.flatMap((e) => ["--extra", e])];
  const proc = spawn(CFG.suite, args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NO_COLOR: "1" } });
  const results = [];
  const out = [];
  const onLine = (raw) => {
    const line = raw.replace(/\x1b\[[0-9;]*m/g, "");
    out.push(line);
    const m = RESULT.exec(line);
    if (!m) return;
    const r = { test: m[2], mode: m[3], pass: m[1] === "✓", ms: m[4] ? Number(m[4]) : null, message: m[5] ?? "" };
    results.push(r);
    console.log(`  ${r.pass ? "pass" : "FAIL"} ${r.test} (${r.mode})${r.ms !== null ? ` ${r.ms} ms` : ` - ${r.message}`}`);
  };
  lines(proc.stdout, onLine);
  lines(proc.stderr, onLine);
  await new Promise((r) => proc.once("exit", r));
  writeFileSync(path.join(dir, "suite-output.txt"), out.join("\n") + "\n");
  return results;
}

// ---------- main ----------
/** Every result: { server, round, test, mode, pass, ms, message, log }. */
const all = opts.merge ? opts.merge.split(",").flatMap((f) => JSON.parse(readFileSync(f, "utf8")).results) : await runAll();
report(all);

async function runAll() {
  mkdirSync(CFG.out, { recursive: true });
  const model = await resolveModel(CFG.model);
  const servers = CFG.only ? [CFG.only] : ["keel", "llama-server"];
  console.log(`llm-serving-tests: ${CFG.suite}; model ${model}; class ${CFG.class}, mode ${CFG.mode}${CFG.all ? ", --all" : ""}` +
    `${CFG.extra.length ? `, extra ${CFG.extra.join(" ")}` : ""}; ${CFG.rounds} round(s); slots ${CFG.slots} x ${CFG.ctx} tokens; threads ${CFG.threads}; logs in ${CFG.out}`);
  console.log(`keel: ${serverCommand("keel", model, 0)[1].slice(1).join(" ")}`);
  if (servers.includes("llama-server")) console.log(`llama-server: ${serverCommand("llama-server", model, 0).flat().join(" ")}`);

  const all = [];
  for (let round = 1; round <= CFG.rounds; round++) {
    // 1. Alternate which server goes first, so drift in the shared machine's load hits both alike.
    const order = round % 2 ? servers : [...servers].reverse();
    for (const name of order) {
      const dir = path.join(CFG.out, `${name}-r${round}`);
      mkdirSync(dir, { recursive: true });
      console.log(`\n== round ${round}: ${name}`);
      const started = Date.now();
      const server = await startServer(name, model, path.join(dir, "server.log"));
      const results = await runSuite(server.port, dir);
      await server.stop();
      // 2. The suite's per-test log (request, answer, verdict) for each result.
      const logRoot = path.join(dir, "logs", "bench");
      const runDir = existsSync(logRoot) ? readdirSync(logRoot).sort().map((d) => path.join(logRoot, d)).pop() : null;
      for (const r of results) all.push({ server: name, round, ...r, log: runDir ? path.join(runDir, `${r.test} (${r.mode}).log`) : null });
      console.log(`  ${results.filter((r) => r.pass).length}/${results.length} in ${Math.round((Date.now() - started) / 1000)} s`);
    }
}
writeFileSync(path.join(CFG.out, "results.json"), JSON.stringify({ config: { ...CFG, model }, results: all }, null, 2));
console.log(`\nresults: ${path.join(CFG.out, "results.json")}`);
return all;
}

// ---------- report ----------
/** Per-test pass counts side by side, the score per mode with the ratio keel / llama-server, and the failures. */
function report(all) {
  const servers = [...new Set(all.map((r) => r.server))].sort((a, b) => (a === "keel" ? -1 : b === "keel" ? 1 : 0));
  const rounds = Math.max(...all.map((r) => r.round));
  const tests = [...new Set(all.map((r) => r.test))];
  const modes = [...new Set(all.map((r) => r.mode))];
  const count = (server, pred) => {
    const rs = all.filter((r) => r.server === server && pred(r));
    return { pass: rs.filter((r) => r.pass).length, n: rs.length };
  };
  const cell = ({ pass, n }) => (n ? `${pass}/${n}` : "-");
  const pad = (s, w) => String(s).padEnd(w);
  console.log(`\nPassed runs per test (${rounds} round(s)):`);
  console.log(`${pad("test", 34)}${pad("mode", 11)}${servers.map((s) => pad(s, 14)).join("")}`);
  for (const t of tests) for (const m of modes) console.log(`${pad(t, 34)}${pad(m, 11)}${servers.map((s) => pad(cell(count(s, (r) => r.test === t && r.mode === m)), 14)).join("")}`);
  console.log(`\nScore per mode (passed / run) and the ratio keel / llama-server:`);
  for (const m of [...modes, "all"]) {
    const c = servers.map((s) => count(s, (r) => m === "all" || r.mode === m));
    const ratio = c.length === 2 && c[1].pass ? (c[0].pass / c[1].pass).toFixed(2) : "-";
    console.log(`${pad(m, 45)}${c.map((x) => pad(cell(x), 14)).join("")}${c.length === 2 ? `ratio ${ratio}` : ""}`);
}
const failures = all.filter((r) => !r.pass);
if (failures.length) {
  console.log(`\nFailures (the log holds the request and the answer):`);
  for (const f of failures) console.log(`  ${f.server} r${f.round} ${f.test} (${f.mode}): ${f.message}\n      ${f.log}`);
}
}
