/**
 * Test support: start a real `keel serve` process on an ephemeral loopback port and talk to it over HTTP.
 */
import { spawn, type ChildProcess } from "node:child_process";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { ensureOpenvinoVenv } from "../../src/engine-openvino/venv.js";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const BIN = path.join(ROOT, "bin", "keel.mjs");

/** A running server process. */
export interface ServerHandle {
  proc: ChildProcess;
  port: number;
  baseUrl: string;
  /** Every stdout/stderr line the server wrote. */
  logs: string[];
  /** The lines of its JSON log (without the plain `keel serve:` start-up lines it writes to stderr before the log starts). */
  jsonLines(): string[];
  /** PID of the current engine process (from the latest engine_ready log line). */
  enginePid(): number;
  /**
   * The first log line (already written or still to come) that `match` accepts; rejects when the server exits or
   * `timeoutMs` passes first. Driven by the server's output, never by polling.
   */
  waitForLog(match: (line: string) => boolean, timeoutMs?: number): Promise<string>;
  stop(): Promise<void>;
}

/** The engines an e2e suite runs on: `describe.each(ENGINES_UNDER_TEST)` and pass the engine to {@link startServer}. */
export const ENGINES_UNDER_TEST = ["llama.cpp", "openvino"] as const;
/** One engine under test. */
export type EngineUnderTest = (typeof ENGINES_UNDER_TEST)[number];

/**
 * The generated tiny model each engine serves by default: `keel-tiny` on llama.cpp; on OpenVINO its F16 twin
 * `keel-tiny-f16` (OpenVINO GenAI cannot load F32 matrices; the F16 variant loads in both engines).
 */
export const TINY_MODEL_FOR: Record<EngineUnderTest, string> = { "llama.cpp": "keel-tiny", openvino: "keel-tiny-f16" };

/** Server processes still running; killed if the test process exits without stopping them (e.g. a crash). */
const running = new Set<ChildProcess>();
process.on("exit", () => {
  for (const p of running) {
    try {
      process.kill(-p.pid!, "SIGKILL"); // its process group; its engine then exits when its channel closes
    } catch {
      /* already gone */
    }
  }
});

/**
 * Start `keel serve` with extra flags; resolves once it listens and its engine is ready. The served model is the
 * generated `keel-tiny` (deterministic, fast; `keel-tiny-f16` on OpenVINO) unless `flags` name another
 * `--model_path`, or `options.noModelFlag` leaves the flag out so that the server picks its own default (a real model).
 * `options.engine` (default llama.cpp) serves with `--engine <engine>`; for openvino the venv is built (or found)
 * here first and handed to the server as KEEL_OPENVINO_PYTHON, so the server's start is not a venv build.
 */
