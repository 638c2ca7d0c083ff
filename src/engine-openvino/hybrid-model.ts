/**
 * keel-hybrid-tiny: a tiny random-weight hybrid model (Gated DeltaNet linear-attention layers + full-attention
 * layers, the Qwen3.5/3.6 family the seed's deployment serves) as an OpenVINO IR, made offline and cached.
 *
 * Made by `make_hybrid.py` in a model-making venv (`make-requirements.txt`: torch CPU, transformers, optimum-intel;
 * ~1.4 GB, built once), into `<cache>/openvino/keel-hybrid-tiny-<hash>` where the hash covers the script and the lock,
 * so a change to either makes a new model instead of reusing a stale one. Two concurrent callers build it once.
 *
 * @module
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { acquireLock, keelCacheRoot } from "../model/model-cache.js";
import { OPENVINO_WORKER, ensureOpenvinoVenv } from "./venv.js";
import { makeDirsSync } from "../model/make-dirs.js";

const SRC_DIR = path.dirname(OPENVINO_WORKER);
/** The script that writes the IR (`python make_hybrid.py OUT_DIR`). */
export const MAKE_HYBRID_SCRIPT = path.join(SRC_DIR, "make_hybrid.py");
/** The complete lock of the model-making venv. */
export const MAKE_REQUIREMENTS = path.join(SRC_DIR, "make-requirements.txt");
/** The model's name (the folder's prefix, and what `/v1/models` lists when it is served by path). */
export const HYBRID_MODEL_NAME = "keel-hybrid-tiny";

/** Where the IR for the current script and lock lives. */
export function hybridModelDir(env: NodeJS.ProcessEnv = process.env): string {
  const hash = createHash("sha256").update(readFileSync(MAKE_HYBRID_SCRIPT)).update(readFileSync(MAKE_REQUIREMENTS)).digest("hex").slice(0, 12);
  return path.join(keelCacheRoot(env), "openvino", `${HYBRID_MODEL_NAME}-${hash}`);
}

/** A folder the script finished: it renames the IR into place last, so the model file means complete. */
function isComplete(dir: string): boolean {
  return existsSync(path.join(dir, "openvino_model.xml")) && existsSync(path.join(dir, "openvino_detokenizer.xml"));
}

/**
 * The IR folder, made first when missing (first time: the venv ~1 min from the machine's wheels plus ~20 s export).
 * @throws Error naming the command that failed and the last lines it printed
 */
export async function ensureHybridModel(opts: { log?: (line: string) => void; env?: NodeJS.ProcessEnv } = {}): Promise<string> {
  const env = opts.env ?? process.env;
  const log = opts.log ?? (() => undefined);
  const dir = hybridModelDir(env);
  if (isComplete(dir)) return dir;
  makeDirsSync(path.dirname(dir));
  const release = await acquireLock(`${dir}.lock`, 500, (pid) => log(`waiting for process ${pid}, which is making ${dir}`));
  try {
    if (isComplete(dir)) return dir;
    const python = await ensureOpenvinoVenv({ env, log, requirements: MAKE_REQUIREMENTS, noDeps: true, overrideVar: "KEEL_MAKE_MODEL_PYTHON", sizeHint: "~1.4 GB" });
    const started = Date.now();
    log(`making ${HYBRID_MODEL_NAME} (random weights, OpenVINO IR) in ${dir}…`);
    await runScript(python, [MAKE_HYBRID_SCRIPT, dir]);
    log(`made ${HYBRID_MODEL_NAME} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
    return dir;
  } finally {
    await release();
  }
}

function runScript(python: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(python, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, HF_HUB_OFFLINE: "1" } });
    let out = "";
    const keep = (d: Buffer): void => {
      out = (out + d.toString("utf8")).slice(-8192);
    };
    child.stdout!.on("data", keep);
    child.stderr!.on("data", keep);
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`${python} ${args.join(" ")} exited with ${code}: ${out.trim().split("\n").slice(-8).join("\n")}`))));
  });
}
