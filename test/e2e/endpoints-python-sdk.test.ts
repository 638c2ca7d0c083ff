/**
 * The issue-#8 endpoints with the official OpenAI Python SDK (test/e2e/python/sdk_endpoints.py, run from
 * `.venv-test`): completions.create unary and streamed, integer logprobs, responses.create unary and streamed,
 * previous_response_id refused, n = 2 seeded, chat logprobs. The script observes; this file asserts.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT, startServer, type ServerHandle } from "../support/server.js";

const PYTHON = path.join(ROOT, ".venv-test", "bin", "python3");
const SCRIPT = path.join(ROOT, "test", "e2e", "python", "sdk_endpoints.py");

interface Report {
  completions: { object: string; text: string; finish_reason: string; completion_tokens: number; stream_text: string; stream_objects: string[] };
  completions_logprobs: { text: string; tokens: string[] | null; token_logprobs: number[] | null; top_sizes: number[] | null };
  responses: { object: string; status: string; output_text: string; output_tokens: number; event_types: string[]; sequence_numbers: number[]; stream_text: string };
  previous_response_id: { status: number; param: string } | null;
  n2: { indexes: number[]; texts: string[]; again: string[]; completion_tokens: number };
  chat_logprobs: { text: string; entries: { token: string; logprob: number; bytes: number[]; top: number }[] | null };
}

let server: ServerHandle;
let report: Report;

function runScript(baseUrl: string): Promise<Report> {
  if (!fs.existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run \`node scripts/prepare.mjs\``);
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
      if (code !== 0) return reject(new Error(`sdk_endpoints.py failed (${code ?? signal}):\n${stderr}\n${stdout}`));
      try {
        resolve(JSON.parse(stdout.trim().split("\n").at(-1) ?? "") as Report);
      } catch (err) {
        reject(new Error(`sdk_endpoints.py printed no JSON report (${(err as Error).message}):\n${stdout}\n${stderr}`));
      }
    });
  });
}

beforeAll(async () => {
  server = await startServer(["--max_num_seqs", "4", "--max_num_batched_tokens", "64"]);
  report = await runScript(server.baseUrl);
}, 90_000);
afterAll(async () => {
  await server?.stop();
});

describe("openai-python SDK: issue #8 endpoints", () => {
  it("completions.create: text_completion objects; streamed text equals unary text", () => {
    const c = report.completions;
    expect(c.object).toBe("text_completion");
    expect(c.stream_objects).toEqual(["text_completion"]);
    expect(c.finish_reason).toBe("length");
    expect(c.completion_tokens).toBe(10);
    expect(c.text.length).toBeGreaterThan(0);
    expect(c.stream_text).toBe(c.text);
  });

  it("completions.create with logprobs=2: one entry per token, tokens spell the text", () => {
    const l = report.completions_logprobs;
    expect(l.tokens).toHaveLength(6);
    expect(l.tokens!.join("")).toBe(l.text);
    expect(l.token_logprobs!.every((x) => x <= 0)).toBe(true);
    expect(l.top_sizes!.every((n) => n >= 1 && n <= 2)).toBe(true);
  });

  it("responses.create: unary text equals the streamed deltas; typed events with consecutive sequence numbers", () => {
    const r = report.responses;
    expect(r.object).toBe("response");
    expect(r.output_tokens).toBeLessThanOrEqual(10);
    expect(r.status).toBe(r.output_tokens === 10 ? "incomplete" : "completed");
    expect(r.stream_text).toBe(r.output_text);
    expect(r.sequence_numbers).toEqual(r.event_types.map((_, i) => i));
    expect(r.event_types.slice(0, 4)).toEqual(["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]);
    expect(r.event_types.at(-1)).toBe(r.status === "completed" ? "response.completed" : "response.incomplete");
    expect(report.previous_response_id).toEqual({ status: 400, param: "previous_response_id" });
  });

  it("n=2: two indexed choices, the same seed gives the same choices, usage sums both", () => {
    expect(report.n2.indexes).toEqual([0, 1]);
    expect(report.n2.again).toEqual(report.n2.texts);
    expect(report.n2.completion_tokens).toBe(12);
  });

  it("chat logprobs: one entry per token; bytes spell the content", () => {
    const l = report.chat_logprobs;
    expect(l.entries).toHaveLength(6);
    expect(Buffer.from(l.entries!.flatMap((e) => e.bytes)).toString("utf8")).toBe(l.text);
    expect(l.entries!.every((e) => e.top >= 1 && e.top <= 2 && e.logprob <= 0)).toBe(true);
  });
});
