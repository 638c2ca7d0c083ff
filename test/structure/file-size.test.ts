/**
 * No source file over ~450 lines (issue 18): a file that long holds more than one concern. Tests are exempt (a
 * suite reads as a list of cases).
 */
import { readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const MAX_LINES = 450;

/** Lines as `wc -l` counts them. */
function lineCount(file: string): number {
  return readFileSync(file, "utf8").split("\n").length - 1;
}

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const p = path.join(dir, name);
    if (statSync(p).isDirectory()) {
      if (name !== "__pycache__") out.push(...sources(p));
    } else if (/\.(ts|mjs|py|cpp)$/.test(name) && !/\.test\.ts$/.test(name)) out.push(p);
  }
  return out;
}

describe("source file size", () => {
  it(`every source file under src/ has at most ${MAX_LINES} lines`, () => {
    const long = sources(path.join(root, "src"))
      .map((f) => ({ file: path.relative(root, f), lines: lineCount(f) }))
      .filter((f) => f.lines > MAX_LINES)
      .map((f) => `${f.file}: ${f.lines} lines`);
    expect(long).toEqual([]);
  });
});
