#!/usr/bin/env node
// Endurance benchmark (issue #22 item 7): fuzzed requests over every route of a real `keel serve` (the tiny model).
// Each request picks a route (every API route under /v3, /v3/v1 and /v1, the /v2 health and model-readiness routes,
// config, metrics, and unknown paths), a method (mostly the route's own), and a body: a valid one for that route
// mutated at random (fields removed, retyped, out of range, unknown fields, deep nesting, unicode and lone surrogates,
// truncated JSON, raw bytes), with random header variations (content types, credentials, odd extra headers).
// Prints the status histogram (overall and per route), the count of 5xx answers other than 503 — which must be 0 —
// with examples, non-2xx answers that are not the route's error envelope, connection errors and timeouts, and whether
// the server survived (same process, engine never restarted). Asserts nothing; the exit code is 1 when a 5xx other
// than 503, a bad envelope, a broken connection or a dead server was seen.
//
// Usage: npx tsc -p tsconfig.build.json && node bench/fuzz-routes.mjs [--requests 50000] [--concurrency 8] [--seed 22]
import { spawn } from "node:child_process";
import http from "node:http";
import { arg, freePort, httpGet, killGroup, lines, ROOT, serverGroups, waitReady } from "./lib.mjs";

const REQUESTS = Number(arg("requests", "50000"));
const CONCURRENCY = Number(arg("concurrency", "8"));
const BODY_LIMIT = 262_144;

// A seeded generator: a run can be replayed with --seed.
let seed = Number(arg("seed", "22")) >>> 0;
const rand = () => {
  // mulberry32
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
};
const int = (n) => Math.floor(rand() * n);
const pick = (xs) => xs[int(xs.length)];
const chance = (p) => rand() < p;

// ------------------------------------------------------------------------------------------------- values

const STRINGS = ["", "hi", "keel-tiny", "m", "gpt-4o", "<|im_start|>", "<|im_end|>", "</s>", "\u0000", "\ufffd", "\ufeff", "🦊", "e\u0301", "\ud800", "\udfff", "{{ x }}", "{% if %}", "\\", '"', "\r\n", "a".repeat(3000), "user", "assistant", "system", "tool", "function", "auto", "required", "none", "text", "json_object", "json_schema"];
const NUMBERS = [0, -0, 1, 2, -1, 0.5, 1e-45, 1e308, -1e308, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53, 4294967295.5, 3.7, 100, 1e6];
/** Raw JSON tokens JavaScript cannot write itself. */
const RAW = ["1e400", "-1e400", "123456789012345678901234567890", "-0.0", "1E+2", "4294967296e0", "1e-400"];

/** A random JSON value as text (depth-bounded, with raw tokens and deep nesting now and then). */
function anyJson(depth = 0) {
  const r = int(depth > 2 ? 5 : 8);
  switch (r) {
    case 0:
      return "null";
    case 1:
      return chance(0.5) ? "true" : "false";
    case 2:
      return chance(0.2) ? pick(RAW) : JSON.stringify(chance(0.5) ? pick(NUMBERS) : (rand() - 0.5) * 10 ** int(12));
    case 3:
    case 4:
      return JSON.stringify(chance(0.7) ? pick(STRINGS) : String.fromCharCode(...Array.from({ length: int(12) }, () => int(0x10000))));
    case 5:
      return `[${Array.from({ length: int(4) }, () => anyJson(depth + 1)).join(",")}]`;
    case 6:
      return `{${Array.from({ length: int(4) }, () => `${JSON.stringify(pick([...STRINGS, "model", "messages", "role", "content", "__proto__", "constructor", "type"]))}:${anyJson(depth + 1)}`).join(",")}}`;
    default: {
      const d = pick([10, 100, 1000, 10_000, 100_000]);
      return chance(0.5) ? "[".repeat(d) + "]".repeat(d) : '{"a":'.repeat(d) + "1" + "}".repeat(d);
    }
  }
}

// ------------------------------------------------------------------------------------------------- routes

