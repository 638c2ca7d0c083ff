/**
 * Several models from `--config_path`, end to end with the real engine: two generated tiny models (keel-tiny and
 * keel-tiny-qwen3, different vocabularies), each in its own engine process. Routing by `model`, the OVMS status
 * routes, fault isolation (an injected crash of one model's engine never pauses the other's streams) and
 * `POST /v1/config/reload` under load (no stream dropped, each with the text of an undisturbed run).
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { chat, type ChatResult } from "../support/chat-client.js";
import { get, metrics, startServer, waitForReady, type ServerHandle } from "../support/server.js";

let server: ServerHandle | null = null;
afterEach(async () => {
  await server?.stop();
  server = null;
});

type Entry = Record<string, unknown>;

/** Write an OVMS-shaped config file listing `entries` (each a `config` object); returns its path. */
function writeConfig(file: string, entries: Entry[]): string {
  fs.writeFileSync(file, JSON.stringify({ model_config_list: entries.map((config) => ({ config })) }));
  return file;
}

function tmpConfig(entries: Entry[]): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-multi-"));
  return writeConfig(path.join(dir, "config.json"), entries);
}

async function startWithConfig(file: string, env: Record<string, string> = {}, flags: string[] = []): Promise<ServerHandle> {
  const s = await startServer(["--config_path", file, ...flags], env, { noModelFlag: true });
  await waitForReady(s.baseUrl); // every model ready (startServer waits for the first engine only)
  return s;
}

/** engine_ready log lines of one model (its engines, in start order). */
function engineReadies(s: ServerHandle, model: string): { enginePid: number; time: number; limits: { maxNumSeqs: number } }[] {
  const out: { enginePid: number; time: number; limits: { maxNumSeqs: number } }[] = [];
  for (const l of s.logs) {
    try {
      const j = JSON.parse(l) as { event?: string; model_name?: string; enginePid: number; time: number; limits: { maxNumSeqs: number } };
      if (j.event === "engine_ready" && j.model_name === model) out.push(j);
    } catch {
      /* not JSON */
    }
  }
  return out;
}

/** Times (ms) of one model's log lines with `event`. */
function eventTimes(s: ServerHandle, model: string, event: string): number[] {
  return s.logs.flatMap((l) => {
    try {
      const j = JSON.parse(l) as { event?: string; model_name?: string; time: number };
      return j.event === event && j.model_name === model ? [j.time] : [];
    } catch {
      return [];
    }
  });
}

/** Requests the model's old engine still held when a reload retired it (its `model_retiring` log line). */
function retiringInFlight(s: ServerHandle, model: string): number | undefined {
  for (const l of s.logs) {
    try {
      const j = JSON.parse(l) as { event?: string; model?: string; inFlight?: number };
      if (j.event === "model_retiring" && j.model === model) return j.inFlight;
    } catch {
      /* not JSON */
    }
  }
  return undefined;
}

async function post(baseUrl: string, p: string, body?: unknown): Promise<{ status: number; json: unknown }> {
  const res = await fetch(baseUrl + p, { method: "POST", headers: { "content-type": "application/json" }, ...(body !== undefined ? { body: JSON.stringify(body) } : {}) });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : null };
}

const stream = (model: string, content: string, seed: number, maxTokens = 200) => ({
  model,
  messages: [{ role: "user", content }],
  temperature: 0.8,
  seed,
  ignore_eos: true,
  max_tokens: maxTokens,
  stream: true,
});

function expectIdentical(results: ChatResult[], expected: string[]): void {
  results.forEach((r, i) => {
    expect(r.status, `stream ${i}`).toBe(200);
    expect(r.events.some((e) => "error" in e), `stream ${i} saw an error`).toBe(false);
    expect(r.done, `stream ${i} ended with [DONE]`).toBe(true);
    expect(r.text, `stream ${i}`).toBe(expected[i]);
  });
}

