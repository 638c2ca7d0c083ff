/**
 * Builds Keel's copy of node-llama-cpp's native addon: node-llama-cpp's own addon sources (llama/addon/**, patched in
 * a temporary copy by register.patch) plus src/native/keel-sampling.cpp (one synchronous call that samples a whole
 * step), compiled with the system C++ compiler and LINKED AGAINST the shared libraries of an existing node-llama-cpp
 * binary directory (the CPU or CUDA prebuilt, or a node-llama-cpp source build), with a RUNPATH to that directory.
 * So llama.cpp and ggml are not rebuilt: only the ~20 small addon files (docs/upstream.md "Keel's addon").
 *
 * The result lives outside the repository, in `<cache>/native/<key>/llama-addon.node`, where the key hashes every
 * input that can change the binary: ours and node-llama-cpp's addon sources, the patch, node-addon-api's version and
 * the binary directory (path, and name, size and first 64 KiB of its files). {@link nativeAddonFor} computes the same
 * key at engine start (cheap, synchronous) to find a build for the directory node-llama-cpp is loading. Concurrent builders
 * each build in a private temporary folder and rename it into place: the first rename wins, the others use it.
 */
import { createHash, randomBytes } from "node:crypto";
import { execFile, execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { keelCacheRoot } from "../model/model-cache.js";
import { makeDirsSync } from "../model/make-dirs.js";

/** Bumped when the way the addon is built changes (flags, layout): old builds are then not used. */
const BUILD_FORMAT = 1;

/** File name of the addon inside a build folder (the same name node-llama-cpp's binary has). */
export const ADDON_FILE = "llama-addon.node";

/** Keel's native sources: `<repo>/src/native` whether this module runs from src/ (tests) or dist/ (built). */
export const NATIVE_SOURCE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "src", "native");
const OUR_SOURCES = ["keel-sampling.cpp", "keel-fused-sampling.cpp", "keel-sampling-pool.cpp", "keel-grammar-utf8.cpp", "register.patch"] as const;

/** A build is not possible here (no compiler, no headers, a binary directory it cannot link against). */
export class NativeBuildError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NativeBuildError";
  }
}

/** Where node-llama-cpp is installed (its package folder). */
export function nodeLlamaCppDir(): string {
  const require = createRequire(import.meta.url);
  return path.dirname(path.dirname(require.resolve("node-llama-cpp"))); // …/dist/index.js → package root
}

/** Keel's cache root, shared with the model cache and the venvs (model-cache.ts). */
export const defaultCacheRoot = keelCacheRoot;

/** Every file under `dir`, relative, sorted (the addon sources are a shallow tree of ~40 small files). */
function listFiles(dir: string, prefix = ""): string[] {
  const out: string[] = [];
  for (const entry of fs.readdirSync(path.join(dir, prefix), { withFileTypes: true })) {
    const rel = path.join(prefix, entry.name);
    if (entry.isDirectory()) out.push(...listFiles(dir, rel));
    else if (entry.isFile()) out.push(rel);
  }
  return out.sort();
}

