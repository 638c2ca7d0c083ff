/**
 * `keel serve --source_model ORG/NAME --model_repository_path DIR [--pull]` end to end against a local fake hub
 * (HF_ENDPOINT) serving the generated tiny GGUF: the pull survives a connection dropped mid-file, and the pulled
 * model is then served (found in the repository, without the hub) under its ORG/NAME. Also a model directory as
 * `--model_path`: served, and an OpenVINO IR directory refused clearly by the llama.cpp engine.
 */
import { spawn } from "node:child_process";
import { readFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync, copyFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureTinyModel } from "../../src/model/default-model.js";
import { type FakeHub, sha256, startFakeHub } from "../support/fake-hub.js";
import { ROOT, startServer } from "../support/server.js";

const tmp = mkdtempSync(path.join(os.tmpdir(), "keel-hub-e2e-"));
let hub: FakeHub;
let tiny: Buffer;

beforeAll(async () => {
  tiny = readFileSync(await ensureTinyModel("keel-tiny"));
  hub = await startFakeHub({ "org/tiny": { "keel-tiny.gguf": { data: tiny }, "README.md": { data: Buffer.from("# tiny"), lfs: false } } });
});
afterAll(async () => {
  await hub?.close();
  rmSync(tmp, { recursive: true, force: true });
});

