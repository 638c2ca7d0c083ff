/**
 * The native build's cache (src/native/build.ts): built once per input set and reused, concurrent builders end with
 * one result, a changed binary directory gets its own build. A fake compiler stands in for g++ (it records each call
 * and writes its output file), so these run in a second; the real compile is exercised by sample-many.llama.test.ts.
 */
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { ADDON_FILE, NATIVE_SOURCE_DIR, applyPatch, buildNativeAddon, nativeAddonFor, nativeBuildKey } from "./build.js";

let work: string;
let binDir: string;
let cacheRoot: string;
let cxx: string;
let calls: string;

/** A node-llama-cpp-like binary directory: a real addon (for its dynamic section) and stand-ins for its libraries. */
function makeBinDir(dir: string): void {
  fs.mkdirSync(dir, { recursive: true });
  const real = path.resolve("node_modules/@node-llama-cpp/linux-x64/bins/linux-x64", ADDON_FILE);
  fs.copyFileSync(real, path.join(dir, ADDON_FILE));
  const needed = [...execFileSync("readelf", ["-d", real], { encoding: "utf8" }).matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]!);
  for (const lib of needed.filter((l) => /^lib(llama|ggml)/.test(l))) fs.writeFileSync(path.join(dir, lib), "stand-in");
}

beforeEach(() => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), "keel-native-build-"));
  binDir = path.join(work, "bins");
  cacheRoot = path.join(work, "cache");
  calls = path.join(work, "calls.log");
  makeBinDir(binDir);
  fs.mkdirSync(path.join(work, "llama.cpp"));
  cxx = path.join(work, "fake-g++");
  // Records its arguments; writes "<pid>" into the file after -o (an object or the addon).
  fs.writeFileSync(
    cxx,
    `#!/bin/sh\necho "$*" >> '${calls}'\n[ "$1" = "--version" ] && { echo fake; exit 0; }\nout=""; prev=""\nfor a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\necho "built by $$" > "$out"\n`,
    { mode: 0o755 },
  );
});

afterEach(() => {
  fs.rmSync(work, { recursive: true, force: true });
});

const callLines = () => (fs.existsSync(calls) ? fs.readFileSync(calls, "utf8").trim().split("\n") : []);
const build = (log?: (line: string) => void) => buildNativeAddon({ binDir, cacheRoot, cxx, jobs: 2, llamaSource: path.join(work, "llama.cpp"), verify: false, ...(log ? { log } : {}) });

