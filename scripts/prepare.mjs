#!/usr/bin/env node
// Makes a fresh clone runnable: installs the locked dependencies when node_modules is missing or stale (for
// `npm run serve` without the dev tools; `npm test` adds them), compiles the TypeScript sources to dist/ when a source
// differs from the last build's, and generates the embedded tiny model; for the tests it also fetches the real test
// models into the model cache. Idempotent and quick when nothing changed. Uses only Node built-ins (it runs before
// dependencies exist). Outside `npm run serve` it also provides the
// OpenAI Python SDK that test/e2e/openai-python-sdk.test.ts drives the server with (a venv in .venv-test/).
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const run = (cmd, args) => execFileSync(cmd, args, { cwd: root, stdio: "inherit" });
const serving = process.env.npm_lifecycle_event === "serve";
const { BUILD_STAMP, INSTALL_STAMP, buildInputs, buildState, installState, lockHash, markBuilt, staleOutputs } = await import("./prepare-checks.mjs");

// 1. Dependencies: `npm ci` when the lockfile changed since the last install; serving needs no dev tools (the tests
//    add them). npm's progress is its own; the line says what it is and that it happens once.
const install = installState(root, { needDev: !serving });
const npmCi = (flavour, reason) => {
  console.error(`keel: installing dependencies once (npm ci${flavour === "serve" ? " --omit=dev" : ""}: ${reason}; a minute or two)…`);
  run(npm, ["ci", "--no-audit", "--no-fund", "--loglevel=error", flavour === "serve" ? "--omit=dev" : "--include=dev"]);
  fs.writeFileSync(path.join(root, INSTALL_STAMP), `${lockHash(root)} ${flavour}`);
};
if (install.action === "install") npmCi(install.flavour, install.reason);
else if (install.action === "adopt") fs.writeFileSync(path.join(root, INSTALL_STAMP), `${lockHash(root)} ${install.flavour}`);

/** Remove `rel` (a folder under dist/) and then its parents while they are empty, stopping at dist/. */
function removeEmptyDirs(rel) {
  for (let dir = rel; dir !== "dist" && dir.startsWith("dist") && fs.readdirSync(path.join(root, dir)).length === 0; dir = path.dirname(dir)) {
    fs.rmdirSync(path.join(root, dir));
  }
}

// 2. Build, unless dist/ was built from these sources and build configurations (`npm run build` always builds).
const build = buildState(root);
if (!build.current) {
  // TypeScript and @types/node are dependencies, since serving builds dist/. `--omit=optional` drops TypeScript's
  // native binary (an optional package): then npx runs the pinned version, leaving node_modules as it was installed.
  const tsc = path.join(root, "node_modules", "typescript", "bin", "tsc");
  const inputs = buildInputs(root);
  console.error(`keel: compiling dist/ (${build.reason}; again only when sources change)…`);
  const compileStart = Date.now();
  fs.rmSync(path.join(root, BUILD_STAMP), { force: true });
  const config = ["-p", path.join(root, "tsconfig.build.json")];
  // tsc has printed its errors: end with one line and its status, not a Node stack trace on top of them.
  const compile = (cmd, args, cwd) => {
    const r = spawnSync(cmd, args, { cwd, stdio: "inherit" });
    if (r.status !== 0) {
      console.error(`keel: compiling dist/ failed (${r.error ? r.error.message : `tsc exited with ${r.status ?? r.signal}`}); the errors are above`);
      process.exit(r.status ?? 1);
    }
  };
  if (spawnSync(process.execPath, [tsc, "--version"], { stdio: "ignore" }).status === 0) compile(process.execPath, [tsc, ...config], root);
  else {
    const version = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8")).dependencies.typescript;
    console.error(`keel: TypeScript does not run from node_modules (installed with --omit=optional?): running typescript@${version} with npx`);
    // From outside the repository: inside it npx would pick the broken local tsc again.
    compile(process.platform === "win32" ? "npx.cmd" : "npx", ["--yes", "--package", `typescript@${version}`, "--", "tsc", ...config], os.tmpdir());
  }
  // tsc leaves the outputs of deleted sources behind; an import of one would still load the old code. One that cannot
  // be removed is said, not fatal: it only matters if something imports it.
  for (const rel of staleOutputs(root)) {
    try {
      fs.unlinkSync(path.join(root, rel));
    } catch (err) {
      if (err.code !== "ENOENT") console.error(`keel: could not remove ${rel}, left from a deleted source (${err.code ?? err.message}); remove it by hand`);
      continue;
    }
    try {
      removeEmptyDirs(path.dirname(rel));
    } catch (err) {
      // Another build may be writing there, or the folder is not ours to remove: an empty folder harms nothing.
      if (err.code !== "ENOENT" && err.code !== "ENOTEMPTY") console.error(`keel: could not remove the emptied folder ${path.dirname(rel)} (${err.code ?? err.message})`);
    }
  }
  markBuilt(root, inputs);
  console.error(`keel: compiled dist/ in ${((Date.now() - compileStart) / 1000).toFixed(1)} s`);
}

