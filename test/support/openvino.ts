/**
 * Test support for the OpenVINO engine: the Python interpreter of its venv, and running Python scripts with it.
 */
import { spawn } from "node:child_process";
import path from "node:path";
import { ensureOpenvinoVenv } from "../../src/engine-openvino/venv.js";
import { ROOT } from "./server.js";

/** src/engine-openvino/prep.py: model preparation (CLI: `prep.py MODEL_PATH CACHE_DIR` prints the path to load). */
export const PREP_SCRIPT = path.join(ROOT, "src", "engine-openvino", "prep.py");
/** test/support/openvino_check.py: loads/generates/compares models for the tests (subcommands print one JSON line). */
export const CHECK_SCRIPT = path.join(ROOT, "test", "support", "openvino_check.py");
/** test/support/synthetic_gguf.py: writes small random GGUFs with matrices in a chosen tensor type. */
export const SYNTHETIC_GGUF_SCRIPT = path.join(ROOT, "test", "support", "synthetic_gguf.py");

/** The Python of the OpenVINO engine's venv: `$KEEL_OPENVINO_PYTHON`, else the venv ensureOpenvinoVenv builds. */
export async function openvinoPython(): Promise<string> {
  return process.env["KEEL_OPENVINO_PYTHON"] || (await ensureOpenvinoVenv());
}

/** What a finished Python process said. */
export interface PythonRun {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `python args…` with the OpenVINO venv's Python; resolves when it exits (never rejects on a non-zero status). */
export async function runPython(args: string[], env: Record<string, string> = {}): Promise<PythonRun> {
  const python = await openvinoPython();
  return new Promise((resolve, reject) => {
    const proc = spawn(python, args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
    let stdout = "";
    let stderr = "";
    proc.stdout.on("data", (d: Buffer) => (stdout += d.toString("utf8")));
    proc.stderr.on("data", (d: Buffer) => (stderr += d.toString("utf8")));
    proc.once("error", reject);
    proc.once("close", (status) => resolve({ status, stdout, stderr }));
  });
}

/** Runs a test/support/openvino_check.py subcommand and parses the JSON line it prints. */
export async function check<T>(subcommand: string, ...args: string[]): Promise<T> {
  const r = await runPython([CHECK_SCRIPT, subcommand, ...args]);
  if (r.status !== 0) throw new Error(`openvino_check.py ${subcommand} exited ${r.status}: ${r.stderr.slice(-2000)}`);
  return JSON.parse(r.stdout.trim().split("\n").at(-1)!) as T;
}

/** Runs `prep.py model cacheDir`; `path` is the folder it printed (undefined when it failed). */
export async function prepCli(model: string, cacheDir: string): Promise<PythonRun & { path: string | undefined }> {
  const r = await runPython([PREP_SCRIPT, model, cacheDir]);
  return { ...r, path: r.status === 0 ? r.stdout.trim() : undefined };
}

/** The tiny hybrid (linear-attention + attention) IR, made once into Keel's cache (src/engine-openvino/hybrid-model.ts). */
export async function hybridModel(): Promise<string> {
  const { ensureHybridModel } = await import("../../src/engine-openvino/hybrid-model.js");
  return ensureHybridModel();
}
