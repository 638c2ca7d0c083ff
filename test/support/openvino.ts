/** The Python that runs the OpenVINO engine in tests: KEEL_OPENVINO_PYTHON, else the venv ensureOpenvinoVenv builds. */
export async function openvinoPython(): Promise<string> {
  const fromEnv = process.env["KEEL_OPENVINO_PYTHON"];
  if (fromEnv) return fromEnv;
  throw new Error("set KEEL_OPENVINO_PYTHON to the OpenVINO venv's python (src/engine-openvino/requirements.txt)");
}
