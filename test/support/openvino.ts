/**
 * Test support for the OpenVINO engine: the Python interpreter of its venv, and running Python scripts with it.
 */
import { spawn } from "node:child_process";
import path from "node:path";
import { ROOT } from "./server.js";

/** src/engine-openvino/prep.py: model preparation (CLI: `prep.py MODEL_PATH CACHE_DIR` prints the path to load). */
export const PREP_SCRIPT = path.join(ROOT, "src", "engine-openvino", "prep.py");
/** test/support/openvino_check.py: loads/generates/compares models for the tests (subcommands print one JSON line). */
export const CHECK_SCRIPT = path.join(ROOT, "test", "support", "openvino_check.py");
/** test/support/synthetic_gguf.py: writes small random GGUFs with matrices in a chosen tensor type. */
export const SYNTHETIC_GGUF_SCRIPT = path.join(ROOT, "test", "support", "synthetic_gguf.py");

/**
 * The Python of a venv holding src/engine-openvino/requirements.txt: `$KEEL_OPENVINO_PYTHON`.
 * (To be switched to venv.ts's ensureOpenvinoVenv() once it lands.)
 * @throws Error saying how to provide one when the variable is unset
 */
export function openvinoPython(): string {
  const python = process.env["KEEL_OPENVINO_PYTHON"];
  if (!python) {
    throw new Error(
      "the OpenVINO tests need KEEL_OPENVINO_PYTHON: the python of a venv with src/engine-openvino/requirements.txt " +
        "(python3 -m venv /path/ov && /path/ov/bin/pip install -r src/engine-openvino/requirements.txt; " +
        "then KEEL_OPENVINO_PYTHON=/path/ov/bin/python)",
    );
  }
  return python;
}

/** What a finished Python process said. */
export interface PythonRun {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `python args…` with the OpenVINO venv's Python; resolves when it exits (never rejects on a non-zero status). */
export function runPython(args: string[], env: Record<string, string> = {}): Promise<PythonRun> {
  return new Promise((resolve, reject) => {
    const proc = spawn(openvinoPython(), args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
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