// 2b. Keel's native addon (one synchronous call samples a whole step; src/native/build.ts) for the binary directories
//     node-llama-cpp loads here, into Keel's cache outside the repository: 25–80 s once per clone on 2 cores, then a cache hit.
//     Not fatal: without a compiler the engine runs node-llama-cpp's own addon and says so in one log line.
try {
  run(process.execPath, [path.join(root, "scripts", "build-native.mjs")]);
} catch {
  console.error("keel: Keel's native addon was not built (see above); the engine will use node-llama-cpp's own addon.");
}

// 3. The embedded default model (deterministic; generated once, safe under concurrent starts).
const { ensureDefaultModel } = await import(path.join(root, "dist", "model", "default-model.js"));
await ensureDefaultModel();

// 4. The OpenAI and Anthropic Python SDKs for the tests, in .venv-test (pins in test/e2e/python/requirements.txt). Not needed to
//    serve, so `npm run serve` skips it. Quick when present: only looks for the pinned packages' dist-info folders.
if (!serving) ensureTestVenv();

// 5. The real models of the real-model tests, in Keel's model cache outside the repository (keel fetch; see
//    docs/models.md). Quick when cached: a size check of files that were verified before they got their name.
//    `npm run serve` skips this: the server fetches its own default model on first start.
if (!serving) await fetchTestModels();

// 6. The OpenVINO engine's venv (pinned in src/engine-openvino/requirements.txt) for the suites that run on both
//    engines, in Keel's cache outside the repository. Quick when built (a stamp check). `npm run serve` skips it:
//    `keel serve --engine openvino` builds it on first use. Then the tiny hybrid IR the hybrid suites serve
//    (src/engine-openvino/hybrid-model.ts: its own ~1.4 GB venv, once; then a file check).
if (!serving) await ensureOpenvinoTestVenv();

// 7. A headless browser for the CORS test (test/e2e/security.test.ts drives a page on another origin): Debian's
//    chromium, installed with apt-get when missing (as root, the way CI and the developers' machines run).
if (!serving) ensureChromium();

