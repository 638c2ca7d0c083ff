/**
 * Passed model checks, remembered in Keel's cache so that a warm start does not load the model twice (the check's
 * throwaway load was half of a warm `npm run serve`). A record is keyed by everything the verdict depends on: the
 * model file (real path, size, modification time, inode), the check's engine configuration and command, and the
 * native install it ran on (binDirsKey: node-llama-cpp's install and version, its prebuilt packages, Node's ABI, the
 * GPU device nodes) and the addon it ran (KEEL_NATIVE_SAMPLING). Any change there checks again. Only a passed check of a model file is remembered: a failure is
 * never cached, and an OpenVINO model folder is always checked.
 *
 * `KEEL_MODEL_CHECK_CACHE=off` (or 0, false, no) checks every time (the test suites set it; docs/flags.md); a value
 * that is not on/off is refused at start (cli/engine-choice.ts).
 *
 * @module
 */
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { binDirsKey } from "../native/bin-dirs.js";
import { nativeSamplingSwitch } from "../native/loader.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";
import type { EngineBackend, ModelMetadata } from "../protocol/messages.js";
import { makeDirsSync } from "../model/make-dirs.js";

/** What a passed check returns (and a record holds). */
export type CheckResult = ModelMetadata & { backend?: EngineBackend };

/** The record's key for this check, or null when it is not remembered (a folder, an unreadable path, switched off). */
export function checkKey(config: Omit<EngineConfig, "mode">, command: EngineCommand, env: NodeJS.ProcessEnv = process.env): string | null {
  if (nativeSamplingSwitch(env["KEEL_MODEL_CHECK_CACHE"]) !== "on") return null;
  let file: string;
  let stat: fs.Stats;
  try {
    file = fs.realpathSync(config.modelPath);
    stat = fs.statSync(file);
  } catch {
    return null;
  }
  if (!stat.isFile()) return null;
  let native: string;
  try {
    native = binDirsKey();
  } catch {
    return null;
  }
  // Which addon the engine runs (KEEL_NATIVE_SAMPLING) decides what it can apply, e.g. a shared KV buffer.
  const addon = nativeSamplingSwitch(env["KEEL_NATIVE_SAMPLING"]);
  const parts = [file, stat.size, stat.mtimeMs, stat.ino, JSON.stringify(config), JSON.stringify(command), native, addon];
  return createHash("sha256").update(parts.join("\n")).digest("hex").slice(0, 32);
}

/** The record's file for `key` under `cacheRoot`. */
function recordFile(cacheRoot: string, key: string): string {
  return path.join(cacheRoot, "checks", `${key}.json`);
}

/** The remembered result of a passed check, or null. */
export function readCheck(cacheRoot: string, key: string): CheckResult | null {
  try {
    const r = JSON.parse(fs.readFileSync(recordFile(cacheRoot, key), "utf8")) as { result?: CheckResult };
    return r.result && typeof r.result === "object" ? r.result : null;
  } catch {
    return null;
  }
}

/** Remember a passed check (written whole under a temporary name, then renamed: a reader never sees half a record). */
export function writeCheck(cacheRoot: string, key: string, modelPath: string, result: CheckResult): void {
  try {
    const file = recordFile(cacheRoot, key);
    makeDirsSync(path.dirname(file));
    const tmp = `${file}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, JSON.stringify({ modelPath, checkedAt: new Date().toISOString(), result }) + "\n");
    fs.renameSync(tmp, file);
  } catch {
    // A cache that cannot be written only costs the next start its check.
  }
}
