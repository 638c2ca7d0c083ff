/**
 * The wire-level conformance suite against the OpenVINO GenAI engine (src/engine-openvino/worker.py, in the venv
 * that ensureOpenvinoVenv builds) on the embedded tiny model in its F16 variant (OpenVINO cannot load F32
 * matrices). Same configuration as the llama.cpp run: small limits so that a prefill spans many steps, prefix
 * caching off.
 */
import path from "node:path";
import { ensureDefaultModel } from "../../src/model/default-model.js";
import { ROOT } from "../support/server.js";
import { openvinoPython } from "../support/openvino.js";
import { defineEngineConformance } from "./engine-conformance.js";
import type { EngineConfig } from "../../src/protocol/engine-config.js";
import { DEFAULT_MODEL_OPTIONS } from "../../src/model/default-model.js";

defineEngineConformance("OpenVINO GenAI (Python worker)", async () => {
  const modelPath = await ensureDefaultModel({ model: { ...DEFAULT_MODEL_OPTIONS, f16: true } });
  return {
    command: await openvinoPython(),
    args: [path.join(ROOT, "src", "engine-openvino", "worker.py")],
    config: {
      mode: "serve",
      modelPath,
      maxNumSeqs: 4,
      maxNumBatchedTokens: 8,
      maxModelLen: 2048,
      prefixCaching: false,
      threads: 1,
      flashAttention: false,
      kvCacheType: "f16",
      device: "cpu",
    } satisfies EngineConfig,
  };
});