function ensureChromium() {
  const found = (cmd) => {
    try {
      execFileSync("sh", ["-c", `command -v ${cmd}`], { stdio: "ignore" });
      return true;
    } catch {
      return false;
    }
  };
  if (found("chromium")) return;
  if (!found("apt-get") || process.getuid?.() !== 0) {
    console.error("keel: the CORS browser test needs chromium (Debian: apt-get install chromium); install it and run again.");
    process.exit(1);
  }
  console.error("keel: installing chromium for the CORS browser test (apt-get)…");
  try {
    execFileSync("apt-get", ["update", "-qq"], { stdio: "inherit" });
    execFileSync("apt-get", ["install", "-y", "-qq", "--no-install-recommends", "chromium"], { stdio: "inherit", env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" } });
  } catch {
    console.error("keel: apt-get could not install chromium; install it by hand (apt-get install chromium) and run again.");
    process.exit(1);
  }
}

async function ensureOpenvinoTestVenv() {
  const { ensureOpenvinoVenv } = await import(path.join(root, "dist", "engine-openvino", "venv.js"));
  try {
    const python = await ensureOpenvinoVenv({ log: (line) => console.error(`keel: ${line}`) });
    console.error(`keel: OpenVINO engine python: ${python}`);
  } catch (err) {
    console.error(`keel: cannot build the OpenVINO engine's venv: ${err.message}`);
    process.exit(1);
  }
  // The tiny hybrid (linear-attention) IR of the seed's model family, made offline in its own venv (issue 19).
  const { ensureHybridModel } = await import(path.join(root, "dist", "engine-openvino", "hybrid-model.js"));
  try {
    const started = Date.now();
    const dir = await ensureHybridModel({ log: (line) => console.error(`keel: ${line}`) });
    console.error(`keel: hybrid test model: ${dir} (${((Date.now() - started) / 1000).toFixed(0)} s)`);
  } catch (err) {
    console.error(`keel: cannot make the hybrid test model: ${err.message}`);
    process.exit(1);
  }
}

async function fetchTestModels() {
  const { fetchModel, modelCacheDir } = await import(path.join(root, "dist", "model", "model-cache.js"));
  const { progressSink } = await import(path.join(root, "dist", "model", "download-progress.js"));
  for (const name of ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]) {
    const started = Date.now();
    try {
      const log = (line) => console.error(`keel:   ${line}`);
      const got = await fetchModel(name, { log, progress: (label) => progressSink(process.stderr, log, label) });
      console.error(`keel: model ${name}: ${got.cached ? "cached" : `fetched in ${((Date.now() - started) / 1000).toFixed(0)} s`} (${got.path})`);
    } catch (err) {
      console.error(`keel: cannot fetch the test model ${name} into ${modelCacheDir()}: ${err.message}`);
      process.exit(1);
    }
  }
}

function ensureTestVenv() {
  const requirements = path.join(root, "test", "e2e", "python", "requirements.txt");
  const pins = fs
    .readFileSync(requirements, "utf8")
    .split("\n")
    .map((l) => l.replace(/#.*/, "").trim())
    .filter(Boolean)
    .map((l) => {
      const m = /^([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)$/.exec(l);
      if (!m) throw new Error(`${requirements}: expected "name==version" lines, got "${l}"`);
      return { name: m[1], version: m[2] };
    });
  const venv = path.join(root, ".venv-test");
  const python = path.join(venv, "bin", "python3");
  const distInfo = (name, version) => `${name.toLowerCase().replace(/[-.]+/g, "_")}-${version}.dist-info`;
  const installed = () => {
    const lib = path.join(venv, "lib");
    if (!fs.existsSync(python) || !fs.existsSync(lib)) return false;
    const sites = fs.readdirSync(lib).filter((d) => d.startsWith("python")).map((d) => path.join(lib, d, "site-packages"));
    return pins.every(({ name, version }) => sites.some((s) => fs.existsSync(path.join(s, distInfo(name, version)))));
  };
  if (installed()) return;
  console.error(`keel: installing the OpenAI Python SDK for the tests into .venv-test (${pins.map((p) => `${p.name}==${p.version}`).join(", ")})…`);
  try {
    execFileSync("python3", ["--version"], { cwd: root, stdio: "ignore" });
  } catch {
    console.error("keel: python3 was not found on PATH; the OpenAI Python SDK test (test/e2e/openai-python-sdk.test.ts) needs Python 3.10+ (openai 3.x) with its venv module. Install it and run again.");
    process.exit(1);
  }
  // A venv whose interpreter is gone (python3 moved or upgraded) is rebuilt from scratch.
  if (!fs.existsSync(python)) {
    try {
      run("python3", ["-m", "venv", "--clear", venv]);
    } catch {
      console.error("keel: `python3 -m venv .venv-test` failed; install Python's venv module (e.g. the python3-venv package) and run again.");
      process.exit(1);
    }
  }
  run(python, ["-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet", "-r", requirements]);
  if (!installed()) {
    console.error(`keel: pip finished but .venv-test still lacks ${pins.map((p) => `${p.name}==${p.version}`).join(", ")}`);
    process.exit(1);
  }
}
