/**
 * The `keel` command line: help, refusal of unknown flags and bad values, and startup validation of a model that
 * makes llama.cpp abort (GGML_ASSERT) — caught in a throwaway child with a clear message and exit code 1.
 */
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { buildTinyModel } from "../../src/model/tiny-model.js";
import { chat } from "../support/chat-client.js";
import { hybridModel } from "../support/openvino.js";
import { get, metrics, ROOT, startServer } from "../support/server.js";

const keel = (...args: string[]) =>
  spawnSync(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), ...args], { cwd: ROOT, encoding: "utf8", timeout: 60_000 });

describe("keel serve flags", () => {
  it("--help lists every flag with its default", () => {
    const r = keel("serve", "--help");
    expect(r.status).toBe(0);
    for (const f of ["--rest_port", "--rest_bind_address", "--model_path", "--model_name", "--max_num_seqs", "--max_num_batched_tokens", "--max_model_len", "--log_level", "--engine_threads"]) {
      expect(r.stdout).toContain(f);
    }
    // OVMS's flags too, and the engine threads rule.
    for (const f of ["--task", "--target_device", "--plugin_config", "--cache_interval_multiplier", "--dynamic_split_fuse", "--pipeline_type", "--log_path", "--log_format", "--metrics_enable", "--rest_workers", "--cache_dir", "--port", "--config_path", "--api_key_file"]) {
      expect(r.stdout).toContain(f);
    }
    expect(r.stdout).toContain("1 on hosts with <= 2 CPUs, else physical cores - 1");
    expect(r.stdout).toContain("(default: 8000)");
    expect(r.stdout).toContain("(default: 256)");
  });

  it("an unknown flag exits 2 with a message naming it", () => {
    const r = keel("serve", "--no_such_flag", "1");
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/no_such_flag/);
  });

  it("a bad value exits 2 with a message naming the flag", () => {
    const r = keel("serve", "--max_num_seqs", "zero");
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/--max_num_seqs must be an integer/);
  });

  it("refuses max_num_batched_tokens < max_num_seqs", () => {
    const r = keel("serve", "--max_num_seqs", "8", "--max_num_batched_tokens", "4");
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/max_num_batched_tokens \(4\) must be >= --max_num_seqs \(8\)/);
  });

  for (const broken of ["zero-layers", "kv-heads-3"] as const) {
    it(`a model that aborts llama.cpp (${broken}) is caught at startup: clear message, exit 1`, () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-broken-"));
      const file = path.join(dir, `broken-${broken}.gguf`);
      fs.writeFileSync(file, buildTinyModel({ broken, layers: 2, hidden: 64, ff: 128, heads: 4, kvHeads: 2, merges: 50 }));
      const r = keel("serve", "--model_path", file, "--rest_port", "0", "--rest_bind_address", "127.0.0.1");
      expect(r.status).toBe(1);
      expect(r.stderr).toContain(`the model ${file} cannot be loaded`);
      fs.rmSync(dir, { recursive: true, force: true });
    });
  }

  it("--max_model_len beyond the model's trained context exits 2", () => {
    const r = keel("serve", "--model_path", "keel-tiny", "--max_model_len", "1048576", "--rest_port", "0", "--rest_bind_address", "127.0.0.1");
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/exceeds the model's trained context of 2048 tokens/);
  });

  it("a port already in use exits 1 with a clear message", async () => {
    const net = await import("node:net");
    const blocker = net.createServer();
    await new Promise<void>((r) => blocker.listen(0, "127.0.0.1", () => r()));
    const port = (blocker.address() as { port: number }).port;
    const r = keel("serve", "--model_path", "keel-tiny", "--rest_port", String(port), "--rest_bind_address", "127.0.0.1");
    blocker.close();
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`port ${port} on 127.0.0.1 is already in use`);
  });

  it("a file that is not a model is refused at startup with exit 1", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-notmodel-"));
    const file = path.join(dir, "not-a-model.gguf");
    fs.writeFileSync(file, "this is not gguf");
    const r = keel("serve", "--model_path", file, "--rest_port", "0", "--rest_bind_address", "127.0.0.1");
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`the model file ${file} is not a GGUF file`);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it("a directory without a GGUF as model path gets a clear message, not EISDIR", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-dir-"));
    const r = keel("serve", "--model_path", dir, "--rest_port", "0", "--rest_bind_address", "127.0.0.1");
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`the model directory ${dir} has no .gguf file; --model_path needs a GGUF file, a directory holding one`);
    expect(r.stderr).not.toMatch(/EISDIR/);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it("a --plugin_config value OpenVINO rejects names the flag and the key, not the model", () => {
    const r = keel("serve", "--model_path", "keel-tiny-f16", "--engine", "openvino", "--plugin_config", '{"CPU_RUNTIME_CACHE_CAPACITY":"abc"}', "--rest_port", "0", "--rest_bind_address", "127.0.0.1");
    expect(r.status).toBe(1);
    expect(r.stderr).toContain("--plugin_config CPU_RUNTIME_CACHE_CAPACITY: OpenVINO refused it");
    expect(r.stderr).toContain("Wrong value abc");
    expect(r.stderr).not.toContain("cannot be loaded");
  });

  it("a truncated GGUF gets a clear message, not a JavaScript TypeError", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-trunc-"));
    const whole = buildTinyModel({ layers: 1, hidden: 64, ff: 128, heads: 4, kvHeads: 2, merges: 50 });
    for (const bytes of [8, 100]) {
      const file = path.join(dir, `trunc-${bytes}.gguf`);
      fs.writeFileSync(file, whole.subarray(0, bytes));
      const r = keel("serve", "--model_path", file, "--rest_port", "0", "--rest_bind_address", "127.0.0.1");
      expect(r.status).toBe(1);
      expect(r.stderr).toContain(`the model ${file} cannot be loaded`);
      expect(r.stderr).not.toMatch(/Cannot read properties of undefined/);
    }
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it("every unknown flag is reported in one run, with one line pointing at --help instead of the whole help", () => {
    const r = keel("serve", "--no_such_flag", "1", "--max_num_seqs", "4", "--other_flag");
    expect(r.status).toBe(2);
    expect(r.stderr).toContain("unknown flags --no_such_flag, --other_flag");
    expect(r.stderr).toContain('Run "keel serve --help"');
    expect(r.stderr).not.toContain("--rest_bind_address");
    expect(r.stderr.trim().split("\n")).toHaveLength(2);
  });

  it("killing the startup model check (as an OOM killer would) is not reported as a bad model: it is retried", async () => {
    const proc = spawn(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), "serve", "--model_path", "keel-tiny", "--rest_port", "0", "--rest_bind_address", "127.0.0.1"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    proc.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
    proc.stderr.setEncoding("utf8").on("data", (d: string) => (out += d));
    const exited = new Promise<number | null>((r) => proc.once("exit", (c) => r(c)));
    try {
      // Find the model-check child (a validate-mode engine whose parent is this server) and SIGKILL it.
      let killed = false;
      for (let i = 0; i < 400 && !killed; i++) {
        for (const pid of fs.readdirSync("/proc").filter((d) => /^\d+$/.test(d))) {
          try {
            const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
            const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
            if (ppid === proc.pid && fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").includes('"mode":"validate"')) {
              process.kill(Number(pid), "SIGKILL");
              killed = true;
              break;
            }
          } catch {
            /* the process went away while we looked */
          }
        }
        if (!killed) await new Promise((r) => setTimeout(r, 10));
      }
      expect(killed).toBe(true);
      // The server carries on: the retried check passes and the engine becomes ready.
      for (let i = 0; i < 600 && !out.includes('"event":"engine_ready"') && proc.exitCode === null; i++) await new Promise((r) => setTimeout(r, 50));
      expect(out).not.toContain("cannot be loaded");
      expect(out).toContain('"event":"engine_ready"');
    } finally {
      proc.kill("SIGTERM");
      await exited;
    }
  });
});

