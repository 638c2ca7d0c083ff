/**
 * The OpenVINO engine's Python environment: a venv with the pinned packages of `requirements.txt` (next to the
 * worker), kept in Keel's cache outside the repository, and the command that runs the worker in it.
 *
 * Where: `<cache>/venvs/openvino-<first 12 hex of sha256(requirements.txt)>`, `<cache>` being `$KEEL_CACHE_DIR`, else
 * `$XDG_CACHE_HOME/keel`, else `~/.cache/keel` (the model cache's parent). A change of pins is a new directory, so an
 * old venv is never half-upgraded. Venvs are not relocatable (their scripts name their own path), so the venv is
 * built in place, under a lock file, and a completion stamp is written last: a directory without the stamp is a
 * build that died half-way and is removed and built again. `KEEL_OPENVINO_PYTHON` names a python to use as is.
 *
 * @module
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { acquireLock, keelCacheRoot } from "../model/model-cache.js";
import type { EngineCommand } from "../protocol/engine-config.js";
import { makeDirsSync } from "../model/make-dirs.js";

/**
 * This package's `src/engine-openvino/` directory. The module runs from `src/engine-openvino/` (tests) or
 * `dist/engine-openvino/` (built); both sit two levels under the package root, and the Python files are only in src/.
 */
const OPENVINO_SRC_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "src", "engine-openvino");

/** The Python worker that speaks docs/protocol.md on fd 3 (absolute path). */
export const OPENVINO_WORKER = path.join(OPENVINO_SRC_DIR, "worker.py");

/** The pinned requirements of the venv (absolute path). */
export const OPENVINO_REQUIREMENTS = path.join(OPENVINO_SRC_DIR, "requirements.txt");

/** Name of the file written last into a complete venv (holds the requirements' hash). */
export const VENV_STAMP = ".keel-venv-complete";

/** Lines of a failed command's output quoted in the error. */
const TAIL_LINES = 8;

/** How the venv is found or built; every field but `log` is for tests. */
export interface OpenvinoVenvOptions {
  /** Progress lines (building, waiting for another process's build). */
  log?: (line: string) => void;
  /** Environment read for KEEL_OPENVINO_PYTHON, KEEL_CACHE_DIR, XDG_CACHE_HOME (default: process.env). */
  env?: NodeJS.ProcessEnv;
  /** The python that creates the venv (default `python3` on PATH). */
  python3?: string;
  /** Requirements file (default {@link OPENVINO_REQUIREMENTS}). */
  requirements?: string;
  /** Milliseconds between looks at another process's lock (default 500). */
  lockPollMs?: number;
  /** The requirements are a complete lock (every package pinned): install them with `--no-deps`. */
  noDeps?: boolean;
  /** The variable naming a python to use as is (default KEEL_OPENVINO_PYTHON). */
  overrideVar?: string;
  /** Size said in the progress line (default "~300 MB"). */
  sizeHint?: string;
}

/** A venv that could not be built: what was run and how it ended. */
export class OpenvinoVenvError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "OpenvinoVenvError";
  }
}

/** Where the venv for `requirements` lives (its directory; the python is `bin/python` in it). */
export function openvinoVenvDir(requirements: string = OPENVINO_REQUIREMENTS, env: NodeJS.ProcessEnv = process.env): string {
  const hash = createHash("sha256").update(readFileSync(requirements)).digest("hex").slice(0, 12);
  return path.join(keelCacheRoot(env), "venvs", `openvino-${hash}`);
}

/**
 * The python of the OpenVINO engine's venv, built first when it is missing or incomplete. Quick when present (the
 * stamp is checked, nothing runs). Two concurrent calls (two processes, or two starts in one) build it once.
 * @throws OpenvinoVenvError naming the command that failed and the last lines it printed
 */
