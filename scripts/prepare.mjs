#!/usr/bin/env node
// Makes a fresh clone runnable: installs the locked dependencies when node_modules is missing or stale, compiles
// the TypeScript sources to dist/, and generates the embedded default model. Idempotent and quick when nothing
// changed. Uses only Node built-ins (it runs before dependencies exist).
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const run = (cmd, args) => execFileSync(cmd, args, { cwd: root, stdio: "inherit" });

// 1. Dependencies: `npm ci` when the lockfile changed since the last install.
const lockHash = createHash("sha256").update(fs.readFileSync(path.join(root, "package-lock.json"))).digest("hex");
const stamp = path.join(root, "node_modules", ".keel-lock-hash");
if (!fs.existsSync(stamp) || fs.readFileSync(stamp, "utf8") !== lockHash) {
  console.error("keel: installing dependencies (npm ci)…");
  run(npm, ["ci", "--no-audit", "--no-fund", "--loglevel=error"]);
  fs.writeFileSync(stamp, lockHash);
}

// 2. Build.
run(process.execPath, [path.join(root, "node_modules", "typescript", "bin", "tsc"), "-p", path.join(root, "tsconfig.build.json")]);

// 3. The embedded default model (deterministic; generated once, safe under concurrent starts).
const { ensureDefaultModel } = await import(path.join(root, "dist", "model", "default-model.js"));
await ensureDefaultModel();
