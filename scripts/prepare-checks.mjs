// What scripts/prepare.mjs decides before doing anything slow: whether node_modules holds the locked dependencies
// (and the dev tools when the tests need them), and whether dist/ was built from the TypeScript build's inputs as they are.
// Node built-ins only: it runs before the dependencies exist.
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";

/** The stamp prepare.mjs writes after an install: the lockfile's sha256 and the flavour ("full" or "serve"). */
export const INSTALL_STAMP = path.join("node_modules", ".keel-lock-hash");

/** The stamp of the last build: the content hash of every input it compiled. */
export const BUILD_STAMP = path.join("dist", ".keel-build.json");

/** The build's configuration files: a change in them rebuilds everything. */
const BUILD_CONFIGS = ["tsconfig.json", "tsconfig.build.json", "package-lock.json"];

/** sha256 of the lockfile, hex. */
export function lockHash(root) {
  return createHash("sha256").update(fs.readFileSync(path.join(root, "package-lock.json"))).digest("hex");
}

/**
 * What to do about node_modules: "ok" (installed from this lockfile, with the dev tools if `needDev`), "adopt" (npm
 * installed it from this lockfile without us, e.g. `npm ci --omit=dev` by hand: write the stamp, install nothing) or
 * "install" (run npm ci), with the flavour the stamp is to say and why.
 * @param {string} root
 * @param {{ needDev: boolean }} opts
 * @returns {{ action: "ok" | "adopt" | "install", flavour: "full" | "serve", reason: string }}
 */
export function installState(root, { needDev }) {
  const hash = lockHash(root);
  const hasDev = fs.existsSync(path.join(root, "node_modules", "vitest", "package.json"));
  const flavour = hasDev ? "full" : "serve";
  const stampFile = path.join(root, INSTALL_STAMP);
  // A stamp of an older prepare.mjs is the hash alone, of a full install.
  const [stampHash, stampFlavour = "full"] = fs.existsSync(stampFile) ? fs.readFileSync(stampFile, "utf8").trim().split(" ") : [];
  if (stampHash === hash) {
    if (needDev && !(stampFlavour === "full" && hasDev)) return { action: "install", flavour: "full", reason: "the tests need the dev dependencies" };
    return { action: "ok", flavour: stampFlavour, reason: "installed from this lockfile" };
  }
  // npm's own record of its last install (node_modules/.package-lock.json) newer than the lockfile: it installed this one.
  const hidden = path.join(root, "node_modules", ".package-lock.json");
  const lock = path.join(root, "package-lock.json");
  if (stampHash === undefined && fs.existsSync(hidden) && fs.statSync(hidden).mtimeMs >= fs.statSync(lock).mtimeMs && (hasDev || !needDev)) {
    return { action: "adopt", flavour, reason: "npm installed this lockfile" };
  }
  return { action: "install", flavour: needDev ? "full" : "serve", reason: stampHash === undefined ? "node_modules is missing or was not installed from this lockfile" : "the lockfile changed since the last install" };
}

/** Every input file of the TypeScript build: the sources tsconfig.build.json compiles (src/, tests excluded), relative to root. */
export function buildSources(root) {
  const out = [];
  const walk = (rel) => {
    for (const e of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const p = path.join(rel, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.(ts|mts|cts|tsx)$/.test(e.name) && !/\.test\.ts$/.test(e.name)) out.push(p);
    }
  };
  walk("src");
  return out.sort();
}

/** Where tsc writes the JavaScript of source `rel` (src/a/b.ts → dist/a/b.js); null for a declaration file. */
function outputOf(rel) {
  if (/\.d\.(m|c)?ts$/.test(rel)) return null;
  const ext = path.extname(rel);
  return path.join("dist", path.relative("src", rel.slice(0, -ext.length) + ({ ".mts": ".mjs", ".cts": ".cjs" }[ext] ?? ".js")));
}

/** sha256 of a file's bytes, hex; null when it does not exist. */
function fileHash(file) {
  try {
    return createHash("sha256").update(fs.readFileSync(file)).digest("hex");
  } catch {
    return null;
  }
}

/**
 * The build's inputs as they are now: every source and build configuration by its content's sha256 (not its time: a
 * file put back from a copy, or touched into the past, is still a change). About 30 ms for Keel's sources.
 * @returns {Record<string, string | null>}
 */
export function buildInputs(root) {
  return Object.fromEntries([...buildSources(root), ...BUILD_CONFIGS].map((rel) => [rel, fileHash(path.join(root, rel))]));
}

/**
 * Whether dist/ is current: the last build's stamp is there, it compiled the same sources with the same contents
 * and build configurations, and every output is there.
 * @returns {{ current: boolean, reason: string }}
 */
export function buildState(root) {
  let stamp;
  try {
    stamp = JSON.parse(fs.readFileSync(path.join(root, BUILD_STAMP), "utf8"));
  } catch {
    return { current: false, reason: "no record of a build in dist/" };
  }
  if (typeof stamp.inputs !== "object" || stamp.inputs === null) return { current: false, reason: "no record of a build in dist/" };
  const now = buildInputs(root);
  const built = stamp.inputs;
  const sources = buildSources(root);
  if (sources.some((rel) => !(rel in built)) || Object.keys(built).some((rel) => !(rel in now))) return { current: false, reason: "sources were added, removed or renamed" };
  for (const [rel, hash] of Object.entries(now)) {
    if (built[rel] !== hash) return { current: false, reason: `${rel} changed since the last build` };
  }
  for (const rel of sources) {
    const out = outputOf(rel);
    if (out !== null && !fs.existsSync(path.join(root, out))) return { current: false, reason: `${out} is missing` };
  }
  return { current: true, reason: "dist/ was built from these sources" };
}

/**
 * Files tsc wrote for sources that are gone (src/a.ts deleted or renamed leaves dist/a.js and its map): relative to
 * root, sorted. tsc never deletes outputs, and a stale module would still load for an import that names it.
 * @returns {string[]}
 */
export function staleOutputs(root) {
  const live = new Set(buildSources(root).map(outputOf).filter((o) => o !== null));
  const out = [];
  const walk = (rel) => {
    let entries;
    try {
      entries = fs.readdirSync(path.join(root, rel), { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      const p = path.join(rel, e.name);
      if (e.isDirectory()) walk(p);
      else {
        const js = p.replace(/\.map$/, "");
        if (/\.(c|m)?js$/.test(js) && !live.has(js)) out.push(p);
      }
    }
  };
  walk("dist");
  return out.sort();
}

/** Record a build of `inputs` (buildInputs taken before tsc ran, so an edit during it counts as a change). */
export function markBuilt(root, inputs) {
  fs.writeFileSync(path.join(root, BUILD_STAMP), JSON.stringify({ inputs }) + "\n");
}