/** The seed's command line (issue #10), exactly as a shell passes it. */
const SEED_LINE = ["--task=text_generation", "--target_device=GPU", '--plugin_config={"ENABLE_CPU_PINNING":false}', "--tool_parser", "qwen3coder", "--enable_tool_guided_generation", "true", "--reasoning_parser", "qwen3", "--kv_cache_precision", "u8", "--cache_size", "4", "--enable_prefix_caching", "true", "--cache_interval_multiplier", "64", "--max_num_seqs", "16", "--max_num_batched_tokens", "4096"];

describe("start-up lines", () => {
  it("the model check says what it does and how long each phase took; one ready line names the URL, model, engine and backend", async () => {
    const server = await startServer();
    const isReady = (l: string): boolean => l.startsWith("{") && (JSON.parse(l) as { event?: string }).event === "ready";
    try {
      const line = await server.waitForLog(isReady);
      const ready = JSON.parse(line) as { msg: string; url: string; models: { name: string; engine: string; backend: { gpu: unknown } }[] };
      expect(ready.msg).toMatch(new RegExp(`^ready: http://127\\.0\\.0\\.1:${server.port} \\(model keel-tiny, engine node-llama-cpp@\\d+\\.\\d+\\.\\d+, backend cpu\\)$`));
      expect(ready.url).toBe(server.baseUrl);
      expect(ready.models).toMatchObject([{ name: "keel-tiny", backend: { gpu: false } }]);
      // It follows the engine's ready line, and the server answers ready.
      expect(server.logs.indexOf(line)).toBeGreaterThan(server.logs.findIndex((l) => l.includes('"event":"engine_ready"')));
      expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
      // Before the gateway listens: the check announced, then its time by phase.
      const at = (re: RegExp): number => server.logs.findIndex((l) => re.test(l));
      const check = at(/^keel serve: checking \S+ in a throwaway engine process \(it loads the model once; a model that crashes the engine stops only that process\)…$/);
      const passed = at(/^keel serve: model check passed in \d+\.\d s \(process start \d+\.\d s, backend \d+\.\d s, model load \d+\.\d s, context \d+\.\d s\)$/);
      expect(check).toBeGreaterThanOrEqual(0);
      expect(passed).toBeGreaterThan(check);
      expect(at(/"event":"listening"/)).toBeGreaterThan(passed);
    } finally {
      await server.stop();
    }
    expect(server.logs.filter(isReady)).toHaveLength(1);
  }, 60_000);
});