const TWO_MODELS: Entry[] = [
  { name: "tiny", base_path: "keel-tiny", max_num_seqs: 4 },
  { name: "qwen", base_path: "keel-tiny-qwen3", max_num_seqs: 2, max_num_batched_tokens: 64, max_model_len: 256 },
];

describe("several models from --config_path", () => {
  it("each model has its own engine and limits; requests route by model; OVMS status routes answer per model", async () => {
    server = await startWithConfig(tmpConfig(TWO_MODELS));
    const s = server;
    // 1. Listed under every prefix, in config order.
    for (const prefix of ["/v3", "/v1"]) {
      const list = JSON.parse((await get(s.baseUrl, `${prefix}/models`)).body) as { data: { id: string }[] };
      expect(list.data.map((m) => m.id)).toEqual(["tiny", "qwen"]);
    }
    expect((await get(s.baseUrl, "/v3/models/qwen")).status).toBe(200);
    // 2. Two engine processes, each started with its model's own limits.
    const [tinyEngine] = engineReadies(s, "tiny");
    const [qwenEngine] = engineReadies(s, "qwen");
    expect(tinyEngine!.enginePid).not.toBe(qwenEngine!.enginePid);
    expect(tinyEngine!.limits.maxNumSeqs).toBe(4);
    expect(qwenEngine!.limits.maxNumSeqs).toBe(2);
    // The server-wide start lines once, as with --model_path: whether an API key is required.
    const security = s.logs.filter((l) => l.includes('"event":"security"'));
    expect(security).toHaveLength(1);
    expect(JSON.parse(security[0]!)).toMatchObject({ apiKeyRequired: false, msg: "no API key: every route is open" });
    // One ready line once both engines are ready, naming each model with its engine and backend.
    const ready = JSON.parse(await s.waitForLog((l) => l.startsWith("{") && (JSON.parse(l) as { event?: string }).event === "ready")) as { msg: string };
    expect(ready.msg).toMatch(new RegExp(`^ready: ${s.baseUrl.replaceAll(".", "\\.")} \\(models tiny: engine node-llama-cpp@[\\d.]+, backend cpu; qwen: engine node-llama-cpp@[\\d.]+, backend cpu\\)$`));
    // 3. Routing: each answer names its model, and a prompt longer than qwen's 256-token context but within tiny's
    //    2048 is refused by qwen's engine only (the two generated models share weights and tokenizer, so their
    //    limits are what tells their engines apart).
    const long = "word ".repeat(400);
    const ask = (model: string) => post(s.baseUrl, "/v3/chat/completions", { model, messages: [{ role: "user", content: long }], max_tokens: 4 });
    const [tinyAnswer, qwenAnswer] = [await ask("tiny"), await ask("qwen")];
    expect(tinyAnswer.status).toBe(200);
    expect((tinyAnswer.json as { model: string }).model).toBe("tiny");
    expect(qwenAnswer.status).toBe(400);
    expect((qwenAnswer.json as { error: { code: string } }).error.code).toBe("context_length_exceeded");
    const short = await post(s.baseUrl, "/v3/chat/completions", { model: "qwen", messages: [{ role: "user", content: "hi" }], max_tokens: 4 });
    expect(short.status).toBe(200);
    expect((short.json as { model: string }).model).toBe("qwen");
    // 4. Another name: 404 model_not_found naming the served models.
    const missing = await post(s.baseUrl, "/v3/chat/completions", { model: "nope", messages: [{ role: "user", content: "hi" }] });
    expect(missing.status).toBe(404);
    const err = (missing.json as { error: { code: string; message: string } }).error;
    expect(err.code).toBe("model_not_found");
    expect(err.message).toContain('"tiny"');
    expect(err.message).toContain('"qwen"');
    // 5. OVMS status routes.
    const config = JSON.parse((await get(s.baseUrl, "/v1/config")).body) as Record<string, { model_version_status: { version: string; state: string; status: { error_code: string } }[] }>;
    expect(Object.keys(config)).toEqual(["tiny", "qwen"]);
    for (const m of Object.values(config)) expect(m.model_version_status).toEqual([{ version: "1", state: "AVAILABLE", status: { error_code: "OK", error_message: "OK" } }]);
    expect((await get(s.baseUrl, "/v2/models/tiny/ready")).status).toBe(200);
    expect((await get(s.baseUrl, "/v2/models/qwen/ready")).status).toBe(200);
    expect((await get(s.baseUrl, "/v2/models/nope/ready")).status).toBe(404);
    // 6. A reload of a server whose file did not change changes nothing (200, same engines).
    const same = await post(s.baseUrl, "/v1/config/reload");
    expect(same.status).toBe(200);
    expect(engineReadies(s, "tiny")).toHaveLength(1);
    expect(engineReadies(s, "qwen")).toHaveLength(1);
  });

  it("a config with an unknown key is refused at start with a message naming it", async () => {
    const file = tmpConfig([{ name: "tiny", base_path: "keel-tiny", nireq: 4, bogus_setting: 1 }]);
    await expect(startServer(["--config_path", file], {}, { noModelFlag: true })).rejects.toThrow(/nireq is not supported.*bogus_setting|bogus_setting.*nireq/s);
  });

  it("an injected crash of one model's engine never pauses the other model's streams (same text, same engine)", async () => {
    // qwen with its full context here: its streams run long enough to span tiny's engine restarts.
    server = await startWithConfig(tmpConfig([TWO_MODELS[0]!, { ...TWO_MODELS[1]!, max_model_len: 2048 }]), { KEEL_FAULT_INJECTION: JSON.stringify({ crashOnPrompt: "POISON" }) });
    const s = server;
    const prompts = ["Tell me about rivers.", "Count to ten."];
    const expected: string[] = [];
    for (const [i, p] of prompts.entries()) expected.push((await chat(s.baseUrl, stream("qwen", p, 100 + i, 400))).text);
    const qwenPid = engineReadies(s, "qwen")[0]!.enginePid;
    const tinyEnginesBefore = engineReadies(s, "tiny").length;
    /** When each qwen event arrived (ms since epoch). */
    const arrivals: number[] = [];
    let culprit: Promise<ChatResult> | null = null;
    const probes: Promise<number>[] = [];
    const results = await Promise.all(
      prompts.map((p, i) =>
        chat(s.baseUrl, stream("qwen", p, 100 + i, 400), {
          onEvent: (_e, k) => {
            arrivals.push(Date.now());
            // Once both qwen streams are under way, poison the tiny model's engine (it aborts whenever scheduled).
            if (i === 0 && k === 5 && !culprit) culprit = chat(s.baseUrl, stream("tiny", "POISON: this kills the engine", 1, 50));
            // qwen's own readiness, probed now and then throughout (tiny's engine down or not).
            if (i === 1 && k % 20 === 0) probes.push(get(s.baseUrl, "/v2/models/qwen/ready").then((r) => r.status));
          },
        }),
      ),
    );
    expect(culprit).not.toBeNull();
    const poisoned = await culprit!;
    // 1. The other model's streams: the text of undisturbed runs, no error, and its engine never restarted.
    expectIdentical(results, expected);
    expect(engineReadies(s, "qwen").map((e) => e.enginePid)).toEqual([qwenPid]);
    // 2. The poisoned model's engine crashed (and restarted); the culprit alone failed with engine_fault.
    const exits = eventTimes(s, "tiny", "engine_exit");
    expect(exits.length).toBeGreaterThanOrEqual(1);
    const last = poisoned.events.at(-1) as { error?: { code?: string } } | undefined;
    expect(last?.error?.code ?? (poisoned.body as { error?: { code?: string } } | null)?.error?.code).toBe("engine_fault");
    // 3. No gap: qwen tokens kept arriving while the tiny engine was down (between its first exit and its next ready).
    await waitForReady(s.baseUrl);
    const readyAgain = engineReadies(s, "tiny").map((e) => e.time).filter((t) => t > exits[0]!);
    expect(engineReadies(s, "tiny").length).toBeGreaterThan(tinyEnginesBefore);
    const down = arrivals.filter((t) => t > exits[0]! && t < readyAgain[0]!);
    expect(down.length, "qwen events while tiny's engine was down").toBeGreaterThan(0);
    const m = await metrics(s.baseUrl);
    expect(m.get('keel_requests_failed_total{reason="engine_fault"}')).toBe(1);
    // 4. qwen stayed ready throughout (its readiness is its own engine's).
    const statuses = await Promise.all(probes);
    expect(statuses.length).toBeGreaterThan(5);
    expect(new Set(statuses)).toEqual(new Set([200]));
  });
});