const msgs = () => [{ role: pick(["user", "user", "system", "assistant"]), content: pick(["hi", "Tell me a story.", "What is 2+2?"]) }];
const tools = () => [{ type: "function", function: { name: "get_weather", description: "Weather", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
/** A valid body for each POST route (small token budgets: accepted ones generate briefly). */
const VALID = {
  "/chat/completions": () => ({ model: "m", messages: msgs(), max_tokens: 1 + int(4), ...(chance(0.4) ? { stream: true } : {}), ...(chance(0.2) ? { temperature: rand() * 2, seed: int(1000) } : {}), ...(chance(0.1) ? { tools: tools(), tool_choice: pick(["auto", "required", "none"]) } : {}), ...(chance(0.1) ? { response_format: { type: "json_object" } } : {}), ...(chance(0.1) ? { logprobs: true, top_logprobs: int(5) } : {}), ...(chance(0.1) ? { n: 2 } : {}) }),
  "/completions": () => ({ model: "m", prompt: chance(0.8) ? "Once upon" : ["a", "b"], max_tokens: 1 + int(4), ...(chance(0.4) ? { stream: true } : {}), ...(chance(0.1) ? { echo: true, logprobs: 2 } : {}) }),
  "/responses": () => ({ model: "m", input: chance(0.7) ? "hi" : [{ role: "user", content: "hi" }], max_output_tokens: 1 + int(4), ...(chance(0.4) ? { stream: true } : {}), ...(chance(0.1) ? { instructions: "Be brief." } : {}) }),
  "/messages": () => ({ model: "m", max_tokens: 1 + int(4), messages: [{ role: "user", content: chance(0.7) ? "hi" : [{ type: "text", text: "hi" }] }], ...(chance(0.4) ? { stream: true } : {}), ...(chance(0.1) ? { system: "Be brief." } : {}) }),
  "/messages/count_tokens": () => ({ model: "m", messages: [{ role: "user", content: "hi" }] }),
  "/tokenize": () => ({ model: "m", text: chance(0.8) ? "hello world" : ["a", "b"] }),
};
const PREFIXES = ["/v3", "/v3/v1", "/v1"];
const OTHER_GETS = ["/v2/health/live", "/v2/health/ready", "/v2/models/m/ready", "/v2/models/nope/ready", "/v2/models/m", "/v1/config", "/metrics"];
const ODD_PATHS = ["/", "/v3", "/v3/", "/v3/chat", "/v3/chat/completions/", "/v3//chat/completions", "/v3/./chat/completions", "/v3/../v3/chat/completions", "/%763/chat/completions", "/v3/chat%2Fcompletions", "/v3/models/%ZZ", "/v3/models/" + "x".repeat(5000), "/v2/models/%2e%2e/ready", "/v3/chat/completions?x=1&x=2", "/v3/models/m?" + "a=b&".repeat(200), "/v3/%00", "/favicon.ico"];

/** A route to hit: { key (for the histogram), method, path, body (Buffer | null) }. */
function request() {
  const r = rand();
  if (r < 0.7) {
    const route = pick(Object.keys(VALID));
    const prefix = pick(PREFIXES);
    return { key: `POST ${route}`, method: chance(0.97) ? "POST" : pick(["GET", "PUT", "DELETE", "PATCH"]), path: prefix + route, body: mutate(VALID[route]()) };
  }
  if (r < 0.8) {
    const prefix = pick(PREFIXES);
    const path = chance(0.5) ? `${prefix}/models` : `${prefix}/models/${pick(["m", "nope", "m/x", "%6d", ""])}`;
    return { key: path.endsWith("/models") ? "GET /models" : "GET /models/{id}", method: chance(0.95) ? "GET" : pick(["POST", "HEAD", "OPTIONS"]), path, body: null };
  }
  if (r < 0.9) {
    const path = pick(OTHER_GETS);
    return { key: `GET ${path}`, method: chance(0.95) ? "GET" : pick(["POST", "HEAD", "OPTIONS", "DELETE"]), path, body: chance(0.1) ? Buffer.from(anyJson()) : null };
  }
  if (r < 0.93) return { key: "POST /v1/config/reload", method: "POST", path: "/v1/config/reload", body: chance(0.5) ? Buffer.from(anyJson()) : null };
  return { key: "odd path", method: pick(["GET", "POST", "OPTIONS", "HEAD"]), path: pick(ODD_PATHS), body: chance(0.5) ? Buffer.from(anyJson()) : null };
}

/** A valid body made invalid (or kept) at random, as bytes. */
function mutate(body) {
  const m = rand();
  if (m < 0.25) return Buffer.from(JSON.stringify(body));
  const entries = Object.entries(body).map(([k, v]) => [k, JSON.stringify(v)]);
  const edits = 1 + int(3);
  for (let i = 0; i < edits; i++) {
    const e = int(6);
    if (e === 0 && entries.length > 0) entries.splice(int(entries.length), 1);
    else if (e === 1 && entries.length > 0) entries[int(entries.length)][1] = anyJson();
    else if (e === 2) entries.push([pick(["stream", "n", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "logit_bias", "tools", "tool_choice", "response_format", "logprobs", "top_logprobs", "stream_options", "user", "x", "__proto__", "messages", "input", "prompt", "text", "system", "max_output_tokens"]), anyJson()]);
    else if (e === 3 && entries.length > 0) entries[int(entries.length)][1] = JSON.stringify(pick(NUMBERS));
    else if (e === 4) entries.push([String.fromCharCode(int(0x10000)), anyJson()]);
    else if (entries.length > 0) {
      // A field nested inside: messages[0].content, tools[0].function.parameters, ...
      const [k, v] = entries[int(entries.length)];
      try {
        const parsed = JSON.parse(v);
        if (Array.isArray(parsed) && parsed.length > 0 && typeof parsed[0] === "object" && parsed[0] !== null) {
          const inner = Object.keys(parsed[0]);
          if (inner.length > 0) parsed[0][pick(inner)] = JSON.parse(anyJson(2).replace(/1e400|-1e400|1e-400/g, "1"));
          entries.splice(entries.findIndex((x) => x[0] === k), 1, [k, JSON.stringify(parsed)]);
        }
      } catch {
        /* a deep or raw value: left as is */
      }
    }
  }
  let text = `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(",")}}`;
  const t = rand();
  if (t < 0.04) text = text.slice(0, int(text.length));
  else if (t < 0.06) return Buffer.from(Array.from({ length: int(64) }, () => int(256)));
  else if (t < 0.07) text = pick(["", " ", "null", "[]", "NaN", "{'a':1}", "\ufeff" + text]);
  return Buffer.from(text, "utf8");
}

const HEADER_VALUES = ["", "x", "application/json", "Bearer x", "*/*", "gzip", "close", "a".repeat(200), "\t", "null"];
function headers(body) {
  const h = {};
  const ct = rand();
  if (ct < 0.6) h["content-type"] = "application/json";
  else if (ct < 0.8) h["content-type"] = pick(["text/plain", "application/json; charset=latin1", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "", "json", "APPLICATION/JSON"]);
  if (chance(0.1)) h["authorization"] = pick(["Bearer x", "Basic eDp5", "Bearer", ""]);
  if (chance(0.05)) h["x-api-key"] = "x";
  if (chance(0.05)) h["origin"] = pick(["http://evil.example", "null", "http://127.0.0.1:1"]);
  if (chance(0.05)) h["accept-encoding"] = pick(["gzip", "br", "identity;q=0", "*"]);
  if (chance(0.05)) h["x-request-id"] = pick(HEADER_VALUES);
  if (chance(0.03)) h["expect"] = pick(["100-continue", "200-ok"]);
  if (chance(0.02)) h["content-encoding"] = pick(["gzip", "deflate", "identity"]);
  for (let i = int(3); i > 0; i--) h[`x-fuzz-${int(1000)}`] = pick(HEADER_VALUES);
  if (body) {
    if (chance(0.15)) h["transfer-encoding"] = "chunked";
    else h["content-length"] = String(body.length);
  }
  return h;
}

// ------------------------------------------------------------------------------------------------- checks

/** Why a non-2xx body is not the route's error envelope (OpenAI's; Anthropic's on /messages), or null. */
function envelopeProblem(key, status, text) {
  if (status < 300 || status === 304) return null;
  if (status === 204) return null;
  let j;
  try {
    j = JSON.parse(text);
  } catch {
    return `${status} body is not JSON: ${text.slice(0, 80)}`;
  }
  const anthropic = key.startsWith("POST /messages");
  if (anthropic && j?.type === "error" && typeof j.error?.type === "string" && typeof j.error?.message === "string") return null;
  const e = j?.error;
  if (!e || typeof e.message !== "string" || typeof e.type !== "string" || !("code" in e) || !("param" in e)) return `${status} not the error envelope: ${text.slice(0, 120)}`;
  return null;
}

// ------------------------------------------------------------------------------------------------- run

const live = serverGroups();
const port = await freePort();
const args = ["bin/keel.mjs", "serve", "--rest_port", String(port), "--rest_bind_address", "127.0.0.1", "--model_path", "keel-tiny", "--model_name", "m", "--max_num_seqs", "4", "--max_num_batched_tokens", "64", "--max_model_len", "512", "--max_request_body", String(BODY_LIMIT), "--tool_parser", "hermes3"];
const proc = spawn(process.execPath, args, { cwd: ROOT, detached: true, stdio: ["ignore", "pipe", "pipe"] });
live.add(proc);
let errorLines = 0;
lines(proc.stdout, (l) => l.includes('"level":50') && (errorLines += 1));
await waitReady(proc, "keel", async () => (await httpGet(port, "/v2/health/ready")).status === 200);

function send({ method, path, body }, hdrs) {
  return new Promise((resolve) => {
    const req = http.request({ host: "127.0.0.1", port, path, method, agent: false, headers: hdrs }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
      res.on("error", (e) => resolve({ status: -1, text: e.code ?? e.message }));
    });
    req.setTimeout(30_000, () => req.destroy(Object.assign(new Error("timeout"), { code: "TIMEOUT" })));
    req.on("error", (e) => resolve({ status: -1, text: e.code ?? e.message }));
    if (body && hdrs["transfer-encoding"] === "chunked") {
      const cut = int(body.length + 1);
      req.write(body.subarray(0, cut));
      req.end(body.subarray(cut));
    } else req.end(body ?? undefined);
  });
}

const statuses = new Map();
const byRoute = new Map();
const bad5xx = [];
const badEnvelope = [];
const connErrors = new Map();
let done = 0;
const t0 = performance.now();
const worker = async () => {
  while (done < REQUESTS) {
    done += 1;
    const r = request();
    const h = headers(r.body);
    const { status, text } = await send(r, h);
    statuses.set(status, (statuses.get(status) ?? 0) + 1);
    const row = byRoute.get(r.key) ?? new Map();
    row.set(status, (row.get(status) ?? 0) + 1);
    byRoute.set(r.key, row);
    if (status === -1) connErrors.set(text, (connErrors.get(text) ?? 0) + 1);
    else if (status >= 500 && status !== 503) bad5xx.push({ status, method: r.method, path: r.path.slice(0, 120), headers: h, body: r.body?.toString("utf8").slice(0, 300), answer: text.slice(0, 300) });
    else if (r.method !== "HEAD") {
      const p = envelopeProblem(r.key, status, text);
      if (p) badEnvelope.push({ problem: p, method: r.method, path: r.path.slice(0, 120) });
    }
    if (done % 5000 === 0) console.log(`… ${done} requests, ${((performance.now() - t0) / 1000).toFixed(0)} s`);
  }
};
await Promise.all(Array.from({ length: CONCURRENCY }, worker));
const seconds = (performance.now() - t0) / 1000;

const metricsText = (await httpGet(port, "/metrics")).body;
const metric = (name) => metricsText.split("\n").filter((l) => l.startsWith(name)).map((l) => Number(l.split(" ").pop())).reduce((a, v) => a + v, 0);
const alive = proc.exitCode === null && proc.signalCode === null;
const ready = (await httpGet(port, "/v2/health/ready")).status;
const fresh = await send({ method: "POST", path: "/v3/chat/completions", body: Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 2 })) }, { "content-type": "application/json" });

