/**
 * `--engine auto | llama.cpp | openvino` through the real `keel serve` process: which engine an IR directory and a
 * GGUF get, the OpenVINO-only flags reaching the engine's start configuration, and the refusals (exit 2, or the
 * llama.cpp engine's own fatal for a field it cannot honour). The OpenVINO engine is stood in for by the fake engine
 * (KEEL_ENGINE_COMMAND overrides the command, never the choice), so this runs without the Python worker.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseServeFlags } from "../../src/cli.js";
import { resolveConfigModels } from "../../src/cli/serve-config.js";
import { metrics, ROOT, startServer, type ServerHandle } from "../support/server.js";

const FAKE = { command: process.execPath, args: [path.join(ROOT, "test", "support", "fake-engine.mjs")] };
const fakeEnv = { KEEL_ENGINE_COMMAND: JSON.stringify(FAKE) };
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "keel-engine-choice-"));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** A directory that looks like an OpenVINO IR model (the fake engine does not read it). */
function irDir(name: string): string {
  const dir = path.join(tmp, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "openvino_model.xml"), "<net/>");
  fs.writeFileSync(path.join(dir, "openvino_model.bin"), "");
  return dir;
}

const keel = (args: string[], env: Record<string, string> = {}) =>
  spawnSync(process.execPath, [path.join(ROOT, "bin", "keel.mjs"), "serve", "--rest_port", "0", "--rest_bind_address", "127.0.0.1", ...args], { cwd: ROOT, encoding: "utf8", timeout: 60_000, env: { ...process.env, ...env } });

/** The start configuration the engine process got (its last argument). */
function engineConfig(server: ServerHandle): Record<string, unknown> {
  const argv = fs.readFileSync(`/proc/${server.enginePid()}/cmdline`, "utf8").split("\0").filter((a) => a !== "");
  return JSON.parse(argv.at(-1)!) as Record<string, unknown>;
}

/** The log line of `event` (JSON lines). */
function logEvent(server: ServerHandle, event: string): Record<string, unknown> | undefined {
  for (const l of server.logs) {
    try {
      const j = JSON.parse(l) as Record<string, unknown>;
      if (j["event"] === event) return j;
    } catch {
      /* not JSON */
    }
  }
  return undefined;
}

describe("--engine auto", () => {
  it("an OpenVINO IR directory goes to the OpenVINO engine (logged), served under the directory's name", async () => {
    const dir = irDir("tiny-ir");
    const server = await startServer(["--model_path", dir], fakeEnv);
    try {
      expect(logEvent(server, "engine")).toMatchObject({ engine: "openvino", why: "an OpenVINO IR directory (--engine auto)" });
      expect(engineConfig(server)).toMatchObject({ modelPath: dir, deterministic: false });
      expect(logEvent(server, "model")).toMatchObject({ name: "tiny-ir", kind: "openvino-ir", path: dir });
    } finally {
      await server.stop();
    }
  });

  it("a GGUF goes to llama.cpp, which gets none of the OpenVINO fields", async () => {
    const server = await startServer([], fakeEnv);
    try {
      expect(logEvent(server, "engine")).toMatchObject({ engine: "llama.cpp", why: "a GGUF file (--engine auto)" });
      const config = engineConfig(server);
      for (const k of ["kvBlocks", "cacheGb", "pluginConfig", "deterministic", "cacheDir"]) expect(config).not.toHaveProperty(k);
    } finally {
      await server.stop();
    }
  });
});

describe("--engine openvino", () => {
  it("serves a GGUF with --num_kv_blocks, --cache_size, the raw --plugin_config and --deterministic in the engine's configuration; max_model_len fits the pool", async () => {
    const plugin = { PERFORMANCE_HINT: "LATENCY", NUM_STREAMS: 1 };
    const server = await startServer(["--engine", "openvino", "--num_kv_blocks", "16", "--cache_size", "0.5", "--plugin_config", JSON.stringify(plugin), "--deterministic", "true"], fakeEnv);
    try {
      const config = engineConfig(server);
      expect(config).toMatchObject({ kvBlocks: 16, cacheGb: 0.5, pluginConfig: plugin, deterministic: true, prefixCaching: false });
      expect(path.basename(config["modelPath"] as string)).toMatch(/\.gguf$/);
      // 16 blocks x 32 tokens (CPU) = 512 tokens: one sequence may fill the pool less the engine's block of headroom.
      expect(config["maxModelLen"]).toBe(480);
      expect(logEvent(server, "engine")).toMatchObject({ engine: "openvino", why: "--engine openvino (OpenVINO GenAI loads the GGUF)" });
      expect(logEvent(server, "capacity")).toMatchObject({ tokensPerSequence: 480, sequences: 8, poolTokens: 512, kvBytes: null });
      // The gateway gauges divide by the shared pool the engine reports (ready.limits.kvPoolTokens), not 8 x 512.
      expect((await metrics(server.baseUrl)).get('vllm:cache_config_info{model_name="keel-tiny",block_size="1",num_gpu_blocks="512",cache_dtype="f16",enable_prefix_caching="false"}')).toBe(1);
      expect(logEvent(server, "deterministic")).toMatchObject({ prefixCaching: false });
      // Every plugin key is OpenVINO's to apply: llama.cpp's "not applied" warnings are not printed.
      expect(server.logs.some((l) => l.includes("not applied"))).toBe(false);
      expect(server.logs.some((l) => l.includes("--plugin_config: every key is passed to OpenVINO as given (PERFORMANCE_HINT, NUM_STREAMS)"))).toBe(true);
    } finally {
      await server.stop();
    }
  });

  it("an explicit --max_model_len longer than the --num_kv_blocks pool exits 2 naming both", () => {
    const r = keel(["--model_path", "keel-tiny", "--engine", "openvino", "--num_kv_blocks", "4", "--max_model_len", "1024"], fakeEnv);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain("max_model_len 1024 exceeds what one sequence may hold in the KV pool of 128 tokens (--num_kv_blocks 4 x 32 tokens) less one block of headroom: 96");
  });
});

