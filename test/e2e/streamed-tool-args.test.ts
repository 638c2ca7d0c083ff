/**
 * Streamed tool-call arguments (issue #20, item 1) through the official SDKs — the Node `openai` package in this
 * process and the Python `openai` package (.venv-test, test/e2e/python/tool_args_check.py): a call with a long
 * string argument streams its `function.arguments` in more than one fragment, the first chunk of the call carries
 * its id and name, and the fragments concatenate to the unary answer's `arguments` exactly. On the real model
 * (Qwen2.5-Coder-0.5B, hermes3, `--deterministic true` so that two runs compute the same logits) and on the tiny
 * random-weight models with a forced (guided) call on both engines, where the text is gibberish and the unary and
 * streamed answers of the same greedy request are compared.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { realModelPath } from "../support/real-models.js";
import { ENGINES_UNDER_TEST, ROOT, startServer, type ServerHandle } from "../support/server.js";

const PYTHON = path.join(ROOT, ".venv-test", "bin", "python3");
const SCRIPT = path.join(ROOT, "test", "e2e", "python", "tool_args_check.py");

/** What one SDK saw: the unary call 0, and the stream's fragments of call 0. */
interface Observed {
  unary: { finish_reason: string; name: string | null; arguments: string | null };
  stream: { finish_reason: string | null; name: string; fragments: string[]; ids: number };
}

/** A chat request body as both SDKs take it (`extra_body` for Keel's extensions). */
type Request = Record<string, unknown> & { extra_body?: Record<string, unknown> };

/** The Node SDK: unary, then the same request streamed. */
async function viaNode(baseUrl: string, request: Request): Promise<Observed> {
  const sdk = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: "keel-test", maxRetries: 0, timeout: 240_000 });
  const { extra_body: extra, ...body } = request;
  const params = { ...body, ...(extra ?? {}) } as never;
  const unary = await sdk.chat.completions.create(params);
  const c = unary.choices[0]!;
  const call = c.message.tool_calls?.[0] as { function: { name: string; arguments: string } } | undefined;
  const stream = await sdk.chat.completions.create({ ...(params as object), stream: true } as never);
  const seen: Observed["stream"] = { finish_reason: null, name: "", fragments: [], ids: 0 };
  for await (const chunk of stream as unknown as AsyncIterable<OpenAI.Chat.Completions.ChatCompletionChunk>) {
    const ch = chunk.choices[0];
    for (const t of ch?.delta.tool_calls ?? []) {
      if (t.index !== 0) continue;
      if (t.id) seen.ids++;
      seen.name += t.function?.name ?? "";
      if (t.function?.arguments) seen.fragments.push(t.function.arguments);
    }
    if (ch?.finish_reason) seen.finish_reason = ch.finish_reason;
  }
  return { unary: { finish_reason: c.finish_reason, name: call?.function.name ?? null, arguments: call?.function.arguments ?? null }, stream: seen };
}

/** The Python SDK, through the script. */
function viaPython(baseUrl: string, request: Request): Promise<Observed> {
  if (!fs.existsSync(PYTHON)) throw new Error(`${PYTHON} is missing: run \`node scripts/prepare.mjs\``);
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, [SCRIPT, baseUrl, JSON.stringify(request)], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, PYTHONUNBUFFERED: "1" } });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    child.on("error", reject);
    child.on("exit", (code, signal) => {
      if (code !== 0) return reject(new Error(`tool_args_check.py failed (${code ?? signal}):\n${stderr}\n${stdout}`));
      try {
        resolve(JSON.parse(stdout.trim().split("\n").at(-1) ?? "") as Observed);
      } catch (err) {
        reject(new Error(`tool_args_check.py printed no JSON (${(err as Error).message}):\n${stdout}\n${stderr}`));
      }
    });
  });
}

/** A call to `tool` whose stream showed its header once and `minFragments`+ argument fragments equal to unary. */
function expectStreamedArgs(o: Observed, tool: string, minFragments: number): void {
  const label = JSON.stringify(o);
  expect(o.unary.name, label).toBe(tool);
  expect(o.stream.name, label).toBe(tool);
  expect(o.stream.ids, label).toBe(1);
  expect(o.stream.fragments.length, label).toBeGreaterThanOrEqual(minFragments);
  expect(o.stream.fragments.join(""), label).toBe(o.unary.arguments);
  expect(o.stream.finish_reason, label).toBe(o.unary.finish_reason);
  const args: unknown = JSON.parse(o.unary.arguments!);
  expect(typeof args === "object" && args !== null && !Array.isArray(args), label).toBe(true);
}

