/**
 * `mkdir -p` that cannot spin. Node 20's `mkdir(dir, { recursive: true })` (sync and async) loops for ever at full CPU
 * when a missing directory's parent answers ENOENT to a new entry although it exists, as /proc and /sys do: `--cache_dir
 * /proc/x` hung the OpenVINO engine's start silently (docs/upstream.md; pinned by make-dirs.test.ts). This walks up to
 * the first directory that exists and creates each missing one in turn, so such a path fails at once with the
 * first component's own error.
 */
import fs from "node:fs";
import path from "node:path";

/** Create `dir` and its missing parents; throws the first component's error (ENOENT, EACCES, ENOTDIR, …). */
export function makeDirsSync(dir: string): void {
  const missing: string[] = [];
  for (let cur = path.resolve(dir); !fs.existsSync(cur); ) {
    missing.push(cur);
    const up = path.dirname(cur);
    if (up === cur) break;
    cur = up;
  }
  for (const d of missing.reverse()) {
    try {
      fs.mkdirSync(d);
    } catch (err) {
      // Another process made it meanwhile: fine when it is a directory.
      if ((err as NodeJS.ErrnoException).code === "EEXIST" && fs.statSync(d).isDirectory()) continue;
      throw err;
    }
  }
}
