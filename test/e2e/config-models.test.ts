/**
 * `--config_path` resolution (src/cli/serve-config.ts) with the real engine's model check: base_path forms (a folder
 * with one .gguf, relative to the config file), the server's flags as defaults with each entry's settings on top, and
 * refusals that name the model and the setting.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { parseServeFlags } from "../../src/cli.js";
import { resolveConfigModels } from "../../src/cli/serve-config.js";
import { ROOT } from "../support/server.js";

/** The built engine (vitest runs the sources, whose engine path would be the TypeScript file). */
const DEFAULT_ENGINE_COMMAND = { command: process.execPath, args: [path.join(ROOT, "dist", "engine", "main.js")] };
const TINY = path.join(ROOT, "models", fs.readdirSync(path.join(ROOT, "models")).find((f) => /^keel-tiny-[0-9a-f]+\.gguf$/.test(f))!);

function configDir(entries: Record<string, unknown>[]): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-config-"));
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify({ model_config_list: entries.map((config) => ({ config })) }));
  return dir;
}

describe("resolveConfigModels", () => {
  it("a relative folder with one .gguf; flags as defaults, each entry's settings on top", async () => {
    const dir = configDir([
      { name: "a", base_path: "model-a", max_num_seqs: 2, max_model_len: 512, tool_parser: "hermes3" },
      { name: "b", base_path: "keel-tiny" },
    ]);
    fs.mkdirSync(path.join(dir, "model-a"));
    fs.symlinkSync(TINY, path.join(dir, "model-a", "weights.gguf"));
    const flags = parseServeFlags(["--max_num_seqs", "6", "--max_num_batched_tokens", "128"]);
    const [a, b] = await resolveConfigModels(path.join(dir, "config.json"), flags, DEFAULT_ENGINE_COMMAND);
    expect(a!.name).toBe("a");
    expect(a!.engine.modelPath).toBe(path.join(dir, "model-a", "weights.gguf"));
    expect([a!.engine.maxNumSeqs, a!.engine.maxNumBatchedTokens, a!.engine.maxModelLen]).toEqual([2, 128, 512]);
    expect(a!.agents.toolParser).toBe("hermes3");
    expect(b!.engine.maxNumSeqs).toBe(6);
    expect(b!.agents.toolParser).toBeNull();
  });

  it("refusals name the model and the problem: a bad setting, a folder with two .gguf files, a missing file", async () => {
    const flags = parseServeFlags([]);
    const bad = configDir([{ name: "a", base_path: "keel-tiny", max_num_seqs: 0 }]);
    await expect(resolveConfigModels(path.join(bad, "config.json"), flags, DEFAULT_ENGINE_COMMAND)).rejects.toThrow(/model "a": max_num_seqs must be an integer between 1 and 256/);
    const two = configDir([{ name: "two", base_path: "m" }]);
    fs.mkdirSync(path.join(two, "m"));
    fs.symlinkSync(TINY, path.join(two, "m", "x.gguf"));
    fs.symlinkSync(TINY, path.join(two, "m", "y.gguf"));
    await expect(resolveConfigModels(path.join(two, "config.json"), flags, DEFAULT_ENGINE_COMMAND)).rejects.toThrow(/model "two": .* 2 \.gguf files/);
    const missing = configDir([{ name: "gone", base_path: "nowhere.gguf" }]);
    await expect(resolveConfigModels(path.join(missing, "config.json"), flags, DEFAULT_ENGINE_COMMAND)).rejects.toThrow(/model "gone": the model file .*nowhere\.gguf does not exist/);
    await expect(resolveConfigModels(path.join(missing, "absent.json"), flags, DEFAULT_ENGINE_COMMAND)).rejects.toThrow(/cannot read the config file/);
    const contradicts = configDir([{ name: "d", base_path: "keel-tiny", enable_prefix_caching: true }]);
    await expect(resolveConfigModels(path.join(contradicts, "config.json"), parseServeFlags(["--deterministic", "true"]), DEFAULT_ENGINE_COMMAND)).rejects.toThrow(/model "d": enable_prefix_caching true contradicts --deterministic true/);
  });

  it("a config file that is a FIFO or /dev/zero is refused at once (reading it would stall every model's streams)", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-config-special-"));
    const fifo = path.join(dir, "fifo.json");
    execFileSync("mkfifo", [fifo]);
    fs.symlinkSync("/dev/zero", path.join(dir, "zero.json"));
    const flags = parseServeFlags([]);
    await expect(resolveConfigModels(fifo, flags, DEFAULT_ENGINE_COMMAND)).rejects.toThrow(/cannot read the config file .*fifo\.json: not a regular file/);
    await expect(resolveConfigModels(path.join(dir, "zero.json"), flags, DEFAULT_ENGINE_COMMAND)).rejects.toThrow(/not a regular file/);
    fs.writeFileSync(path.join(dir, "huge.json"), Buffer.alloc((1 << 20) + 1, 32));
    await expect(resolveConfigModels(path.join(dir, "huge.json"), flags, DEFAULT_ENGINE_COMMAND)).rejects.toThrow(/larger than 1048576 bytes/);
  });
});
