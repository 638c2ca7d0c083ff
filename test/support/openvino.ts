import { ensureOpenvinoVenv } from "../../src/engine-openvino/venv.js";

/** The Python that runs the OpenVINO engine in tests: KEEL_OPENVINO_PYTHON, else the venv ensureOpenvinoVenv builds. */
export async function openvinoPython(): Promise<string> {
  return process.env["KEEL_OPENVINO_PYTHON"] || (await ensureOpenvinoVenv());
}
