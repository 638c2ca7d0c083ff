/**
 * The `keel` command line: help, refusal of unknown flags and bad values, and startup validation of a model that
 * makes llama.cpp abort (GGML_ASSERT) — caught in a throwaway child with a clear message and exit code 1.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { buildTinyModel } from "../../src/model/tiny-model.js";
import { ROOT } from "../support/server.js";

const keel = (...args: string[]) =>
  spawnSync(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), ...args], { cwd: ROOT, encoding: "utf8", timeout: 60_000 });

describe("keel serve flags", () => {
  it("--help lists every flag with its default", () => {
    const r = keel("serve", "--help");
    expect(r.status).toBe(0);
    for (const f of ["--rest_port", "--rest_bind_address", "--model_path", "--model_name", "--max_num_seqs", "--max_num_batched_tokens", "--max_model_len", "--log_level", "--engine_threads"]) {
      expect(r.stdout).toContain(f);
    }
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
    const r = keel("serve", "--max_model_len", "1048576", "--rest_port", "0", "--rest_bind_address", "127.0.0.1");
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/exceeds the model's trained context of 2048 tokens/);
  });

  it("a port already in use exits 1 with a clear message", async () => {
    const net = await import("node:net");
    const blocker = net.createServer();
    await new Promise<void>((r) => blocker.listen(0, "127.0.0.1", () => r()));
    const port = (blocker.address() as { port: number }).port;
    const r = keel("serve", "--rest_port", String(port), "--rest_bind_address", "127.0.0.1");
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
    expect(r.stderr).toContain("cannot be loaded");
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