export async function startServer(flags: string[] = [], env: Record<string, string> = {}, options: { noModelFlag?: boolean; engine?: EngineUnderTest } = {}): Promise<ServerHandle> {
  const engine = options.engine ?? "llama.cpp";
  const model = flags.includes("--model_path") || options.noModelFlag ? [] : ["--model_path", TINY_MODEL_FOR[engine]];
  const engineFlag = engine === "openvino" && !flags.includes("--engine") ? ["--engine", "openvino"] : [];
  const engineEnv = engine === "openvino" && env["KEEL_OPENVINO_PYTHON"] === undefined ? { KEEL_OPENVINO_PYTHON: await ensureOpenvinoVenv() } : {};
  const proc = spawn(process.execPath, ["--unhandled-rejections=strict", BIN, "serve", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", ...engineFlag, ...model, ...flags], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
    // Its own process group, like a job started from a terminal (tests send Ctrl-C to the group).
    detached: true,
    env: { ...process.env, ...engineEnv, ...env },
  });
  running.add(proc);
  proc.once("exit", () => running.delete(proc));
  const logs: string[] = [];
  /** Waiters of waitForLog, each offered every new line. */
  const watchers = new Set<(line: string) => void>();
  let port = 0;
  const ready = new Promise<void>((resolve, reject) => {
    let engineReady = false;
    const onLine = (line: string): void => {
      logs.push(line);
      for (const w of watchers) w(line);
      try {
        const j = JSON.parse(line) as { event?: string; address?: { port?: number } };
        if (j.event === "listening" && j.address?.port) port = j.address.port;
        if (j.event === "engine_ready") engineReady = true;
      } catch {
        /* not JSON */
      }
      if (port && engineReady) resolve();
    };
    for (const s of [proc.stdout!, proc.stderr!]) {
      let buf = "";
      s.setEncoding("utf8");
      s.on("data", (d: string) => {
        buf += d;
        let i: number;
        while ((i = buf.indexOf("\n")) >= 0) {
          onLine(buf.slice(0, i));
          buf = buf.slice(i + 1);
        }
      });
    }
    proc.once("exit", (code, sig) => reject(new Error(`server exited before ready (${code ?? sig}): ${logs.slice(-5).join("\n")}`)));
  });
  await ready;
  const handle: ServerHandle = {
    proc,
    port,
    baseUrl: `http://127.0.0.1:${port}`,
    logs,
    enginePid() {
      let pid = 0;
      for (const l of logs) {
        try {
          const j = JSON.parse(l) as { event?: string; enginePid?: number };
          if (j.event === "engine_ready" && j.enginePid) pid = j.enginePid;
        } catch {
          /* not JSON */
        }
      }
      return pid;
    },
    jsonLines() {
      return logs.filter((l) => l.startsWith("{"));
    },
    waitForLog(match, timeoutMs = 60_000) {
      const seen = logs.find(match);
      if (seen !== undefined) return Promise.resolve(seen);
      return new Promise<string>((resolve, reject) => {
        const done = (): void => {
          watchers.delete(watch);
          clearTimeout(timer);
          proc.off("exit", onExit);
        };
        const watch = (line: string): void => {
          if (!match(line)) return;
          done();
          resolve(line);
        };
        const onExit = (): void => {
          done();
          reject(new Error(`server exited before the awaited log line; last lines:\n${logs.slice(-5).join("\n")}`));
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`no such log line within ${timeoutMs} ms; last lines:\n${logs.slice(-5).join("\n")}`));
        }, timeoutMs);
        watchers.add(watch);
        proc.once("exit", onExit);
      });
    },
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      // "close": the process exited and its stdout/stderr were read to the end (every log line is in `logs`).
      const exited = new Promise<void>((r) => proc.once("close", () => r()));
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(t);
    },
  };
  return handle;
}

/** Plain HTTP GET; resolves with status and body text. */
export function get(baseUrl: string, p: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    http
      .get(baseUrl + p, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (d: string) => (body += d));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      })
      .on("error", reject);
  });
}

/** Parse Prometheus text into a map "name{labels}" → value. */
export async function metrics(baseUrl: string): Promise<Map<string, number>> {
  const { body } = await get(baseUrl, "/metrics");
  const m = new Map<string, number>();
  for (const line of body.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const sp = line.lastIndexOf(" ");
    m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
  }
  return m;
}

/**
 * Poll a condition on the server's metrics until it holds, at most `attempts` times, `intervalMs` apart.
 * Used only to observe a state the server reaches by itself (e.g. counts back to 0), never to order events.
 */
export async function waitForMetrics(baseUrl: string, pred: (m: Map<string, number>) => boolean, attempts = 200, intervalMs = 25): Promise<Map<string, number>> {
  let last = new Map<string, number>();
  for (let i = 0; i < attempts; i++) {
    last = await metrics(baseUrl);
    if (pred(last)) return last;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error(`metrics condition not reached: ${[...last].filter(([k]) => k.startsWith("keel_")).map(([k, v]) => `${k}=${v}`).join(", ")}`);
}

/** Poll readiness until it is 200 (bounded); used after an engine restart the server performs by itself. */
export async function waitForReady(baseUrl: string, attempts = 400, intervalMs = 25): Promise<void> {
  for (let i = 0; i < attempts; i++) {
    if ((await get(baseUrl, "/v2/health/ready")).status === 200) return;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
  throw new Error("server did not become ready");
}