/** The first `bytes` bytes of `file` (fewer when it is shorter). */
function readHead(file: string, bytes: number): Buffer {
  const fd = fs.openSync(file, "r");
  try {
    const buf = Buffer.alloc(bytes);
    return buf.subarray(0, fs.readSync(fd, buf, 0, bytes, 0));
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * The cache key of a build for `binDir` (hex). Synchronous and cheap (hashes ~100 KB of sources and the first
 * 64 KiB of each library in the binary directory), because the engine computes it at start.
 * @throws Error when Keel's native sources or node-llama-cpp's addon sources are missing.
 */
export function nativeBuildKey(binDir: string): string {
  const hash = createHash("sha256");
  const line = (s: string) => hash.update(s + "\n");
  line(`format ${BUILD_FORMAT}`);
  // 1. Ours.
  for (const f of OUR_SOURCES) {
    line(`keel ${f}`);
    hash.update(fs.readFileSync(path.join(NATIVE_SOURCE_DIR, f)));
  }
  // 2. node-llama-cpp's addon sources and the llama.cpp release they are meant for.
  const nlc = nodeLlamaCppDir();
  line(`node-llama-cpp ${JSON.parse(fs.readFileSync(path.join(nlc, "package.json"), "utf8")).version}`);
  line(fs.readFileSync(path.join(nlc, "llama", "llama.cpp.info.json"), "utf8"));
  const addonDir = path.join(nlc, "llama", "addon");
  for (const f of listFiles(addonDir)) {
    line(`addon ${f}`);
    hash.update(fs.readFileSync(path.join(addonDir, f)));
  }
  const require = createRequire(import.meta.url);
  line(`node-addon-api ${JSON.parse(fs.readFileSync(require.resolve("node-addon-api/package.json"), "utf8")).version}`);
  // 3. The binary directory we link against: a rebuilt or replaced library changes its size or its first 64 KiB (an
  //    ELF file's build id is in its first page). Not its time: `npm ci` writes the same files anew, and the addon
  //    linked against them is still right (it was rebuilt after every reinstall when the key had the times).
  const real = fs.realpathSync(binDir);
  line(`bin ${real}`);
  for (const f of fs.readdirSync(real).sort()) {
    const file = path.join(real, f);
    const st = fs.statSync(file);
    if (!st.isFile()) continue;
    line(`${f} ${st.size}`);
    hash.update(readHead(file, 64 * 1024));
  }
  return hash.digest("hex").slice(0, 32);
}

/** The build folder of `binDir` in `cacheRoot` (whether or not it was built). */
export function nativeBuildDir(binDir: string, cacheRoot = defaultCacheRoot()): string {
  return path.join(cacheRoot, "native", nativeBuildKey(binDir));
}

/** Keel's addon for `binDir` when it was built, else null with the reason (for the engine's one fallback log line). */
export function nativeAddonFor(binDir: string, cacheRoot = defaultCacheRoot()): { path: string } | { path: null; reason: string } {
  let dir: string;
  try {
    dir = nativeBuildDir(binDir, cacheRoot);
  } catch (err) {
    return { path: null, reason: `cannot compute the build key (${(err as Error).message})` };
  }
  const file = path.join(dir, ADDON_FILE);
  if (!fs.existsSync(file)) return { path: null, reason: `not built for ${binDir} (node scripts/build-native.mjs --bin-dir ${binDir})` };
  // A damaged file must never reach dlopen (a truncated one kills the process with SIGBUS, which nothing can catch):
  // it is used only when it is byte for byte what the build recorded.
  const damaged = addonDamage(dir);
  if (damaged !== null) return { path: null, reason: `damaged at ${file}: ${damaged} (rebuild: rm -r ${dir} && node scripts/build-native.mjs --bin-dir ${binDir})` };
  return { path: file };
}

/** SHA-256 and size of a file, as recorded in build.json. */
function fingerprint(file: string): { addonSha256: string; addonBytes: number } {
  const bytes = fs.readFileSync(file);
  return { addonSha256: createHash("sha256").update(bytes).digest("hex"), addonBytes: bytes.length };
}

/** Why the addon in build folder `dir` is not what its build recorded, or null when it is. */
export function addonDamage(dir: string): string | null {
  let recorded: { addonSha256?: unknown; addonBytes?: unknown };
  try {
    recorded = JSON.parse(fs.readFileSync(path.join(dir, "build.json"), "utf8")) as typeof recorded;
  } catch (err) {
    return `build.json unreadable (${(err as Error).message})`;
  }
  if (typeof recorded.addonSha256 !== "string") return "build.json records no checksum (built by an older Keel)";
  let now: { addonSha256: string; addonBytes: number };
  try {
    now = fingerprint(path.join(dir, ADDON_FILE));
  } catch (err) {
    return `unreadable (${(err as Error).message})`;
  }
  if (now.addonBytes !== recorded.addonBytes) return `${now.addonBytes} bytes, the build wrote ${String(recorded.addonBytes)}`;
  if (now.addonSha256 !== recorded.addonSha256) return "its SHA-256 differs from the one the build recorded";
  return null;
}

/**
 * The binary directory node-llama-cpp's getLlama loads its addon from for `gpu` (as the engine calls it: false for
 * device "cpu", "auto" otherwise), recorded from the in-process addon load (the hook point of loader.ts); null when
 * it loads none. Loads and disposes a Llama (skipping the backend init).
 */
export async function getLlamaBinDir(gpu: false | "auto"): Promise<string | null> {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const original = process.dlopen;
  let loaded: string | null = null;
  process.dlopen = function record(module: object, filename: string, flags?: number): void {
    if (path.basename(filename) === ADDON_FILE) loaded = path.dirname(filename);
    return flags === undefined ? original.call(process, module, filename) : original.call(process, module, filename, flags);
  };
  try {
    const llama = await getLlama({ gpu, build: "never", progressLogs: false, logLevel: LlamaLogLevel.error });
    await llama.dispose();
  } catch {
    // no binary loads for this choice: `loaded` says whether one was tried
  } finally {
    process.dlopen = original;
  }
  return loaded;
}

/** Options of {@link buildNativeAddon}. */
export interface NativeBuildOptions {
  /** The node-llama-cpp binary directory to link against (holds llama-addon.node and its libraries). */
  binDir: string;
  /** Keel's cache root (default {@link defaultCacheRoot}). */
  cacheRoot?: string;
  /** C++ compiler (default `$CXX`, else g++). */
  cxx?: string;
  /** Parallel compiler processes (default: the machine's available parallelism). */
  jobs?: number;
  /** llama.cpp source checkout whose headers to compile with (default: node-llama-cpp's llama/llama.cpp, else its git bundle). */
  llamaSource?: string;
  /** Progress lines. */
  log?: (line: string) => void;
  /**
   * Load the built addon in a child process before publishing it (default true): a build that cannot load (a library
   * ABI mismatch) is refused here instead of taking the engine down at start. Off only for tests with a fake compiler.
   */
  verify?: boolean;
}

/** Result of {@link buildNativeAddon}. */
export interface NativeBuildResult {
  /** The built addon. */
  path: string;
  /** True when an earlier build was reused (nothing compiled). */
  cached: boolean;
  /** Wall time of this call (seconds). */
  seconds: number;
}

/** Run a command, resolving with stdout; rejects with its stderr tail. */
function run(cmd: string, args: string[], cwd?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err) reject(new NativeBuildError(`${path.basename(cmd)} ${args.slice(-3).join(" ")} failed: ${String(stderr || err.message).slice(-4000)}`));
      else resolve(stdout);
    });
  });
}