const SDKS = [
  ["Node SDK", viaNode],
  ["Python SDK", viaPython],
] as const;

describe("real model (Qwen2.5-Coder-0.5B, --tool_parser hermes3): a long argument streams in fragments", () => {
  let server: ServerHandle;
  beforeAll(async () => {
    const file = realModelPath("qwen2.5-coder-0.5b-instruct");
    server = await startServer(["--model_path", file, "--model_name", "qwen-coder", "--tool_parser", "hermes3", "--enable_tool_guided_generation", "true", "--deterministic", "true", "--max_num_seqs", "2", "--max_model_len", "2048"]);
  }, 180_000);
  afterAll(async () => {
    await server?.stop();
  });

  const writeFile = {
    type: "function",
    function: {
      name: "write_file",
      description: "Write a text file",
      parameters: { type: "object", properties: { path: { type: "string" }, content: { type: "string" } }, required: ["path", "content"], additionalProperties: false },
    },
  };
  const request: Request = {
    model: "qwen-coder",
    messages: [{ role: "user", content: "Write hello.py: a Python script that prints the numbers 1 to 10, one per line, each with a comment." }],
    tools: [writeFile],
    tool_choice: { type: "function", function: { name: "write_file" } },
    temperature: 0,
    // Why this short: ~25 tok/s on an idle machine; a cut call (finish_reason length) must agree just the same.
    max_tokens: 80,
  };

  it.each(SDKS)("%s: more than one arguments fragment, the concatenation equals the unary arguments", async (_sdk, via) => {
    const o = await via(server.baseUrl, request);
    expectStreamedArgs(o, "write_file", 5);
    expect((JSON.parse(o.unary.arguments!) as { content?: string }).content?.length ?? 0).toBeGreaterThan(20);
  }, 240_000);
});

describe.each(ENGINES_UNDER_TEST)("tiny models, forced call (guided), on the %s engine", (engine) => {
  let hermes: ServerHandle;
  let coder: ServerHandle;
  beforeAll(async () => {
    [hermes, coder] = await Promise.all([
      startServer(["--model_path", "keel-tiny-qwen3", "--tool_parser", "hermes3", "--enable_tool_guided_generation", "true", "--max_num_seqs", "2", "--max_num_batched_tokens", "64"], {}, { engine }),
      startServer(["--model_path", "keel-tiny-qwen3coder", "--tool_parser", "qwen3coder", "--enable_tool_guided_generation", "true", "--max_num_seqs", "2", "--max_num_batched_tokens", "64"], {}, { engine }),
    ]);
  }, 240_000);
  afterAll(async () => {
    await Promise.all([hermes?.stop(), coder?.stop()]);
  });

  // Bounded below and above: random weights must write a long string, and must stop.
  const note = {
    type: "function",
    function: { name: "save_note", parameters: { type: "object", properties: { text: { type: "string", minLength: 24, maxLength: 48 } }, required: ["text"], additionalProperties: false } },
  };
  const request = (model: string): Request => ({
    model,
    messages: [{ role: "user", content: "Save a note." }],
    tools: [note],
    tool_choice: { type: "function", function: { name: "save_note" } },
    temperature: 0,
    max_tokens: 150,
    extra_body: { chat_template_kwargs: { enable_thinking: false } },
  });

  for (const [format, model, server] of [
    ["hermes3", "keel-tiny-qwen3", () => hermes],
    ["qwen3coder", "keel-tiny-qwen3coder", () => coder],
  ] as const) {
    it.each(SDKS)(`${format}, %s: the greedy stream's fragments concatenate to the unary arguments`, async (_sdk, via) => {
      const o = await via(server().baseUrl, request(model));
      expectStreamedArgs(o, "save_note", 2);
      expect(o.unary.finish_reason).toBe("tool_calls");
    }, 120_000);
  }
});
