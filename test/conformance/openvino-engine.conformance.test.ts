/**
 * The wire-level conformance suite against the OpenVINO GenAI engine (src/engine-openvino/worker.py, in the venv
 * that ensureOpenvinoVenv builds) on the embedded tiny model in its F16 variant (OpenVINO cannot load F32 matrices),
 * with the same start configuration as the llama.cpp run (conformanceConfig).
 */
import { ensureTinyModel } from "../../src/model/default-model.js";
import { OPENVINO_WORKER } from "../../src/engine-openvino/venv.js";
import { openvinoPython } from "../support/openvino.js";
import { conformanceConfig, defineEngineConformance } from "./engine-conformance.js";

defineEngineConformance("OpenVINO GenAI (Python worker)", async () => ({
  command: await openvinoPython(),
  args: [OPENVINO_WORKER],
  config: conformanceConfig(await ensureTinyModel("keel-tiny-f16")),
}));