describe("a hung engine", () => {
  it("one model's engine frozen (SIGSTOP): the other model's streams run to the end meanwhile; the frozen one is restarted and its stream resumes", async () => {
    // The watchdog acts after 8 s without progress: far longer than qwen's streams below take.
    server = await startWithConfig(tmpConfig([TWO_MODELS[0]!, { ...TWO_MODELS[1]!, max_model_len: 2048 }]), {}, ["--engine_stall_timeout", "8"]);
    const s = server;
    const tinyExpected = (await chat(s.baseUrl, stream("tiny", "Frozen in time.", 5, 200))).text;
    const qwenExpected = [(await chat(s.baseUrl, stream("qwen", "Keep going.", 6, 300))).text, (await chat(s.baseUrl, stream("qwen", "And on.", 7, 300))).text];
    const tinyPid = engineReadies(s, "tiny")[0]!.enginePid;
    // 1. A tiny stream in flight, then its engine frozen.
    let frozen: () => void = () => undefined;
    const isFrozen = new Promise<void>((r) => (frozen = r));
    let stopped = false;
    const tinyStream = chat(s.baseUrl, stream("tiny", "Frozen in time.", 5, 200), {
      onEvent: (_e, k) => {
        if (k === 3 && !stopped) {
          stopped = true;
          process.kill(tinyPid, "SIGSTOP");
          frozen();
        }
      },
    });
    await isFrozen;
    // 2. qwen streams, started and finished while tiny's engine is frozen.
    const qwen = await Promise.all([chat(s.baseUrl, stream("qwen", "Keep going.", 6, 300)), chat(s.baseUrl, stream("qwen", "And on.", 7, 300))]);
    expectIdentical(qwen, qwenExpected);
    expect(eventTimes(s, "tiny", "engine_stalled"), "tiny's engine was still frozen when qwen's streams ended").toEqual([]);
    // 3. The watchdog kills and restarts tiny's engine; its stream resumes with the undisturbed text.
    const tinyResult = await tinyStream;
    expectIdentical([tinyResult], [tinyExpected]);
    expect(eventTimes(s, "tiny", "engine_stalled").length).toBe(1);
    expect(engineReadies(s, "tiny").length).toBe(2);
    expect(engineReadies(s, "qwen").length).toBe(1);
  }, 120_000);
});