/** Runs `keel serve ARGS` to its exit (asynchronously: the fake hub lives in this process and must keep answering). */
function keelRun(args: string[], env: Record<string, string>): Promise<{ code: number | null; stderr: string; stdout: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), "serve", ...args], { cwd: ROOT, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    child.on("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

describe("keel serve --source_model against a fake hub", () => {
  const repo = path.join(tmp, "models");
  const env = () => ({ HF_ENDPOINT: hub.endpoint, HF_TOKEN: "hf_test_token" });

  it("--pull downloads through a dropped connection, verifies, logs progress and exits 0", async () => {
    hub.dropNextFileAfter(Math.floor(tiny.length / 3));
    const r = await keelRun(["--source_model", "org/tiny", "--model_repository_path", repo, "--pull"], env());
    expect(r.stderr).toContain("keel serve: pulled org/tiny to");
    expect(r.code).toBe(0);
    const file = path.join(repo, "org", "tiny", "keel-tiny.gguf");
    expect(sha256(readFileSync(file))).toBe(sha256(tiny));
    // Not a TTY: progress as log lines, the drop and the resume logged, the checksum named.
    expect(r.stderr).toMatch(/keel serve: keel-tiny\.gguf: 0% \(0 kB of \d+\.\d MB\)/);
    expect(r.stderr).toContain("keel serve: keel-tiny.gguf: 100% (");
    expect(r.stderr).toMatch(/keel serve: download of keel-tiny\.gguf interrupted at \d+ bytes/);
    expect(r.stderr).toContain(`sha256 ${sha256(tiny)} verified`);
    const fileGets = hub.requests.filter((q) => q.url.startsWith("/cdn/"));
    expect(fileGets.length).toBe(2);
    expect(fileGets[1]!.range).toMatch(/^bytes=[1-9]\d*-$/);
    expect(hub.requests.every((q) => q.authorization === "Bearer hf_test_token")).toBe(true);
  });

  it("without --pull the pulled model is served as ORG/NAME, without contacting the hub again", async () => {
    hub.requests.length = 0;
    const server = await startServer(["--source_model", "org/tiny", "--model_repository_path", repo], env(), { noModelFlag: true });
    try {
      const models = (await (await fetch(`${server.baseUrl}/v1/models`)).json()) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id)).toEqual(["org/tiny"]);
      const res = await fetch(`${server.baseUrl}/v3/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "org/tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 3 }),
      });
      expect(res.status).toBe(200);
      const body = (await res.json()) as { model: string; usage: { completion_tokens: number } };
      expect(body.model).toBe("org/tiny");
      expect(body.usage.completion_tokens).toBeGreaterThan(0);
      expect(hub.requests).toEqual([]);
    } finally {
      await server.stop();
    }
  });

  it("a pull killed mid-file is continued from its .part by the next run", async () => {
    const killedRepo = path.join(tmp, "killed");
    hub.requests.length = 0;
    hub.stallNextFileAfter(Math.floor(tiny.length * 0.6));
    const child = spawn(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), "serve", "--source_model", "org/tiny", "--model_repository_path", killedRepo, "--pull"], {
      cwd: ROOT,
      env: { ...process.env, ...env() },
      stdio: ["ignore", "ignore", "pipe"],
    });
    // Kill it once its own progress line says half of the file is on disk (progress is reported after each write).
    const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
    let stderr = "";
    await new Promise<void>((resolve) => {
      child.on("exit", () => resolve()); // an early exit ends the wait too; the check below then fails with its output
      child.stderr.setEncoding("utf8").on("data", (d: string) => {
        stderr += d;
        if (stderr.includes("keel-tiny.gguf: 50% (")) resolve();
      });
    });
    expect(stderr).toContain("keel-tiny.gguf: 50% (");
    child.kill("SIGKILL");
    await exited;
    const r = await keelRun(["--source_model", "org/tiny", "--model_repository_path", killedRepo, "--pull"], env());
    expect(r.code).toBe(0);
    const resumedAt = Number(/resuming keel-tiny\.gguf at (\d+) bytes/.exec(r.stderr)?.[1]);
    expect(resumedAt).toBeGreaterThanOrEqual(Math.floor(tiny.length * 0.5));
    expect(hub.requests.filter((q) => q.url.startsWith("/cdn/")).map((q) => q.range)).toEqual([undefined, `bytes=${resumedAt}-`]);
    expect(sha256(readFileSync(path.join(killedRepo, "org", "tiny", "keel-tiny.gguf")))).toBe(sha256(tiny));
  });

  it("a hub error is a clear message and exit 1", async () => {
    const r = await keelRun(["--source_model", "org/missing", "--model_repository_path", repo, "--pull"], env());
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("keel serve: the hub has no model repository org/missing (HTTP 404)");
  });

  it("--pull without --source_model, and a malformed --source_model, exit 2 and say why", async () => {
    const r = await keelRun(["--pull"], env());
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("--pull downloads the model of --source_model");
    const bad = await keelRun(["--source_model", "no-slash", "--model_repository_path", repo, "--pull"], env());
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain(`--source_model must be a hub repository id ORG/NAME`);
  });
});

describe("keel serve --model_path DIRECTORY", () => {
  it("a directory holding one GGUF is served (no EISDIR)", async () => {
    const dir = path.join(tmp, "My-Dir-Model");
    mkdirSync(dir, { recursive: true });
    copyFileSync(await ensureTinyModel("keel-tiny"), path.join(dir, "model.gguf"));
    writeFileSync(path.join(dir, "README.md"), "x");
    const server = await startServer(["--model_path", dir]);
    try {
      const models = (await (await fetch(`${server.baseUrl}/v1/models`)).json()) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id)).toEqual(["My-Dir-Model"]);
    } finally {
      await server.stop();
    }
  });

  it("an OpenVINO IR directory is refused by the llama.cpp engine (exit 2, naming --engine openvino); auto gives it to OpenVINO (test/e2e/engine-choice.test.ts)", async () => {
    const dir = path.join(tmp, "ov");
    mkdirSync(dir, { recursive: true });
    writeFileSync(path.join(dir, "openvino_model.xml"), "<xml/>");
    const r = await keelRun(["--model_path", dir, "--engine", "llama.cpp"], {});
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`keel serve: --engine llama.cpp cannot serve ${dir}: it is an OpenVINO IR directory (openvino_model.xml) and llama.cpp serves GGUF files only; use --engine openvino (or auto)`);
  });
});
