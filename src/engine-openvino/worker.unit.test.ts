/** Runs the OpenVINO worker's Python unit tests (test_worker.py) with the engine's venv python. */
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import { expect, it } from "vitest";
import { openvinoPython } from "../../test/support/openvino.js";

it("OpenVINO worker unit tests (framing, validation, text, settings, guide mapping, UTF-8 under a guide) pass", { timeout: 60_000 }, async () => {
  const dir = path.dirname(new URL(import.meta.url).pathname);
  const r = await promisify(execFile)(await openvinoPython(), ["-m", "unittest", "-v", "test_worker", "test_guides", "test_utf8_loop"], { cwd: dir }).catch((e: { stdout: string; stderr: string }) => e);
  expect(r.stderr).toMatch(/\nOK\s*$/);
  expect(r.stderr).toMatch(/Ran (\d+) tests/);
});