/** The running Node's headers (node_api.h). */
function findNodeHeaders(env: NodeJS.ProcessEnv = process.env): string {
  const candidates = [
    env["KEEL_NODE_HEADERS"],
    env["npm_config_nodedir"] ? path.join(env["npm_config_nodedir"], "include", "node") : undefined,
    path.resolve(path.dirname(process.execPath), "..", "include", "node"),
    "/usr/include/node",
    "/usr/local/include/node",
    path.join(os.homedir(), ".cache", "node-gyp", process.versions.node, "include", "node"),
    path.join(os.homedir(), ".cmake-js", `node-${process.arch}`, `v${process.versions.node}`, "include", "node"),
  ];
  for (const c of candidates) if (c && fs.existsSync(path.join(c, "node_api.h"))) return c;
  throw new NativeBuildError(`no Node headers (node_api.h) found; set KEEL_NODE_HEADERS (looked in ${candidates.filter(Boolean).join(", ")})`);
}

/** DT_NEEDED and DT_RUNPATH/RPATH of a shared object (readelf, part of binutils next to any gcc). */
function dynamicSection(file: string): { needed: string[]; runpath: string[] } {
  let text: string;
  try {
    text = execFileSync("readelf", ["-d", file], { encoding: "utf8" });
  } catch (err) {
    throw new NativeBuildError(`readelf -d ${file} failed (binutils needed): ${(err as Error).message}`);
  }
  const needed = [...text.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]!);
  const runpath = [...text.matchAll(/\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]+)\]/g)].flatMap((m) => m[1]!.split(":"));
  return { needed, runpath };
}

