import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { ensureOpenvinoVenv, openvinoEngineCommand, openvinoVenvDir, OPENVINO_REQUIREMENTS, OPENVINO_WORKER, VENV_STAMP } from "./venv.js";

/**
 * A fake `python3`: `-m venv DIR` makes DIR/bin/python, whose `-m pip install -r REQ` records the call in `journal`
 * (and fails with `pipExit` when non-zero, after printing ten numbered lines).
 */
function fakePython3(work: string, pipExit = 0): { python3: string; journal: string } {
  const journal = path.join(work, "journal");
  const python3 = path.join(work, "python3");
  const pip = [
    "#!/bin/sh",
    `echo "pip $*" >> '${journal}'`,
    ...(pipExit !== 0 ? ["for i in 1 2 3 4 5 6 7 8 9 10; do echo \"pip line $i\"; done", "echo 'ERROR: No matching distribution found for openvino-genai' >&2", `exit ${pipExit}`] : []),
  ].join("\n");
  writeFileSync(
    python3,
    ["#!/bin/sh", '[ "$1 $2" = "-m venv" ] || exit 9', `echo "venv $3" >> '${journal}'`, 'mkdir -p "$3/bin"', `cat > "$3/bin/python" <<'EOF'\n${pip}\nEOF`, 'chmod +x "$3/bin/python"'].join("\n"),
  );
  chmodSync(python3, 0o755);
  return { python3, journal };
}

function setup(pipExit = 0) {
  const work = mkdtempSync(path.join(os.tmpdir(), "keel-venv-"));
  const requirements = path.join(work, "requirements.txt");
  writeFileSync(requirements, "openvino-genai==2026.4.1.0\n");
  const env = { KEEL_CACHE_DIR: path.join(work, "cache") };
  const fake = fakePython3(work, pipExit);
  const journal = (): string[] => (existsSync(fake.journal) ? readFileSync(fake.journal, "utf8").trim().split("\n") : []);
  return { work, requirements, env, journal, opts: { env, requirements, python3: fake.python3, lockPollMs: 5 } };
}

describe("ensureOpenvinoVenv", () => {
  it("builds the venv once in Keel's cache (named by the requirements' hash), stamps it last, and finds it again without running anything", async () => {
    const t = setup();
    const lines: string[] = [];
    const python = await ensureOpenvinoVenv({ ...t.opts, log: (l) => lines.push(l) });
    const dir = openvinoVenvDir(t.requirements, t.env);
    expect(dir.startsWith(path.join(t.work, "cache", "venvs", "openvino-"))).toBe(true);
    expect(path.basename(dir)).toMatch(/^openvino-[0-9a-f]{12}$/);
    expect(python).toBe(path.join(dir, "bin", "python"));
    expect(existsSync(path.join(dir, VENV_STAMP))).toBe(true);
    expect(t.journal()).toEqual([`venv ${dir}`, `pip -m pip install --disable-pip-version-check --no-input -r ${t.requirements}`]);
    expect(lines.some((l) => l.startsWith("building the OpenVINO venv"))).toBe(true);
    // Present: the stamp is enough, nothing runs again.
    expect(await ensureOpenvinoVenv(t.opts)).toBe(python);
    expect(t.journal()).toHaveLength(2);
    // Other pins: another directory.
    writeFileSync(t.requirements, "openvino-genai==2026.5.0.0\n");
    expect(openvinoVenvDir(t.requirements, t.env)).not.toBe(dir);
  });

  it("two concurrent starts build it once and both get the same python", async () => {
    const t = setup();
    const [a, b] = await Promise.all([ensureOpenvinoVenv(t.opts), ensureOpenvinoVenv(t.opts)]);
    expect(a).toBe(b);
    expect(t.journal().filter((l) => l.startsWith("venv "))).toHaveLength(1);
    expect(existsSync(`${openvinoVenvDir(t.requirements, t.env)}.lock`)).toBe(false);
  });

  it("a half-built venv (no stamp) is removed and built again", async () => {
    const t = setup();
    const dir = openvinoVenvDir(t.requirements, t.env);
    mkdirSync(path.join(dir, "bin"), { recursive: true });
    writeFileSync(path.join(dir, "bin", "python"), "left by a killed build");
    writeFileSync(path.join(dir, "leftover"), "x");
    const lines: string[] = [];
    await ensureOpenvinoVenv({ ...t.opts, log: (l) => lines.push(l) });
    expect(existsSync(path.join(dir, "leftover"))).toBe(false);
    expect(existsSync(path.join(dir, VENV_STAMP))).toBe(true);
    expect(lines).toContain(`removing the incomplete OpenVINO venv ${dir} (a build that did not finish)`);
  });

  it("a failed pip names the command and quotes its last lines; nothing is stamped and the next start tries again", async () => {
    const t = setup(1);
    const err = await ensureOpenvinoVenv(t.opts).catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    const msg = (err as Error).message;
    expect(msg).toContain(`-m pip install --disable-pip-version-check --no-input -r ${t.requirements}\` exited with code 1`);
    expect(msg).toContain("ERROR: No matching distribution found for openvino-genai");
    expect(msg).toContain("pip line 10");
    expect(msg).not.toContain("pip line 2\n"); // only the tail is quoted
    const dir = openvinoVenvDir(t.requirements, t.env);
    expect(existsSync(path.join(dir, VENV_STAMP))).toBe(false);
    expect(existsSync(`${dir}.lock`)).toBe(false);
    await ensureOpenvinoVenv(t.opts).catch(() => undefined);
    expect(t.journal().filter((l) => l.startsWith("venv "))).toHaveLength(2);
  });

  it("no python3: a clear message naming it and KEEL_OPENVINO_PYTHON", async () => {
    const t = setup();
    const missing = path.join(t.work, "no-such-python3");
    await expect(ensureOpenvinoVenv({ ...t.opts, python3: missing })).rejects.toThrow(`${missing} was not found on PATH; the OpenVINO engine needs Python 3.10+ with its venv module (or set KEEL_OPENVINO_PYTHON`);
  });

  it("KEEL_OPENVINO_PYTHON is used as is: nothing is built", async () => {
    const t = setup();
    expect(await ensureOpenvinoVenv({ ...t.opts, env: { ...t.env, KEEL_OPENVINO_PYTHON: "/opt/py/bin/python3" } })).toBe("/opt/py/bin/python3");
    expect(t.journal()).toEqual([]);
  });
});

describe("openvinoEngineCommand", () => {
  it("runs src/engine-openvino/worker.py (absolute) with the given python; the requirements sit next to it", () => {
    const root = path.resolve(import.meta.dirname, "..", "..");
    expect(openvinoEngineCommand("/v/bin/python")).toEqual({ command: "/v/bin/python", args: [path.join(root, "src", "engine-openvino", "worker.py")] });
    expect(OPENVINO_WORKER).toBe(path.join(root, "src", "engine-openvino", "worker.py"));
    expect(existsSync(OPENVINO_REQUIREMENTS)).toBe(true);
  });
});