describe("the model check is remembered", () => {
  it("a check that passed for this file, configuration and install is not run again; another configuration is checked", async () => {
    // Its own cache root (the suites run with KEEL_MODEL_CHECK_CACHE=off: vitest.config.ts).
    const cacheRoot = fs.mkdtempSync(path.join(os.tmpdir(), "keel-check-cache-"));
    const env = { KEEL_MODEL_CHECK_CACHE: "on", KEEL_CACHE_DIR: cacheRoot };
    const checked = (s: { logs: string[] }): boolean => s.logs.some((l) => /^keel serve: model check passed in /.test(l));
    const remembered = (s: { logs: string[] }): boolean => s.logs.some((l) => /^keel serve: model check: \S+ passed before with these settings/.test(l));
    try {
      for (const [flags, expectChecked] of [[[], true], [[], false], [["--max_num_seqs", "3"], true]] as const) {
        const server = await startServer([...flags], env);
        try {
          expect([checked(server), remembered(server)]).toEqual([expectChecked, !expectChecked]);
          expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
        } finally {
          await server.stop();
        }
      }
      expect(fs.readdirSync(path.join(cacheRoot, "checks"))).toHaveLength(2);
    } finally {
      fs.rmSync(cacheRoot, { recursive: true, force: true });
    }
  }, 120_000);
});

