/**
 * Contract of src/native/loader.ts with node-llama-cpp 3.21.1 (re-run on any upgrade; docs/upstream.md "Keel's
 * addon"): getLlama loads its addon in-process through `process.dlopen` with a file in the binary directory it chose,
 * so swapping the file name there makes it run Keel's build for that very directory; without a build, or with
 * KEEL_NATIVE_SAMPLING=off, node-llama-cpp's own addon runs and the reason is kept for the engine's one log line.
 */
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { ensureDefaultModel } from "../model/default-model.js";
import { LlamaAdapter } from "../engine/llama-adapter.js";
import { buildNativeAddon, defaultCacheRoot, getLlamaBinDir, nativeBuildDir } from "./build.js";
import { loadWithKeelAddon } from "./loader.js";

let modelPath: string;
let binDir: string;
const saved = { cache: process.env["KEEL_CACHE_DIR"], switch: process.env["KEEL_NATIVE_SAMPLING"] };

beforeAll(async () => {
  modelPath = await ensureDefaultModel();
  const dir = await getLlamaBinDir(false);
  if (dir === null) throw new Error("node-llama-cpp loads no CPU addon here");
  binDir = dir;
  await buildNativeAddon({ binDir });
}, 300_000);

afterEach(() => {
  for (const [key, value] of [["KEEL_CACHE_DIR", saved.cache], ["KEEL_NATIVE_SAMPLING", saved.switch]] as const) {
    if (value === undefined) delete process.env[key];
    else process.env[key] = value;
  }
});

const open = () => LlamaAdapter.open({ modelPath, sequences: 1, contextSize: 128, batchSize: 64, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });

describe("Keel's addon loader (node-llama-cpp 3.21.1)", () => {
  it("runs Keel's build for the directory node-llama-cpp chose, with keelSampleTokens", async () => {
    const adapter = await open();
    try {
      expect(adapter.nativeAddon).toEqual({ kind: "keel", path: path.join(nativeBuildDir(binDir, defaultCacheRoot()), "llama-addon.node"), binDir });
      expect(typeof adapter.sampleMany).toBe("function");
      expect((await adapter.backend()).addon).toBe("keel");
    } finally {
      await adapter.dispose();
    }
  });

  it("falls back to node-llama-cpp's addon with the reason when nothing was built for that directory", async () => {
    const empty = fs.mkdtempSync(path.join(os.tmpdir(), "keel-native-empty-"));
    process.env["KEEL_CACHE_DIR"] = empty;
    const adapter = await open();
    try {
      expect(adapter.nativeAddon.kind).toBe("node-llama-cpp");
      expect(adapter.nativeAddon.kind === "node-llama-cpp" && adapter.nativeAddon.reason).toContain(`not built for ${binDir}`);
      expect(adapter.sampleMany).toBeUndefined();
      expect((await adapter.backend()).addon).toBe("node-llama-cpp");
    } finally {
      await adapter.dispose();
      fs.rmSync(empty, { recursive: true, force: true });
    }
  });

  it("KEEL_NATIVE_SAMPLING=off forces node-llama-cpp's addon although a build exists", async () => {
    process.env["KEEL_NATIVE_SAMPLING"] = "off";
    const adapter = await open();
    try {
      expect(adapter.nativeAddon).toEqual({ kind: "node-llama-cpp", reason: "KEEL_NATIVE_SAMPLING=off" });
      expect(adapter.sampleMany).toBeUndefined();
    } finally {
      await adapter.dispose();
    }
  });

  it("restores process.dlopen after the load, also when the load fails", async () => {
    const original = process.dlopen;
    await expect(loadWithKeelAddon(async () => {
      expect(process.dlopen).not.toBe(original); // hooked only while getLlama runs
      throw new Error("load failed");
    })).rejects.toThrow("load failed");
    expect(process.dlopen).toBe(original);
  });
});
