/**
 * Makes node-llama-cpp load Keel's addon (src/native/build.ts) instead of its own, for the very binary directory
 * node-llama-cpp chose.
 *
 * How (docs/upstream.md "Keel's addon"): node-llama-cpp's getLlama picks a binary (local build or prebuilt; CPU,
 * CUDA or Vulkan), tests it in a child process, then loads it in-process with `require(bindingPath)`, which Node
 * turns into `process.dlopen(module, bindingPath)`. While `getLlama` runs, this module wraps `process.dlopen`: when
 * the file is a `llama-addon.node` and Keel's addon was built for that file's directory, Node opens Keel's file
 * instead. node-llama-cpp keeps its own `bindingPath` (so it loads its ggml backends from its directory as before);
 * only the JS object of the bindings differs, by one extra function (`keelSampleTokens`). Nothing of node-llama-cpp's
 * internal path resolution is repeated here, so a change there cannot make Keel load a build for another directory.
 */
import path from "node:path";
import { ADDON_FILE, defaultCacheRoot, nativeAddonFor } from "./build.js";

/** Which addon node-llama-cpp runs on, and why (for `ready.backend.addon` and the one fallback log line). */
export type NativeAddonChoice =
  /** Keel's build (one synchronous call samples a step). */
  | { kind: "keel"; path: string; binDir: string }
  /** node-llama-cpp's own addon; `reason` says why Keel's was not used. */
  | { kind: "node-llama-cpp"; reason: string };

/** Options of {@link loadWithKeelAddon}. */
export interface LoadOptions {
  /** Environment (KEEL_NATIVE_SAMPLING=off forces node-llama-cpp's addon, for A/B runs). */
  env?: NodeJS.ProcessEnv;
  /** Keel's cache root (default: as the model cache). */
  cacheRoot?: string;
}

/**
 * KEEL_NATIVE_SAMPLING: unset, on, 1, true, yes → Keel's addon; off, 0, false, no → node-llama-cpp's; anything else is
 * "invalid" (node-llama-cpp's, with the value named in the fallback line: a typo must not pass unnoticed).
 */
export function nativeSamplingSwitch(value: string | undefined): "on" | "off" | "invalid" {
  const v = (value ?? "").trim().toLowerCase();
  if (v === "" || v === "on" || v === "1" || v === "true" || v === "yes") return "on";
  if (v === "off" || v === "0" || v === "false" || v === "no") return "off";
  return "invalid";
}

/**
 * KEEL_DECODE_OVERLAP (design.md, "Keel's native addon"): opt-in, so unset or empty is "off"; otherwise as
 * {@link nativeSamplingSwitch}. The CLI refuses "invalid" before any engine starts; the engine refuses it at load.
 */
export function decodeOverlapSwitch(value: string | undefined): "on" | "off" | "invalid" {
  return value === undefined || value.trim() === "" ? "off" : nativeSamplingSwitch(value);
}

/** Tail of the chain of {@link loadWithKeelAddon} calls: the dlopen hook is process-wide, so loads run one at a time. */
let queue: Promise<unknown> = Promise.resolve();

/**
 * Run `load` (a getLlama call) with node-llama-cpp's addon swapped for Keel's where one was built for the directory
 * it loads from. Concurrent calls run one after another (the hook is process-wide).
 */
export function loadWithKeelAddon<T>(load: () => Promise<T>, opts: LoadOptions = {}): Promise<{ value: T; addon: NativeAddonChoice }> {
  const run = queue.then(() => hooked(load, opts));
  queue = run.catch(() => undefined);
  return run;
}

async function hooked<T>(load: () => Promise<T>, opts: LoadOptions): Promise<{ value: T; addon: NativeAddonChoice }> {
  const env = opts.env ?? process.env;
  const switched = nativeSamplingSwitch(env["KEEL_NATIVE_SAMPLING"]);
  if (switched !== "on") {
    const reason = switched === "off" ? `KEEL_NATIVE_SAMPLING=${env["KEEL_NATIVE_SAMPLING"]}` : `KEEL_NATIVE_SAMPLING=${JSON.stringify(env["KEEL_NATIVE_SAMPLING"])} is not on/off (1/0, true/false, yes/no)`;
    return { value: await load(), addon: { kind: "node-llama-cpp", reason } };
  }
  const cacheRoot = opts.cacheRoot ?? defaultCacheRoot(env);
  let addon: NativeAddonChoice = { kind: "node-llama-cpp", reason: `node-llama-cpp loaded no ${ADDON_FILE}` };
  const original = process.dlopen;
  // 1. Swap the file name of every in-process addon load during getLlama (the last one is the one it keeps).
  process.dlopen = function keelDlopen(module: object, filename: string, flags?: number): void {
    if (path.basename(filename) === ADDON_FILE) {
      const binDir = path.dirname(filename);
      const found = nativeAddonFor(binDir, cacheRoot);
      if (found.path !== null) {
        try {
          flags === undefined ? original.call(process, module, found.path) : original.call(process, module, found.path, flags);
          addon = { kind: "keel", path: found.path, binDir };
          return;
        } catch (err) {
          // Keel's file would not load (it is checked against its build record, so this is rare): node-llama-cpp's own.
          addon = { kind: "node-llama-cpp", reason: `Keel's addon at ${found.path} failed to load: ${(err as Error).message.split("\n")[0]}` };
          return flags === undefined ? original.call(process, module, filename) : original.call(process, module, filename, flags);
        }
      }
      addon = { kind: "node-llama-cpp", reason: `Keel's addon is ${found.reason}` };
    }
    return flags === undefined ? original.call(process, module, filename) : original.call(process, module, filename, flags);
  };
  try {
    return { value: await load(), addon };
  } finally {
    // 2. Restore: nothing else in the process is affected after getLlama returns.
    process.dlopen = original;
  }
}