describe("refusals", () => {
  it("an IR directory with --engine llama.cpp exits 2 with a clear message", () => {
    const dir = irDir("ir-for-llama");
    const r = keel(["--model_path", dir, "--engine", "llama.cpp"]);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(`keel serve: --engine llama.cpp cannot serve ${dir}: it is an OpenVINO IR directory (openvino_model.xml) and llama.cpp serves GGUF files only; use --engine openvino (or auto)`);
  });

  it("--num_kv_blocks with the llama.cpp engine exits 2; --flash_attention true with openvino exits 2", () => {
    const a = keel(["--model_path", "keel-tiny", "--num_kv_blocks", "16"]);
    expect(a.status).toBe(2);
    expect(a.stderr).toContain("--num_kv_blocks sets the OpenVINO engine's shared KV block pool; the llama.cpp engine has none");
    const b = keel(["--model_path", "keel-tiny", "--engine", "openvino", "--flash_attention", "true"], fakeEnv);
    expect(b.status).toBe(2);
    expect(b.stderr).toContain("--flash_attention is a llama.cpp setting");
  });

  it("the llama.cpp engine itself refuses kvBlocks with a fatal (never ignores it): the model check fails with its message", () => {
    const llama = { command: process.execPath, args: [path.join(ROOT, "dist", "engine", "main.js")] };
    const r = keel(["--model_path", "keel-tiny", "--engine", "openvino", "--num_kv_blocks", "16"], { KEEL_ENGINE_COMMAND: JSON.stringify(llama) });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain("EngineConfig.kvBlocks (--num_kv_blocks 16) is not supported by the llama.cpp engine");
  });
});

describe("--config_path", () => {
  it("each model gets the auto rule (an IR folder → openvino, a GGUF → llama.cpp); num_kv_blocks per entry, refused for a llama.cpp entry", async () => {
    const dir = path.join(tmp, "config");
    fs.mkdirSync(dir, { recursive: true });
    irDir(path.join("config", "ir"));
    const write = (entries: object[]): string => {
      const file = path.join(dir, `config-${entries.length}-${Math.random().toString(16).slice(2)}.json`);
      fs.writeFileSync(file, JSON.stringify({ model_config_list: entries.map((config) => ({ config })) }));
      return file;
    };
    const flags = parseServeFlags([]);
    const [ov, tiny] = await resolveConfigModels(write([{ name: "ov", base_path: "ir", num_kv_blocks: 8 }, { name: "tiny", base_path: "keel-tiny" }]), flags, FAKE);
    expect(ov).toMatchObject({ name: "ov", engineName: "openvino", engine: { modelPath: path.join(dir, "ir"), kvBlocks: 8, maxModelLen: 224 } });
    expect(tiny).toMatchObject({ name: "tiny", engineName: "llama.cpp", engine: { device: "cpu" } });
    expect(tiny!.engine).not.toHaveProperty("kvBlocks");
    await expect(resolveConfigModels(write([{ name: "tiny", base_path: "keel-tiny", num_kv_blocks: 8 }]), flags, FAKE)).rejects.toThrow(/model "tiny": --num_kv_blocks sets the OpenVINO engine's shared KV block pool/);
    // A top-level --engine applies to every model.
    const [forced] = await resolveConfigModels(write([{ name: "tiny", base_path: "keel-tiny" }]), parseServeFlags(["--engine", "openvino"]), FAKE);
    expect(forced).toMatchObject({ engineName: "openvino", engine: { deterministic: false } });
    // target_device per entry as the flag means it (GPU is never turned into AUTO, which may fall back to the CPU).
    const [gpu] = await resolveConfigModels(write([{ name: "tiny", base_path: "keel-tiny", target_device: "GPU" }]), parseServeFlags(["--engine", "openvino"]), FAKE);
    expect(gpu!.engine.device).toBe("gpu");
  });
});
