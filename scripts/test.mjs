#!/usr/bin/env node
// Runs every test suite once and fails on any failed, skipped or todo test, or when no test ran at all.
// Prints a closing line "N passed, N failed, N skipped".
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const out = path.join(root, ".test-results", "vitest.json");
fs.rmSync(out, { force: true });
const vitest = path.join(root, "node_modules", "vitest", "vitest.mjs");
const r = spawnSync(process.execPath, [vitest, "run", "--reporter=default", "--reporter=json", `--outputFile=${out}`, ...process.argv.slice(2)], {
  cwd: root,
  stdio: "inherit",
  env: { ...process.env, NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ""} --unhandled-rejections=strict`.trim() },
});
let passed = 0, failed = 0, skipped = 0;
if (fs.existsSync(out)) {
  const report = JSON.parse(fs.readFileSync(out, "utf8"));
  passed = report.numPassedTests;
  failed = report.numFailedTests;
  skipped = report.numPendingTests + report.numTodoTests;
}
console.log(`${passed} passed, ${failed} failed, ${skipped} skipped`);
if (r.status !== 0) process.exit(r.status ?? 1);
if (passed === 0) { console.error("test: no test ran"); process.exit(1); }
if (failed > 0 || skipped > 0) { console.error("test: skipped or failed tests are not allowed"); process.exit(1); }