/**
 * llama.cpp headers of the release node-llama-cpp ships: its own checkout (a source build has one), else its git
 * bundle checked out once into the cache (offline, as bench/build-llama-server.sh does). Only headers are used, and
 * node-llama-cpp's patches touch no header, so they are not applied.
 */
async function llamaSourceDir(cacheRoot: string, log: (l: string) => void): Promise<string> {
  const llamaDir = path.join(nodeLlamaCppDir(), "llama");
  const checkout = path.join(llamaDir, "llama.cpp");
  if (fs.existsSync(path.join(checkout, "include", "llama.h"))) return checkout;
  const bundle = path.join(llamaDir, "gitRelease.bundle");
  if (!fs.existsSync(bundle)) throw new NativeBuildError(`no llama.cpp source: neither ${checkout} nor ${bundle}`);
  const heads = await run("git", ["bundle", "list-heads", bundle]);
  const commit = /^([0-9a-f]{40}) HEAD$/m.exec(heads)?.[1];
  if (!commit) throw new NativeBuildError(`${bundle} names no HEAD commit`);
  const target = path.join(cacheRoot, "native", `llama.cpp-${commit.slice(0, 12)}`);
  if (fs.existsSync(path.join(target, "include", "llama.h"))) return target;
  log(`extracting llama.cpp ${commit.slice(0, 12)} headers from node-llama-cpp's git bundle`);
  const tmp = `${target}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    await run("git", ["clone", "-q", "--bare", bundle, path.join(tmp, ".git-bare")]);
    const archive = path.join(tmp, "src.tar");
    await run("git", ["--git-dir", path.join(tmp, ".git-bare"), "archive", "-o", archive, commit, "include", "common", "ggml/include", "src", "vendor"]);
    await run("tar", ["-xf", archive, "-C", tmp]);
    fs.rmSync(path.join(tmp, ".git-bare"), { recursive: true, force: true });
    fs.rmSync(archive, { force: true });
    publish(tmp, target);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  return target;
}

/** Rename a finished temporary folder into place; when another builder got there first, theirs stays. */
function publish(tmp: string, target: string): void {
  try {
    fs.renameSync(tmp, target);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== "ENOTEMPTY" && code !== "EEXIST") throw err;
  }
}

/**
 * Apply a unified diff to the files under `dir` (no `patch` or `git` needed on the machine): each hunk's old block
 * (context and removed lines) must occur exactly once in its file and is replaced by the new block.
 * @throws NativeBuildError when a hunk does not match (node-llama-cpp's addon.cpp changed: update register.patch).
 */
export function applyPatch(dir: string, diff: string): void {
  const files = diff.split(/^--- .*\n\+\+\+ (?:b\/)?(.*)\n/m);
  for (let f = 1; f < files.length; f += 2) {
    const rel = files[f]!.trim().split("\t")[0]!;
    const file = path.join(dir, rel);
    let text = fs.readFileSync(file, "utf8");
    for (const hunk of files[f + 1]!.split(/^@@.*@@.*\n/m).slice(1)) {
      const lines = hunk.replace(/\n$/, "").split("\n");
      const oldBlock = lines.filter((l) => !l.startsWith("+")).map((l) => l.slice(1)).join("\n");
      const newBlock = lines.filter((l) => !l.startsWith("-")).map((l) => l.slice(1)).join("\n");
      const at = text.indexOf(oldBlock);
      if (at < 0 || text.indexOf(oldBlock, at + 1) >= 0) throw new NativeBuildError(`src/native/register.patch does not apply to ${rel} of this node-llama-cpp (a hunk matches ${at < 0 ? "nowhere" : "twice"})`);
      text = text.slice(0, at) + newBlock + text.slice(at + oldBlock.length);
    }
    fs.writeFileSync(file, text);
  }
}

/** Run `tasks` with at most `jobs` at a time; rejects with the first failure after the running ones settle. */
async function pool(tasks: (() => Promise<unknown>)[], jobs: number): Promise<void> {
  let next = 0;
  let failure: unknown = null;
  const worker = async () => {
    while (failure === null && next < tasks.length) {
      const task = tasks[next++]!;
      try {
        await task();
      } catch (err) {
        failure ??= err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(jobs, tasks.length)) }, worker));
  if (failure !== null) throw failure;
}

/**
 * Build Keel's addon for `binDir` once; later calls (and concurrent ones) reuse the result.
 * @throws NativeBuildError when it cannot be built here (the engine then runs node-llama-cpp's own addon).
 */
export async function buildNativeAddon(opts: NativeBuildOptions): Promise<NativeBuildResult> {
  const started = Date.now();
  const log = opts.log ?? (() => {});
  const cacheRoot = opts.cacheRoot ?? defaultCacheRoot();
  const binDir = fs.realpathSync(opts.binDir);
  const original = path.join(binDir, ADDON_FILE);
  if (!fs.existsSync(original)) throw new NativeBuildError(`${binDir} holds no ${ADDON_FILE} (not a node-llama-cpp binary directory)`);
  const target = nativeBuildDir(binDir, cacheRoot);
  const output = path.join(target, ADDON_FILE);
  const seconds = () => (Date.now() - started) / 1000;
  // 1. Built before (by us or a concurrent builder) and intact: nothing to do. A damaged build is moved aside and
  //    built again.
  if (fs.existsSync(output)) {
    if (addonDamage(target) === null) return { path: output, cached: true, seconds: seconds() };
    log(`${output} is damaged (${addonDamage(target)}); building it again`);
    fs.renameSync(target, `${target}.damaged-${process.pid}-${randomBytes(4).toString("hex")}`);
  }

  // 2. Tools and inputs.
  const cxx = opts.cxx ?? process.env["CXX"] ?? "g++";
  try {
    await run(cxx, ["--version"]);
  } catch {
    throw new NativeBuildError(`no C++ compiler (${cxx}); install g++ or set CXX`);
  }
  const nodeHeaders = findNodeHeaders();
  const require = createRequire(import.meta.url);
  const addonApi = path.dirname(require.resolve("node-addon-api/package.json"));
  const llama = opts.llamaSource ?? (await llamaSourceDir(cacheRoot, log));
  const { needed, runpath } = dynamicSection(original);
  // The original's RUNPATH ($ORIGIN-relative in prebuilts; a source build may add absolute build folders).
  const libDirs = [...new Set([binDir, ...runpath.map((r) => path.resolve(r.replace("$ORIGIN", binDir))).filter((d) => fs.existsSync(d))])];
  const system = /^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux.*)\.so/;
  const links: string[] = [];
  const defines: string[] = [];
  for (const lib of needed) {
    if (system.test(lib)) continue;
    if (lib.startsWith("libvulkan.so")) {
      // node-llama-cpp's Vulkan build asks Vulkan itself for device details (GPU_INFO_USE_VULKAN): needs the headers.
      const inc = [process.env["VULKAN_SDK"] ? path.join(process.env["VULKAN_SDK"], "include") : "", "/usr/include"].find((d) => d && fs.existsSync(path.join(d, "vulkan", "vulkan.hpp")));
      if (!inc) throw new NativeBuildError(`${binDir} is a Vulkan build and the Vulkan headers (vulkan/vulkan.hpp) are missing`);
      defines.push("-DGPU_INFO_USE_VULKAN", `-I${inc}`);
      links.push(`-l:${lib}`);
      continue;
    }
    // A library found elsewhere (CUDA's runtime next to a source build's libggml-cuda) is a dependency of the llama.cpp
    // libraries, resolved when they load; our addon needs only the directory's own libraries (the smoke test checks).
    if (libDirs.some((d) => fs.existsSync(path.join(d, lib)))) links.push(`-l:${lib}`);
  }
  if (!links.some((l) => l.startsWith("-l:libllama"))) throw new NativeBuildError(`${original} links no libllama from ${libDirs.join(", ")} (needs: ${needed.join(", ")})`);

  // 3. A private temporary folder: node-llama-cpp's addon sources, patched, plus ours.
  makeDirsSync(path.join(cacheRoot, "native"));
  const tmp = `${target}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    const src = path.join(tmp, "addon");
    fs.cpSync(path.join(nodeLlamaCppDir(), "llama", "addon"), src, { recursive: true });
    for (const f of OUR_SOURCES) if (f.endsWith(".cpp")) fs.copyFileSync(path.join(NATIVE_SOURCE_DIR, f), path.join(src, f));
    applyPatch(src, fs.readFileSync(path.join(NATIVE_SOURCE_DIR, "register.patch"), "utf8"));
    const sources = listFiles(src).filter((f) => f.endsWith(".cpp"));
    const flags = [
      "-O2", "-DNDEBUG", "-fPIC", "-std=c++17", "-fexceptions", "-pthread", "-DNAPI_VERSION=7", "-DNODE_GYP_MODULE_NAME=llama_addon", "-DBUILDING_NODE_EXTENSION",
      ...defines,
      `-I${src}`, `-I${addonApi}`, `-I${nodeHeaders}`,
      `-I${path.join(llama, "include")}`, `-I${path.join(llama, "common")}`, `-I${path.join(llama, "ggml", "include")}`, `-I${path.join(llama, "src")}`, `-I${llama}`, `-I${path.join(llama, "vendor")}`,
    ];
    const jobs = opts.jobs ?? os.availableParallelism();
    // Steps: each source, the link, the load check; numbered as they start, since one compile takes seconds.
    const steps = sources.length + (opts.verify !== false ? 2 : 1);
    let step = 0;
    const say = (what: string): void => log(`[${++step}/${steps}] ${what}`);
    log(`building Keel's addon once for ${binDir} (cached in ${path.join(cacheRoot, "native")} until Keel's or node-llama-cpp's native sources change): ${steps} steps (${sources.length} files with ${cxx}, ${jobs} at a time, then the link${opts.verify !== false ? " and a load check" : ""})`);
    const objects = sources.map((f) => path.join(tmp, "obj", f.replace(/[\\/]/g, "_") + ".o"));
    fs.mkdirSync(path.join(tmp, "obj"));
    await pool(sources.map((f, i) => () => (say(`compiling ${f}`), run(cxx, [...flags, "-c", path.join(src, f), "-o", objects[i]!]))), jobs);
    // 4. Link against the directory's own libraries; RUNPATH so they are found wherever the engine runs from.
    const out = path.join(tmp, "out");
    fs.mkdirSync(out);
    say(`linking ${ADDON_FILE}`);
    await run(cxx, [
      "-shared", "-pthread", "-o", path.join(out, ADDON_FILE), ...objects,
      ...libDirs.map((d) => `-L${d}`), ...links,
      "-Wl,--enable-new-dtags", `-Wl,-rpath,${libDirs.join(":")}`, `-Wl,-soname,${ADDON_FILE}`,
    ]);
    // 5. Smoke test in a child: the addon loads with its libraries and exports our function.
    if (opts.verify !== false) {
      say("loading it in a child process (a check)");
      const probe = `const m = require(${JSON.stringify(path.join(out, ADDON_FILE))}); if (typeof m.keelSampleTokens !== "function" || typeof m.keelDecodeBatch !== "function" || typeof m.keelSynchronize !== "function" || typeof m.keelSamplingCounts !== "function") { console.error("keelSampleTokens, keelDecodeBatch, keelSynchronize or keelSamplingCounts missing"); process.exit(1); }`;
      await run(process.execPath, ["-e", probe]).catch((err) => {
        throw new NativeBuildError(`the built addon does not load: ${(err as Error).message}`);
      });
    }
    const print = fingerprint(path.join(out, ADDON_FILE));
    fs.writeFileSync(path.join(out, "build.json"), JSON.stringify({ binDir, cxx, llamaSource: llama, nodeHeaders, links, ...print, builtAt: new Date().toISOString(), seconds: seconds() }, null, 2) + "\n");
    // 6. Publish: the first finished builder's rename wins.
    publish(out, target);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  if (!fs.existsSync(output)) throw new NativeBuildError(`build finished without ${output}`);
  return { path: output, cached: false, seconds: seconds() };
}