export async function ensureOpenvinoVenv(opts: OpenvinoVenvOptions = {}): Promise<string> {
  const env = opts.env ?? process.env;
  const log = opts.log ?? (() => undefined);
  // 1. An operator's python wins, used as is (it must have the requirements installed).
  const override = env[opts.overrideVar ?? "KEEL_OPENVINO_PYTHON"];
  if (override) return override;
  const requirements = opts.requirements ?? OPENVINO_REQUIREMENTS;
  const dir = openvinoVenvDir(requirements, env);
  const python = path.join(dir, "bin", "python");
  // 2. Complete already: the stamp is written last, so its presence means every package was installed.
  if (isComplete(dir, python)) return python;
  // 3. Build under the lock: one builder, the others wait and then find the stamp.
  makeDirsSync(path.dirname(dir));
  const release = await acquireLock(`${dir}.lock`, opts.lockPollMs ?? 500, (pid) => log(`waiting for process ${pid}, which is building the OpenVINO venv ${dir}`));
  try {
    if (isComplete(dir, python)) return python;
    if (existsSync(dir)) {
      log(`removing the incomplete OpenVINO venv ${dir} (a build that did not finish)`);
      await rm(dir, { recursive: true, force: true });
    }
    const started = Date.now();
    log(`building the OpenVINO venv ${dir} (pinned in ${requirements}; once, ${opts.sizeHint ?? "~300 MB"})…`);
    const python3 = opts.python3 ?? "python3";
    await runStep(python3, ["-m", "venv", dir], `${python3} was not found on PATH; the OpenVINO engine needs Python 3.10+ with its venv module (or set KEEL_OPENVINO_PYTHON to a python that has ${requirements} installed)`);
    const pipArgs = ["-m", "pip", "install", "--disable-pip-version-check", "--no-input", ...(opts.noDeps ? ["--no-deps"] : []), "-r", requirements];
    await runStep(python, pipArgs, `the venv ${dir} has no ${python}`);
    // 4. The stamp last, atomically: a crash before this line leaves a directory that the next start rebuilds.
    const tmp = path.join(dir, `${VENV_STAMP}.tmp`);
    await writeFile(tmp, `${path.basename(dir)}\n`);
    await rename(tmp, path.join(dir, VENV_STAMP));
    log(`built the OpenVINO venv in ${((Date.now() - started) / 1000).toFixed(0)} s: ${python}`);
    return python;
  } finally {
    await release();
  }
}

/** The worker run by `python` (the absolute path of worker.py, whether Keel runs from dist/ or src/). */
export function openvinoEngineCommand(python: string): EngineCommand {
  return { command: python, args: [OPENVINO_WORKER] };
}

/** A venv directory whose stamp and python are both there. */
function isComplete(dir: string, python: string): boolean {
  return existsSync(path.join(dir, VENV_STAMP)) && existsSync(python);
}

/**
 * Run one build step; resolves when it exits 0.
 * @param missing the message when the command itself cannot be started (ENOENT)
 * @throws OpenvinoVenvError with the command line and the last lines of its output
 */
function runStep(command: string, args: string[], missing: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    // Only the tail is ever quoted: keep the buffer bounded (pip prints a line per package).
    const keep = (d: Buffer): void => {
      out = (out + d.toString("utf8")).slice(-16_384);
    };
    child.stdout!.on("data", keep);
    child.stderr!.on("data", keep);
    child.on("error", (err: NodeJS.ErrnoException) => reject(new OpenvinoVenvError(err.code === "ENOENT" ? missing : `${command} ${args.join(" ")} could not start: ${err.message}`)));
    child.on("close", (code, signal) => {
      if (code === 0) return resolve();
      const tail = out.trim().split("\n").slice(-TAIL_LINES).join("\n");
      reject(new OpenvinoVenvError(`building the OpenVINO venv failed: \`${command} ${args.join(" ")}\` ${signal ? `was killed by ${signal}` : `exited with code ${code}`}${tail ? `; its last lines:\n${tail}` : " without output"}`));
    });
  });
}
