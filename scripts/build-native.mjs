#!/usr/bin/env node
// Builds Keel's native addon (node-llama-cpp's addon + src/native/keel-sampling.cpp: one synchronous call samples a
// whole step) against a node-llama-cpp binary directory, into Keel's cache (~/.cache/keel/native/<key>/); built once,
// reused after (src/native/build.ts). Needs dist/ (node scripts/prepare.mjs runs tsc first, then this).
//
//   node scripts/build-native.mjs                       # the directories getLlama loads for device cpu and auto
//   node scripts/build-native.mjs --bin-dir DIR [...]   # a given binary directory (CPU/CUDA prebuilt, a source build)
//   options: --jobs N (parallel compiles; default: all cores), --quiet
// Exit status 0 when every directory has a build; 1 when one could not be built (the engine then runs
// node-llama-cpp's own addon for it and says so in one log line).
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { buildNativeAddon, defaultCacheRoot, getLlamaBinDir } = await import(path.join(root, "dist", "native", "build.js"));
const { readBinDirs, writeBinDirs } = await import(path.join(root, "dist", "native", "bin-dirs.js"));

const args = process.argv.slice(2);
const binDirs = [];
let jobs;
let quiet = false;
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === "--bin-dir" && args[i + 1]) binDirs.push(path.resolve(args[++i]));
  else if (a === "--jobs" && args[i + 1]) jobs = Number(args[++i]);
  else if (a === "--quiet") quiet = true;
  else {
    console.error(`build-native: unknown argument ${a} (--bin-dir DIR, --jobs N, --quiet)`);
    process.exit(2);
  }
}
const log = (line) => quiet || console.error(`keel: native: ${line}`);

// 1. Default: the directories node-llama-cpp's getLlama loads its addon from (as the engine calls it), recorded
//    from the in-process addon load (the same hook point as src/native/loader.ts). Asking getLlama loads
//    node-llama-cpp twice (≈1.5 s), so the answer is remembered per install and machine (src/native/bin-dirs.ts).
if (binDirs.length === 0) {
  const remembered = readBinDirs(defaultCacheRoot());
  if (remembered !== null) binDirs.push(...remembered);
  else {
    for (const gpu of [false, "auto"]) {
      const dir = await getLlamaBinDir(gpu);
      if (dir === null) log(`getLlama({ gpu: ${JSON.stringify(gpu)} }) loads no addon here`);
      else if (!binDirs.includes(dir)) binDirs.push(dir);
    }
    if (binDirs.length > 0) writeBinDirs(defaultCacheRoot(), binDirs);
  }
}

// 2. Build (or find) each.
let failed = 0;
for (const binDir of binDirs) {
  try {
    const r = await buildNativeAddon({ binDir, log, ...(jobs ? { jobs } : {}) });
    log(`${r.cached ? "cached" : `built in ${r.seconds.toFixed(1)} s`}: ${r.path} (for ${binDir})`);
  } catch (err) {
    failed++;
    console.error(`keel: native: cannot build Keel's addon for ${binDir}: ${err.message}`);
  }
}
process.exit(failed > 0 ? 1 : 0);
