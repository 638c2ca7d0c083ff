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
import { LlamaAdapter } from "../engine/llama/adapter.js";
import { createHash } from "node:crypto";
import { buildNativeAddon, defaultCacheRoot, getLlamaBinDir, nativeBuildDir } from "./build.js";
import { loadWithKeelAddon, nativeSamplingSwitch } from "./loader.js";

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
      // The shared KV buffer is set through Keel's addon only: asked for on node-llama-cpp's own, the open fails by name.
      await expect(LlamaAdapter.open({ modelPath, sequences: 2, contextSize: 128, batchSize: 64, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu", kvUnified: true })).rejects.toThrow(
        "--kv_unified true needs Keel's native addon, which is not loaded here: KEEL_NATIVE_SAMPLING=off",
      );
    } finally {
      await adapter.dispose();
    }
  });

  /** A cache root holding a copy of the real build for binDir, damaged by `damage(addonFile, buildJsonFile)`. */
  function damagedCopy(damage: (addon: string, buildJson: string) => void): string {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), "keel-native-damaged-"));
    const dir = nativeBuildDir(binDir, root);
    fs.mkdirSync(path.dirname(dir), { recursive: true });
    // The real build: in the cache this process started with (a test may point KEEL_CACHE_DIR elsewhere).
    const realBuild = nativeBuildDir(binDir, defaultCacheRoot({ ...process.env, KEEL_CACHE_DIR: saved.cache }));
    fs.cpSync(realBuild, dir, { recursive: true });
    damage(path.join(dir, "llama-addon.node"), path.join(dir, "build.json"));
    return root;
  }

  it("a truncated or overwritten build is not loaded: node-llama-cpp's addon runs, the reason names the file", async () => {
    for (const damage of [(f: string) => fs.truncateSync(f, 4096), (f: string) => fs.writeFileSync(f, Buffer.alloc(700_000, 7))]) {
      const root = damagedCopy(damage);
      process.env["KEEL_CACHE_DIR"] = root;
      const adapter = await open();
      try {
        expect(adapter.nativeAddon.kind).toBe("node-llama-cpp");
        expect(adapter.nativeAddon.kind === "node-llama-cpp" && adapter.nativeAddon.reason).toMatch(/^Keel's addon is damaged at .*llama-addon\.node/);
        expect(adapter.sampleMany).toBeUndefined();
      } finally {
        await adapter.dispose();
        fs.rmSync(root, { recursive: true, force: true });
      }
    }
  });

  it("a build that matches its record but will not load falls back to node-llama-cpp's addon instead of failing", async () => {
    // Garbage with a build.json that vouches for it: only dlopen can tell.
    const root = damagedCopy((addon, buildJson) => {
      const junk = Buffer.alloc(4096, 1);
      fs.writeFileSync(addon, junk);
      const rec = JSON.parse(fs.readFileSync(buildJson, "utf8")) as Record<string, unknown>;
      fs.writeFileSync(buildJson, JSON.stringify({ ...rec, addonSha256: createHash("sha256").update(junk).digest("hex"), addonBytes: junk.length }));
    });
    process.env["KEEL_CACHE_DIR"] = root;
    const adapter = await open();
    try {
      expect(adapter.nativeAddon.kind).toBe("node-llama-cpp");
      expect(adapter.nativeAddon.kind === "node-llama-cpp" && adapter.nativeAddon.reason).toMatch(/^Keel's addon at .* failed to load: /);
      // node-llama-cpp's own addon really runs: a decode and a sample work.
      const s = adapter.createSampler({ temperature: 0, topP: 1, topK: 0, minP: 0, seed: 1, bias: new Map(), repetitionPenalty: 1 });
      const idx = await adapter.decode([{ slot: 0, pos: 0, tokens: adapter.tokenize("hello"), wantsLogits: true }]);
      expect(await adapter.sample(idx[0]!, s)).toBeGreaterThanOrEqual(0);
      s.dispose();
    } finally {
      await adapter.dispose();
      fs.rmSync(root, { recursive: true, force: true });
    }
  });

  it("KEEL_NATIVE_SAMPLING: on/1/true/yes or unset → Keel's; off/0/false/no → node-llama-cpp's; anything else is named", async () => {
    expect([undefined, "", "on", "1", "TRUE", "yes"].map(nativeSamplingSwitch)).toEqual(new Array(6).fill("on"));
    expect(["off", "0", "false", "No"].map(nativeSamplingSwitch)).toEqual(new Array(4).fill("off"));
    expect(["of", "2", "disable"].map(nativeSamplingSwitch)).toEqual(new Array(3).fill("invalid"));
    process.env["KEEL_NATIVE_SAMPLING"] = "of";
    const adapter = await open();
    try {
      expect(adapter.nativeAddon).toEqual({ kind: "node-llama-cpp", reason: 'KEEL_NATIVE_SAMPLING="of" is not on/off (1/0, true/false, yes/no)' });
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
