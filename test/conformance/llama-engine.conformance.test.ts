/**
 * The wire-level conformance suite against the real llama.cpp engine (dist/engine/main.js, run `node
 * scripts/prepare.mjs` first) on the embedded tiny model. The start configuration is the engine-neutral EngineConfig
 * (src/protocol/engine-config.ts), with small limits so that a prefill spans many steps; prefix caching off keeps reruns bit-identical.
 */
import path from "node:path";
import { ensureDefaultModel } from "../../src/model/default-model.js";
import { ROOT } from "../support/server.js";
import { defineEngineConformance } from "./engine-conformance.js";
import type { EngineConfig } from "../../src/protocol/engine-config.js";

defineEngineConformance("llama.cpp (node-llama-cpp)", async () => {
  const modelPath = await ensureDefaultModel();
  const maxModelLen = 2048;
  return {
    command: process.execPath,
    args: [path.join(ROOT, "dist", "engine", "main.js")],
    config: {
      mode: "serve",
      modelPath,
      maxNumSeqs: 4,
      maxNumBatchedTokens: 8,
      maxModelLen,
      prefixCaching: false,
      threads: 1,
      flashAttention: false,
      kvCacheType: "f16",
      device: "cpu",
    } satisfies EngineConfig,
  };
});
