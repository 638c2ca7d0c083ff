import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { checkKey, readCheck, writeCheck } from "./model-check-cache.js";
import type { EngineConfig } from "../protocol/engine-config.js";

let dir: string;
let model: string;
const command = { command: "node", args: ["engine.js"] };
const config = (over: Partial<EngineConfig> = {}): Omit<EngineConfig, "mode"> => ({ modelPath: model, maxNumSeqs: 4, maxModelLen: 256, ...over }) as unknown as Omit<EngineConfig, "mode">;
const on = { KEEL_MODEL_CHECK_CACHE: "on" };

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-check-key-"));
  model = path.join(dir, "m.gguf");
  fs.writeFileSync(model, "GGUF model bytes");
});
afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

describe("the model check's memory", () => {
  it("the key follows the file, the configuration and the command; the same start gets the same key", () => {
    const key = checkKey(config(), command, on);
    expect(key).toMatch(/^[0-9a-f]{32}$/);
    expect(checkKey(config(), command, on)).toBe(key);
    expect(checkKey(config({ maxNumSeqs: 5 }), command, on)).not.toBe(key);
    expect(checkKey(config(), { ...command, args: ["other.js"] }, on)).not.toBe(key);
    // Which addon runs: node-llama-cpp's own cannot apply what Keel's can (a shared KV buffer); unset is Keel's.
    expect(checkKey(config(), command, { ...on, KEEL_NATIVE_SAMPLING: "off" })).not.toBe(key);
    expect(checkKey(config(), command, { ...on, KEEL_NATIVE_SAMPLING: "on" })).toBe(key);
    fs.writeFileSync(model, "GGUF other model bytes"); // a new file in its place: size and time change
    expect(checkKey(config(), command, on)).not.toBe(key);
  });

  it("nothing is remembered when switched off, for a folder (an OpenVINO IR) or a path that does not exist", () => {
    for (const off of ["off", "0", "false", "NO"]) expect(checkKey(config(), command, { KEEL_MODEL_CHECK_CACHE: off })).toBeNull();
    expect(checkKey(config(), command, {})).not.toBeNull();
    expect(checkKey(config({ modelPath: dir }), command, on)).toBeNull();
    expect(checkKey(config({ modelPath: path.join(dir, "missing.gguf") }), command, on)).toBeNull();
  });

  it("a written record reads back; an unknown or unreadable one is null", () => {
    const result = { vocabSize: 32000, trainContextSize: 2048 } as never;
    writeCheck(dir, "k1", model, result);
    expect(readCheck(dir, "k1")).toEqual(result);
    expect(readCheck(dir, "k2")).toBeNull();
    fs.writeFileSync(path.join(dir, "checks", "k3.json"), "{not json");
    expect(readCheck(dir, "k3")).toBeNull();
  });
});