describe("POST /v1/config/reload", () => {
  it("a changed model gets a new engine while the old one finishes its streams; an added model starts; a removed one drains; an invalid file changes nothing", async () => {
    const file = tmpConfig([{ name: "tiny", base_path: "keel-tiny", max_num_seqs: 4 }]);
    server = await startWithConfig(file);
    const s = server;
    // Long streams (1,200 tokens each), so that they are still running when the new engine has loaded.
    const prompts = ["Alpha beta gamma.", "Rivers and lakes.", "One two three."];
    const expected: string[] = [];
    for (const [i, p] of prompts.entries()) expected.push((await chat(s.baseUrl, stream("tiny", p, 7 + i, 1200))).text);
    const firstPid = engineReadies(s, "tiny")[0]!.enginePid;

    // 1. Streams in flight across a reload that changes tiny (new limits) and adds qwen.
    writeConfig(file, [{ name: "tiny", base_path: "keel-tiny", max_num_seqs: 3 }, { name: "qwen", base_path: "keel-tiny-qwen3", max_num_seqs: 2 }]);
    let reload: Promise<{ status: number; json: unknown }> | null = null;
    const results = await Promise.all(
      prompts.map((p, i) =>
        chat(s.baseUrl, stream("tiny", p, 7 + i, 1200), {
          onEvent: (_e, k) => {
            if (i === 0 && k === 1 && !reload) reload = post(s.baseUrl, "/v1/config/reload");
          },
        }),
      ),
    );
    expect(reload).not.toBeNull();
    const reloaded = await reload!;
    expectIdentical(results, expected);
    expect(reloaded.status).toBe(201);
    expect(Object.keys(reloaded.json as object)).toEqual(["tiny", "qwen"]);
    // The old engine still held the streams when it was retired (they crossed the reload), then stopped.
    expect(retiringInFlight(s, "tiny")).toBeGreaterThan(0);
    const tinyEngines = engineReadies(s, "tiny");
    expect(tinyEngines.map((e) => e.limits.maxNumSeqs)).toEqual([4, 3]);
    expect(tinyEngines[1]!.enginePid).not.toBe(firstPid);
    // New requests go to the new engine and give the same text (same model file, same seed).
    expect((await chat(s.baseUrl, stream("tiny", prompts[1]!, 8, 1200))).text).toBe(expected[1]);
    expect((await get(s.baseUrl, "/v2/models/qwen/ready")).status).toBe(200);

    // 2. An invalid file: 400 with the reason, nothing changes.
    fs.writeFileSync(file, JSON.stringify({ model_config_list: [{ config: { name: "tiny", base_path: "keel-tiny", max_num_seqs: 0 } }] }));
    const bad = await post(s.baseUrl, "/v1/config/reload");
    expect(bad.status).toBe(400);
    expect((bad.json as { error: { message: string } }).error.message).toMatch(/max_num_seqs/);
    expect(Object.keys(JSON.parse((await get(s.baseUrl, "/v1/config")).body) as object)).toEqual(["tiny", "qwen"]);

    // 3. qwen removed while its streams run: they finish with the undisturbed text; new requests 404.
    const qwenExpected = [(await chat(s.baseUrl, stream("qwen", prompts[0]!, 3, 600))).text];
    writeConfig(file, [{ name: "tiny", base_path: "keel-tiny", max_num_seqs: 3 }]);
    let removal: Promise<{ status: number; json: unknown }> | null = null;
    const qwenResults = await Promise.all([
      chat(s.baseUrl, stream("qwen", prompts[0]!, 3, 600), {
        onEvent: (_e, k) => {
          if (k === 3 && !removal) removal = post(s.baseUrl, "/v1/config/reload");
        },
      }),
    ]);
    expect((await removal!).status).toBe(201);
    expectIdentical(qwenResults, qwenExpected);
    expect(retiringInFlight(s, "qwen")).toBeGreaterThan(0);
    const gone = await post(s.baseUrl, "/v3/chat/completions", { model: "qwen", messages: [{ role: "user", content: "hi" }] });
    expect(gone.status).toBe(404);
    expect((await get(s.baseUrl, "/v2/models/qwen/ready")).status).toBe(404);
  }, 180_000); // long streams on two shared cores: about a minute

  it("a server started from flags (one model) answers a reload with 400: no config file", async () => {
    server = await startServer();
    const r = await post(server.baseUrl, "/v1/config/reload");
    expect(r.status).toBe(400);
    expect((r.json as { error: { code: string } }).error.code).toBe("no_config_file");
  });
});