describe("native addon build cache", () => {
  it("builds once (every addon source compiled, one link against the directory's libraries), then reuses it", async () => {
    expect(nativeAddonFor(binDir, cacheRoot).path).toBeNull();
    const logged: string[] = [];
    const first = await build((l) => logged.push(l));
    expect(first.cached).toBe(false);
    const lines = callLines();
    const compiles = lines.filter((l) => / -c /.test(l));
    // Progress: a first line saying it happens once, then every step numbered as it starts: each file, then the link.
    const head = /^building Keel's addon once for .* \(cached in .* until Keel's or node-llama-cpp's native sources change\): (\d+) steps \((\d+) files with /.exec(logged[0]!);
    // The first line's step count is the count the numbered lines use (the files, then the link).
    expect([Number(head?.[1]), Number(head?.[2])]).toEqual([compiles.length + 1, compiles.length]);
    const steps = logged.slice(1).map((l) => /^\[(\d+)\/(\d+)\] (.*)$/.exec(l)!);
    expect(steps.map((m) => Number(m[1]))).toEqual(Array.from({ length: compiles.length + 1 }, (_, i) => i + 1));
    expect(new Set(steps.map((m) => Number(m[2])))).toEqual(new Set([compiles.length + 1]));
    expect(steps.filter((m) => m[3]!.startsWith("compiling ")).map((m) => m[3]!.slice("compiling ".length)).sort()).toEqual(compiles.map((l) => / -c \S*[\\/]addon[\\/](\S+) -o /.exec(l)![1]).sort());
    expect(steps.at(-1)![3]).toBe(`linking ${ADDON_FILE}`);
    const links = lines.filter((l) => l.includes("-shared"));
    // node-llama-cpp's addon sources plus ours, and the link names its libraries with a RUNPATH to the directory.
    expect(compiles.some((l) => l.includes("keel-sampling.cpp"))).toBe(true);
    expect(compiles.some((l) => /addon[\\/]addon\.cpp/.test(l))).toBe(true);
    expect(links).toHaveLength(1);
    expect(links[0]).toMatch(/-l:libllama[^ ]*\.so/);
    expect(links[0]).toContain(`-Wl,-rpath,${fs.realpathSync(binDir)}`);
    expect(nativeAddonFor(binDir, cacheRoot).path).toBe(first.path);
    const before = lines.length;
    const again = await build();
    expect(again).toMatchObject({ cached: true, path: first.path });
    expect(callLines()).toHaveLength(before); // nothing compiled, not even `--version`
  });

  it("a damaged build (its bytes differ from what the build recorded) is never offered, and is built again", async () => {
    const first = await build();
    expect(nativeAddonFor(binDir, cacheRoot).path).toBe(first.path);
    for (const damage of [(f: string) => fs.truncateSync(f, 3), (f: string) => fs.writeFileSync(f, "built by someone else\n")]) {
      damage(first.path);
      const found = nativeAddonFor(binDir, cacheRoot);
      expect(found.path).toBeNull();
      expect("reason" in found && found.reason).toMatch(/^damaged at .*(bytes, the build wrote|SHA-256 differs)/);
      const before = callLines().filter((l) => l.includes("-shared")).length;
      const again = await build();
      expect(again).toMatchObject({ cached: false, path: first.path });
      expect(callLines().filter((l) => l.includes("-shared"))).toHaveLength(before + 1);
      expect(nativeAddonFor(binDir, cacheRoot).path).toBe(first.path);
    }
  });

  it("concurrent builders end with one result and leave no temporary folders", async () => {
    const results = await Promise.all([build(), build(), build()]);
    // All three really built (each found no build when it started), and all use the one that was renamed first.
    expect(callLines().filter((l) => l.includes("-shared"))).toHaveLength(3);
    expect(new Set(results.map((r) => r.path)).size).toBe(1);
    expect(fs.readFileSync(results[0]!.path, "utf8")).toMatch(/^built by \d+/);
    expect(fs.readdirSync(path.join(cacheRoot, "native"))).toEqual([path.basename(path.dirname(results[0]!.path))]);
  });

  it("a changed library in the binary directory gets its own build (the key follows its bytes, not its time)", async () => {
    const first = await build();
    const keyBefore = nativeBuildKey(binDir);
    const lib = fs.readdirSync(binDir).find((f) => f.startsWith("libllama"))!;
    const original = fs.readFileSync(path.join(binDir, lib));
    // The same bytes written anew (as `npm ci` does): the same key, whatever the file's time.
    fs.writeFileSync(path.join(binDir, lib), original);
    fs.utimesSync(path.join(binDir, lib), new Date(2030, 0, 1), new Date(2030, 0, 1));
    expect(nativeBuildKey(binDir)).toBe(keyBefore);
    // Other bytes of the same size (another build id), then another size: another key.
    const other = Buffer.from(original);
    other[0] = other[0]! ^ 0xff;
    fs.writeFileSync(path.join(binDir, lib), other);
    expect(nativeBuildKey(binDir)).not.toBe(keyBefore);
    fs.writeFileSync(path.join(binDir, lib), "a rebuilt library, other size");
    expect(nativeBuildKey(binDir)).not.toBe(keyBefore);
    expect(nativeAddonFor(binDir, cacheRoot).path).toBeNull();
    const second = await build();
    expect(second.cached).toBe(false);
    expect(second.path).not.toBe(first.path);
  });

  it("applies register.patch to node-llama-cpp's addon.cpp and AddonContext.cpp exactly as patch(1) does, and refuses one that changed", () => {
    const addonDir = path.resolve("node_modules/node-llama-cpp/llama/addon");
    const addonCpp = path.join(addonDir, "addon.cpp");
    const diff = fs.readFileSync(path.join(NATIVE_SOURCE_DIR, "register.patch"), "utf8");
    const ours = path.join(work, "ours");
    const theirs = path.join(work, "theirs");
    for (const d of [ours, theirs]) {
      fs.mkdirSync(d);
      for (const f of ["addon.cpp", "AddonContext.cpp"]) fs.copyFileSync(path.join(addonDir, f), path.join(d, f));
    }
    applyPatch(ours, diff);
    execFileSync("patch", ["-p1", "--batch", "--quiet", "-i", path.join(NATIVE_SOURCE_DIR, "register.patch")], { cwd: theirs });
    for (const f of ["addon.cpp", "AddonContext.cpp"]) {
      const patchedFile = fs.readFileSync(path.join(ours, f), "utf8");
      expect(patchedFile).toBe(fs.readFileSync(path.join(theirs, f), "utf8"));
      expect(patchedFile).not.toBe(fs.readFileSync(path.join(addonDir, f), "utf8"));
    }
    const patched = fs.readFileSync(path.join(ours, "addon.cpp"), "utf8");
    expect(patched).toMatch(/AddonSampler::init\(exports\);\n\s+keelRegisterSampling\(exports\);/);
    // The context takes its KV layout from Keel's setting (keelContextOptions) before the caller's options.
    expect(fs.readFileSync(path.join(ours, "AddonContext.cpp"), "utf8")).toMatch(/swa_full = false;\n\s+context_params\.kv_unified = keelKvUnified\(\);/);
    // An addon.cpp whose registration block moved: a clear refusal, not a silently unpatched build.
    fs.writeFileSync(path.join(ours, "addon.cpp"), fs.readFileSync(addonCpp, "utf8").replace("AddonSampler::init(exports);", "AddonSampler::init(exports, 1);"));
    expect(() => applyPatch(ours, diff)).toThrow(/does not apply to addon.cpp/);
  });

  it("refuses a directory without a node-llama-cpp addon, and a missing compiler, with a clear error", async () => {
    await expect(buildNativeAddon({ binDir: work, cacheRoot, cxx })).rejects.toThrow(/no llama-addon\.node/);
    await expect(buildNativeAddon({ binDir, cacheRoot, cxx: path.join(work, "no-such-compiler") })).rejects.toThrow(/no C\+\+ compiler/);
    // A directory whose llama.cpp libraries are missing: nothing to link against.
    for (const f of fs.readdirSync(binDir).filter((f) => f.startsWith("libllama"))) fs.rmSync(path.join(binDir, f));
    await expect(buildNativeAddon({ binDir, cacheRoot, cxx, verify: false })).rejects.toThrow(/links no libllama/);
    makeBinDir(binDir);
    // A build that does not load (here: the fake compiler's text file) is refused, and nothing is published.
    await expect(buildNativeAddon({ binDir, cacheRoot, cxx, jobs: 2, llamaSource: path.join(work, "llama.cpp") })).rejects.toThrow(/does not load/);
    expect(nativeAddonFor(binDir, cacheRoot).path).toBeNull();
  });
});
