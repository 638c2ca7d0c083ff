/**
 * No import cycle in Keel's modules. dependency-cruiser reads JavaScript (TypeScript 7 has no JS API for it to read
 * the sources with), so the sources are compiled into a fresh folder first — never a stale dist/, and the dist/ that
 * end-to-end tests run is left alone. node_modules is not followed: only Keel's own graph is checked.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { cruise, type ICruiseResult } from "dependency-cruiser";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

const out = fs.mkdtempSync(path.join(os.tmpdir(), "keel-structure-"));
let result: ICruiseResult;

beforeAll(async () => {
  const tsc = path.join(ROOT, "node_modules", "typescript", "bin", "tsc");
  execFileSync(process.execPath, [tsc, "-p", path.join(ROOT, "tsconfig.build.json"), "--outDir", out, "--sourceMap", "false"], { cwd: ROOT, stdio: "pipe" });
  const cruised = await cruise(["."], {
    baseDir: out,
    doNotFollow: { path: "node_modules" },
    validate: true,
    ruleSet: { forbidden: [{ name: "no-circular", severity: "error", from: {}, to: { circular: true } }] },
  });
  result = cruised.output as ICruiseResult;
});
afterAll(() => fs.rmSync(out, { recursive: true, force: true }));

describe("the module graph", () => {
  it("covers the compiled sources (a cruise that found nothing would pass vacuously)", () => {
    const compiled = (fs.readdirSync(out, { recursive: true }) as string[]).filter((f) => f.endsWith(".js")).map((f) => f.split(path.sep).join("/"));
    const modules = new Set(result.modules.map((m) => m.source));
    expect(compiled).toContain("cli.js");
    expect(compiled).toContain("engine/main.js");
    expect(compiled.filter((f) => !modules.has(f))).toEqual([]);
  });

  it("has no import cycle", () => {
    const cycles = result.summary.violations
      .filter((v) => v.rule.name === "no-circular")
      .map((v) => [v.from, ...(v.cycle ?? []).map((c) => c.name)].join(" -> "));
    expect(cycles).toEqual([]);
  });
});
