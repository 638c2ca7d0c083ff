/**
 * Which binary directories node-llama-cpp's getLlama loads its addon from on this machine (for device cpu and auto),
 * remembered in Keel's cache so that a warm start checks Keel's addon without loading node-llama-cpp twice (≈1.5 s on
 * 2 cores). The record is keyed by what decides getLlama's choice: node-llama-cpp's install (path, version), the
 * prebuilt packages installed beside it, Node's ABI and platform, and which GPU device nodes exist; any change there
 * asks getLlama again. A machine whose GPU driver changed without a new device node keeps its old record: the engine
 * then names the directory it loads and how to build for it (src/native/build.ts nativeAddonFor).
 *
 * @module
 */
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { nodeLlamaCppDir } from "./build.js";
import { makeDirsSync } from "../model/make-dirs.js";

/** Device nodes whose presence can change getLlama's GPU choice (NVIDIA, DRM/Vulkan, AMD ROCm). */
const GPU_DEVICE_NODES = ["/dev/nvidiactl", "/dev/dri", "/dev/kfd"];

/** The key of the record for this machine and install (hex). */
export function binDirsKey(): string {
  const nlc = fs.realpathSync(nodeLlamaCppDir());
  const scope = path.join(path.dirname(nlc), "@node-llama-cpp");
  const prebuilt = fs.existsSync(scope) ? fs.readdirSync(scope).sort() : [];
  const version = (dir: string): string => {
    try {
      return (JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")) as { version?: string }).version ?? "?";
    } catch {
      return "?";
    }
  };
  const parts = [
    `node-llama-cpp ${nlc} ${version(nlc)}`,
    ...prebuilt.map((p) => `prebuilt ${p} ${version(path.join(scope, p))}`),
    `node ${process.versions.modules} ${process.platform} ${process.arch}`,
    ...GPU_DEVICE_NODES.map((d) => `${d} ${fs.existsSync(d)}`),
  ];
  return createHash("sha256").update(parts.join("\n")).digest("hex").slice(0, 24);
}

/** The record's file for `key` in `cacheRoot`. */
function recordFile(cacheRoot: string, key: string): string {
  return path.join(cacheRoot, "native", `bin-dirs-${key}.json`);
}

/** The remembered directories for `key`, or null when there is no record or one of them is gone. */
export function readBinDirs(cacheRoot: string, key: string = binDirsKey()): string[] | null {
  let dirs: unknown;
  try {
    dirs = JSON.parse(fs.readFileSync(recordFile(cacheRoot, key), "utf8"));
  } catch {
    return null;
  }
  if (!Array.isArray(dirs) || !dirs.every((d) => typeof d === "string" && fs.existsSync(d))) return null;
  return dirs as string[];
}

/** Remember `dirs` for `key` (written whole, then renamed: a concurrent reader never sees half a record). */
export function writeBinDirs(cacheRoot: string, dirs: string[], key: string = binDirsKey()): void {
  const file = recordFile(cacheRoot, key);
  makeDirsSync(path.dirname(file));
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, JSON.stringify(dirs) + "\n");
  fs.renameSync(tmp, file);
}