const hist = (m) => [...m].sort((a, b) => a[0] - b[0]).map(([s, n]) => `${s === -1 ? "conn-error" : s}: ${n}`).join(", ");
console.log(`\nfuzz-routes: ${done} requests in ${seconds.toFixed(0)} s (${(done / seconds).toFixed(0)} req/s), concurrency ${CONCURRENCY}, seed ${arg("seed", "22")}`);
console.log(`status histogram: ${hist(statuses)}`);
console.table([...byRoute].sort().map(([route, m]) => ({ route, requests: [...m.values()].reduce((a, b) => a + b, 0), statuses: hist(m) })));
console.log(`5xx other than 503: ${bad5xx.length}`);
for (const b of bad5xx.slice(0, 10)) console.log(`  ${JSON.stringify(b)}`);
console.log(`non-2xx answers not in the error envelope: ${badEnvelope.length}`);
for (const b of badEnvelope.slice(0, 10)) console.log(`  ${JSON.stringify(b)}`);
console.log(`connection errors / timeouts: ${[...connErrors].map(([k, n]) => `${k}: ${n}`).join(", ") || "none"}`);
console.log(`server: alive ${alive}, ready ${ready}, a fresh chat ${fresh.status}; engine restarts ${metric("keel_engine_restarts_total")}; error log lines ${errorLines}; running ${metric("keel_requests_running")}, waiting ${metric("keel_requests_waiting")}`);

live.delete(proc);
const gone = new Promise((r) => proc.once("exit", r));
killGroup(proc, "SIGTERM");
await gone;
process.exit(bad5xx.length > 0 || badEnvelope.length > 0 || connErrors.size > 0 || !alive || fresh.status !== 200 ? 1 : 0);
