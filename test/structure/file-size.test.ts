/**
 * No source file over ~450 lines (issue 18): a file that long holds more than one concern. Tests are exempt (a
 * suite reads as a list of cases); so are the files named below, each with why it is one table or one concern.
 */
import { readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const MAX_LINES = 450;

/** Files allowed past the limit, with the reason (keep it short: each is one table or one concern). */
const EXEMPT: Record<string, string> = {
  "src/gateway/http/errors.ts": "the catalogue of coded HTTP errors: one constructor per code, nothing else",
};

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
  it(`every source file under src/ has at most ${MAX_LINES} lines, except the named table-like ones`, () => {
    const long = sources(path.join(root, "src"))
      .map((f) => ({ file: path.relative(root, f), lines: lineCount(f) }))
      .filter((f) => f.lines > MAX_LINES && !(f.file in EXEMPT))
      .map((f) => `${f.file}: ${f.lines} lines`);
    expect(long).toEqual([]);
  });

  it("every exemption names a file that exists and is still over the limit", () => {
    for (const file of Object.keys(EXEMPT)) {
      expect(lineCount(path.join(root, file)), file).toBeGreaterThan(MAX_LINES);
    }
  });
});
