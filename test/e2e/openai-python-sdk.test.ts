/**
 * The official OpenAI Python SDK against the real server. test/e2e/python/sdk_check.py drives the server with the
 * `openai` package from the `.venv-test` virtual environment (created by scripts/prepare.mjs) and prints what it
 * saw as JSON; this file asserts on it and on the server's metrics around it.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { get, ROOT, startServer, waitForMetrics, type ServerHandle } from "../support/server.js";

const PYTHON = path.join(ROOT, ".venv-test", "bin", "python3");
const SCRIPT = path.join(ROOT, "test", "e2e", "python", "sdk_check.py");

let server: ServerHandle;

beforeAll(async () => {
  server = await startServer(["--max_num_seqs", "4", "--max_num_batched_tokens", "64"]);
});
afterAll(async () => {
  await server?.stop();
});

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}
interface SdkError {
  class: string | null;
  is_bad_request?: boolean;
  is_not_found?: boolean;
  status?: number;
  code?: string | null;
  param?: string | null;
  type?: string | null;
  message?: string;
}
interface RouteResult {
  unary: { id: string; object: string; text: string; role: string; finish_reason: string; usage: Usage };
  stream: {
    chunks: number;
    distinct_ids: number;
    first_role: string | null;
    text: string;
    finish_reasons: string[];
    last_choices: number;
    last_usage: Usage | null;
    usage_before_last: Usage[];
  };
}
interface Report {
  sdk_version: string;
  "/v3": RouteResult;
  "/v1": RouteResult;
  bad_temperature: SdkError;
  bad_temperature_stream: SdkError;
  unknown_model: SdkError;
  closed_stream: { content_chunks: number; finish_reason: string | null };
  after_close: { ready_status: number; finish_reason: string; completion_tokens: number };
}

/** Run the script against `baseUrl`; resolves with its JSON report, rejects with its stderr when it fails. */
function runScript(baseUrl: string): Promise<Report> {
  if (!fs.existsSync(PYTHON)) {
    throw new Error(`${PYTHON} is missing: run \`node scripts/prepare.mjs\` (it creates .venv-test with the openai package)`);
  }
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, [SCRIPT, baseUrl], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, PYTHONUNBUFFERED: "1" } });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), 50_000);
    child.on("error", reject);
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      if (code !== 0) return reject(new Error(`sdk_check.py failed (${code ?? signal}):\n${stderr}\n${stdout}`));
      try {
        resolve(JSON.parse(stdout.trim().split("\n").at(-1) ?? "") as Report);
      } catch (err) {
        reject(new Error(`sdk_check.py printed no JSON report (${(err as Error).message}):\n${stdout}\n${stderr}`));
      }
    });
  });
}

const gauges = ["keel_requests_running", "keel_requests_waiting", "keel_engine_sequences_active"];
const gaugesAtZero = (m: Map<string, number>): boolean => gauges.every((g) => m.get(g) === 0);
const metric = (m: Map<string, number>, k: string): number => m.get(k) ?? NaN;

describe("openai-python SDK against the real server", () => {
  let report: Report;
  let before: Map<string, number>;
  let after: Map<string, number>;

  beforeAll(async () => {
    before = await waitForMetrics(server.baseUrl, gaugesAtZero);
    report = await runScript(server.baseUrl);
    after = await waitForMetrics(server.baseUrl, gaugesAtZero);
  }, 90_000);

  it("runs the SDK version pinned in test/e2e/python/requirements.txt", () => {
    const pin = /^openai==(\S+)$/m.exec(fs.readFileSync(path.join(ROOT, "test", "e2e", "python", "requirements.txt"), "utf8"))?.[1];
    expect(pin).toBeDefined();
    expect(report.sdk_version).toBe(pin);
  });

  for (const prefix of ["/v3", "/v1"] as const) {
    it(`${prefix}: unary and streamed greedy text are equal; include_usage puts the unary usage in the last chunk only`, () => {
      const { unary, stream } = report[prefix];
      expect(unary.object).toBe("chat.completion");
      expect(unary.id).toMatch(/^chatcmpl-/);
      expect(unary.role).toBe("assistant");
      expect(unary.finish_reason).toBe("length");
      expect(unary.usage.completion_tokens).toBe(40);
      expect(unary.usage.total_tokens).toBe(unary.usage.prompt_tokens + 40);
      expect(unary.text.length).toBeGreaterThan(0);
      expect(stream.text).toBe(unary.text);
      expect(stream.first_role).toBe("assistant");
      expect(stream.distinct_ids).toBe(1);
      expect(stream.finish_reasons).toEqual(["length"]);
      expect(stream.last_choices).toBe(0);
      expect(stream.last_usage).toEqual(unary.usage);
      expect(stream.usage_before_last).toEqual([]);
    });
  }

  it("temperature 7 → openai.BadRequestError, status 400, param temperature (unary and stream)", () => {
    for (const e of [report.bad_temperature, report.bad_temperature_stream]) {
      expect(e.class).toBe("BadRequestError");
      expect(e.is_bad_request).toBe(true);
      expect(e.status).toBe(400);
      expect(e.param).toBe("temperature");
      expect(e.code).toBe("invalid_value");
      expect(e.type).toBe("invalid_request_error");
    }
  });

  it("an unknown model → openai.NotFoundError, status 404, code model_not_found", () => {
    const e = report.unknown_model;
    expect(e.class).toBe("NotFoundError");
    expect(e.is_not_found).toBe(true);
    expect(e.status).toBe(404);
    expect(e.code).toBe("model_not_found");
    expect(e.param).toBe("model");
  });

  it("stream.close() mid-way: one decode-phase disconnect, one abort, gauges back to 0, the server stays ready and serves", async () => {
    expect(report.closed_stream.content_chunks).toBe(5);
    expect(report.closed_stream.finish_reason).toBeNull();
    for (const phase of ["queued", "prefill"]) {
      expect(metric(after, `keel_client_disconnects_total{phase="${phase}"}`)).toBe(metric(before, `keel_client_disconnects_total{phase="${phase}"}`));
    }
    expect(metric(after, 'keel_client_disconnects_total{phase="decode"}')).toBe(metric(before, 'keel_client_disconnects_total{phase="decode"}') + 1);
    expect(metric(after, 'keel_requests_finished_total{finish_reason="abort"}')).toBe(metric(before, 'keel_requests_finished_total{finish_reason="abort"}') + 1);
    // 2 unary + 2 streams on two routes, and the request after the close: all ran to their length.
    expect(metric(after, 'keel_requests_finished_total{finish_reason="length"}')).toBe(metric(before, 'keel_requests_finished_total{finish_reason="length"}') + 5);
    expect(report.after_close).toEqual({ ready_status: 200, finish_reason: "length", completion_tokens: 4 });
    expect((await get(server.baseUrl, "/v2/health/ready")).status).toBe(200);
  });
});