describe("the seed's command line", () => {
  it("unchanged, on a machine without a GPU: exit 1 with one clear GPU message (no silent CPU fallback, no help dump)", () => {
    const r = keel("serve", ...SEED_LINE);
    expect(r.status).toBe(1);
    // The model check's first line, then its verdict: one message.
    const lines = r.stderr.trim().split("\n");
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatch(/^keel serve: checking \S+ in a throwaway engine process/);
    expect(lines[1]).toMatch(/^keel serve: --target_device GPU: no GPU backend loads on this machine .*--target_device CPU/);
    expect(r.stdout).toBe("");
  }, 60_000);

  it("on the OpenVINO engine, --target_device GPU without an Intel GPU: exit 1 with one message naming OpenVINO's cause", () => {
    const r = keel("serve", "--engine", "openvino", "--model_path", "keel-tiny-f16", "--target_device", "GPU");
    expect(r.status).toBe(1);
    const lines = r.stderr.trim().split("\n").filter((l) => !l.includes("OpenVINO engine python"));
    expect(lines.at(-1)).toMatch(/^keel serve: --target_device GPU: OpenVINO's GPU plugin cannot run here \(it needs an Intel GPU and its OpenCL driver: .+\); run on the CPU with --target_device CPU/);
  }, 120_000);

  it("with --target_device CPU appended it serves: load progress, backend, KV capacity set by --cache_size, every flag's note", async () => {
    const server = await startServer([...SEED_LINE, "--target_device", "CPU"], {}, { noModelFlag: true });
    try {
      const models = JSON.parse((await (await fetch(`${server.baseUrl}/v3/models`)).text())) as { data: { id: string }[] };
      const r = await chat(server.baseUrl, { model: models.data[0]!.id, messages: [{ role: "user", content: "Hello" }], max_tokens: 4 });
      expect(r.status).toBe(200);
      const events = server.logs.flatMap((l) => {
        try {
          return [JSON.parse(l) as Record<string, unknown>];
        } catch {
          return [];
        }
      });
      // Load progress: logged at most once per 10%, rising, ending at 100%.
      const progress = events.filter((e) => e["event"] === "engine_loading").map((e) => Math.floor((e["progress"] as number) * 10));
      expect(progress.length).toBeGreaterThan(0);
      expect(progress.length).toBeLessThanOrEqual(11);
      for (let i = 1; i < progress.length; i++) expect(progress[i]).toBeGreaterThan(progress[i - 1]!);
      expect(progress.at(-1)).toBe(10);
      const ready = events.find((e) => e["event"] === "engine_ready")!;
      expect(ready["backend"]).toBe("cpu");
      expect(ready["msg"]).toMatch(/^engine ready in \d+\.\d s; backend cpu; KV capacity \d+ tokens per sequence x 16 sequences \(\d+\.\d MB q8_0\)$/);
      // --cache_size 4 decides the capacity: beyond the 4096-token default, as the model's context allows.
      const capacity = events.find((e) => e["event"] === "capacity")!;
      const limits = ready["limits"] as { maxModelLen: number };
      expect(capacity["tokensPerSequence"]).toBe(limits.maxModelLen);
      expect(limits.maxModelLen).toBeGreaterThan(4096);
      expect(capacity["kvBytes"]).toBe(ready["kvBytes"]);
      const flagNotes = events.filter((e) => e["event"] === "flag").map((e) => e["msg"] as string);
      expect(flagNotes.some((m) => m.startsWith("--plugin_config ENABLE_CPU_PINNING false"))).toBe(true);
      expect(flagNotes.some((m) => m.startsWith("--cache_interval_multiplier 64 is a no-op"))).toBe(true);
      // The start summary confirms the parsers and guidance, and says the u8 KV cache turned flash attention on.
      expect(events.find((e) => e["event"] === "agents")).toMatchObject({ toolParser: "qwen3coder", reasoningParser: "qwen3", toolGuidedGeneration: true });
      expect(events.find((e) => e["event"] === "implied")).toMatchObject({ setting: "flash_attention", value: true, because: "kv_cache_precision u8" });
      // llama.cpp's warnings while loading (e.g. "control-looking token") are debug, not warnings.
      const readyAt = events.indexOf(ready);
      expect(events.slice(0, readyAt).filter((e) => e["level"] === 40 && (e["engine"] as { source?: string } | undefined)?.source === "llama.cpp")).toEqual([]);
    } finally {
      await server.stop();
    }
  }, 120_000);
});

describe("the seed's command line on the OpenVINO engine with the hybrid IR", () => {
  it("with --target_device CPU --engine openvino --model_path <hybrid IR> it serves, every flag applied and said", async () => {
    const ir = await hybridModel();
    const line = SEED_LINE;
    const server = await startServer([...line, "--target_device", "CPU", "--model_path", ir], {}, { engine: "openvino" });
    try {
      const models = JSON.parse((await (await fetch(`${server.baseUrl}/v3/models`)).text())) as { data: { id: string }[] };
      const r = await chat(server.baseUrl, { model: models.data[0]!.id, messages: [{ role: "user", content: "Hello" }], max_tokens: 4 });
      expect(r.status).toBe(200);
      const events = server.logs.flatMap((l) => {
        try {
          return [JSON.parse(l) as Record<string, unknown>];
        } catch {
          return [];
        }
      });
      const engineLines = events.map((e) => e["engine"] as { event?: string; msg?: string; laBlocks?: number; cacheIntervalMultiplier?: number } | undefined).filter((e) => e !== undefined);
      const flagNotes = events.filter((e) => e["event"] === "flag").map((e) => e["msg"] as string);
      // --cache_interval_multiplier reaches OpenVINO's SchedulerConfig; the linear-attention pool is set and logged.
      expect(flagNotes.some((m) => m.startsWith("--cache_interval_multiplier 64: applied"))).toBe(true);
      const hybrid = engineLines.find((e) => e.event === "hybrid_model" && e.laBlocks !== undefined)!;
      expect(hybrid.cacheIntervalMultiplier).toBe(64);
      expect(hybrid.laBlocks).toBe(16); // prefix caching off (below): one fixed block per sequence, --max_num_seqs 16
      // --enable_prefix_caching true with multiplier 64 on a hybrid: off, said why (an upstream cross-prompt state leak).
      expect(engineLines.some((e) => e.event === "hybrid_model" && /prefix caching is off .*--cache_interval_multiplier 64/.test(e.msg ?? ""))).toBe(true);
      expect(engineLines.some((e) => e.event === "rope_positions")).toBe(true);
      expect(flagNotes).toContain("--plugin_config: every key is passed to OpenVINO as given (ENABLE_CPU_PINNING)");
      // --cache_size 4 sizes the shared pool (u8 KV of the one full-attention layer: 64 bytes a token).
      const ready = events.find((e) => e["event"] === "engine_ready")!;
      expect(ready["backend"]).toBe("cpu");
      expect((ready["limits"] as { kvPoolTokens: number }).kvPoolTokens).toBe(Math.floor(4e9 / 64 / 32) * 32);
    } finally {
      await server.stop();
    }
  }, 300_000);
});

describe("--log_path and --log_format text", () => {
  it("write readable lines to the file (load progress, engine ready, a request), nothing to stdout", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-logpath-"));
    const file = path.join(dir, "keel.log");
    const proc = spawn(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), "serve", "--model_path", "keel-tiny", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", "--log_path", file, "--log_format", "text"], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    proc.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    const exited = new Promise<number | null>((r) => proc.once("exit", (c) => r(c)));
    try {
      // The log file is the only place the port and readiness appear: read it as it grows.
      let text = "";
      for (let i = 0; i < 600 && !/ engine ready /.test(text); i++) {
        await new Promise((r) => setTimeout(r, 50));
        text = fs.existsSync(file) ? fs.readFileSync(file, "utf8") : "";
      }
      const port = Number(/"port":(\d+)/.exec(text)?.[1]);
      const r = await chat(`http://127.0.0.1:${port}`, { model: "keel-tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
      expect(r.status).toBe(200);
      proc.kill("SIGTERM");
      expect(await exited).toBe(0);
      const lines = fs.readFileSync(file, "utf8").trim().split("\n");
      for (const l of lines) expect(l).toMatch(/^\d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO |WARN |ERROR) (gateway|engine) /);
      // The engine's own lines, relayed by the gateway, read as the engine's (no `engine={…}` JSON in a text line).
      expect(lines.some((l) => / INFO  engine model loaded; creating its context .* event=creating_context/.test(l))).toBe(true);
      expect(lines.filter((l) => l.includes("engine={"))).toEqual([]);
      expect(lines.some((l) => / INFO  gateway loading the model: 100% /.test(l))).toBe(true);
      expect(lines.some((l) => / INFO  gateway engine ready in \d+\.\d s; backend cpu; KV capacity /.test(l))).toBe(true);
      // The request's one INFO line (its lifecycle events are DEBUG): its route, usage, TTFT and finish reason.
      const requestLines = lines.filter((l) => / requestId=/.test(l) && !/ DEBUG /.test(l));
      expect(requestLines).toEqual([expect.stringMatching(/ INFO  gateway request finished \(length\) requestId=chatcmpl-\S+ event=request_done model=keel-tiny route=\/v3\/chat\/completions promptTokens=\d+ completionTokens=2 ttftMs=\d+ e2eMs=\d+ tokPerS=(null|[\d.]+) finishReason=length clientGone=false$/)]);
      expect(stdout).toBe("");
    } finally {
      proc.kill("SIGKILL");
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }, 90_000);
});

describe("--target_device AUTO", () => {
  it("takes a GPU backend only if one loads, and logs the backend actually used", async () => {
    const server = await startServer(["--target_device", "AUTO"]);
    try {
      const device = server.jsonLines().map((l) => JSON.parse(l) as Record<string, unknown>).find((e) => e["event"] === "device")!;
      expect(device["targetDevice"]).toBe("auto");
      const backend = device["backend"] as { gpu: string | false; devices: string[] };
      // Whatever loads here is named: "cpu" without devices, or a GPU backend with its device names.
      expect(device["msg"]).toBe(`target device auto: llama.cpp runs on ${backend.gpu === false ? "cpu" : `${backend.gpu} (${backend.devices.join(", ")})`}`);
      expect(backend.gpu === false ? backend.devices.length === 0 : backend.devices.length > 0).toBe(true);
    } finally {
      await server.stop();
    }
  }, 60_000);
});

describe("--dynamic_split_fuse false", () => {
  it("a prompt longer than --max_num_batched_tokens is a 400 (as OVMS); a shorter one is served", async () => {
    const server = await startServer(["--dynamic_split_fuse", "false", "--max_num_batched_tokens", "16"]);
    try {
      const long = await chat(server.baseUrl, { model: "keel-tiny", messages: [{ role: "user", content: "one two three four five six seven eight nine ten eleven twelve" }], max_tokens: 2 });
      expect(long.status).toBe(400);
      expect(JSON.stringify(long.body)).toMatch(/Input length exceeds pipeline capabilities: \d+ > 16/);
      const short = await chat(server.baseUrl, { model: "keel-tiny", prompt: "hi", max_tokens: 2 }, {}, "/v3/completions");
      expect(short.status).toBe(200);
    } finally {
      await server.stop();
    }
  }, 60_000);
});

describe("--deterministic", () => {
  it("turns prefix reuse off (no cache hits on a repeated prompt), says so at start, and repeats the same text", async () => {
    const server = await startServer(["--deterministic", "true"]);
    try {
      const body = { model: "keel-tiny", messages: [{ role: "user", content: "the same request twice, please" }], temperature: 0.8, seed: 7, max_tokens: 24, stream: true };
      const first = await chat(server.baseUrl, body);
      const second = await chat(server.baseUrl, body);
      expect(first.done && second.done).toBe(true);
      expect(second.text).toBe(first.text);
      expect((await metrics(server.baseUrl)).get("keel_prefix_cache_hit_tokens_total")).toBe(0);
      const started = server.jsonLines().map((l) => JSON.parse(l) as { event?: string; prefixCaching?: boolean }).filter((l) => l.event === "deterministic");
      expect(started).toEqual([expect.objectContaining({ event: "deterministic", prefixCaching: false })]);
    } finally {
      await server.stop();
    }
  });
});


describe("KEEL_ENGINE_COMMAND", () => {
  it("starts the engine (and the model check) through the configured command, arguments and environment", async () => {
    const command = { command: process.execPath, args: ["--max-old-space-size=1536", "dist/engine/main.js"], env: { KEEL_ENGINE_MARK: "custom-command" } };
    const server = await startServer([], { KEEL_ENGINE_COMMAND: JSON.stringify(command) });
    try {
      const pid = server.enginePid();
      const argv = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
      expect(argv.slice(1, 3)).toEqual(["--max-old-space-size=1536", "dist/engine/main.js"]);
      const config = JSON.parse(argv[3]!) as { mode: string; maxNumSeqs: number; device: string };
      expect([config.mode, config.maxNumSeqs, config.device]).toEqual(["serve", 8, "cpu"]);
      expect(fs.readFileSync(`/proc/${pid}/environ`, "utf8").split("\0")).toContain("KEEL_ENGINE_MARK=custom-command");
      const r = await chat(server.baseUrl, { model: "keel-tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
      expect(r.status).toBe(200);
    } finally {
      await server.stop();
    }
  });

  it("a KEEL_ENGINE_COMMAND that is not an engine command is refused with exit 2", () => {
    const r = spawnSync(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), "serve", "--model_path", "keel-tiny", "--rest_port", "0"], { cwd: ROOT, encoding: "utf8", timeout: 60_000, env: { ...process.env, KEEL_ENGINE_COMMAND: '{"command":42}' } });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain("KEEL_ENGINE_COMMAND must be JSON like");
  });
});
