/**
 * The wire-level conformance suite against the real llama.cpp engine (dist/engine/main.js, run `node
 * scripts/prepare.mjs` first) on the embedded tiny model, with the suite's own start configuration
 * (conformanceConfig: small limits so that a prefill spans many steps; prefix caching off keeps reruns bit-identical).
 */
import path from "node:path";
import { ensureDefaultModel } from "../../src/model/default-model.js";
import { ROOT } from "../support/server.js";
import { conformanceConfig, defineEngineConformance } from "./engine-conformance.js";

defineEngineConformance("llama.cpp (node-llama-cpp)", async () => ({
  command: process.execPath,
  args: [path.join(ROOT, "dist", "engine", "main.js")],
  config: conformanceConfig(await ensureDefaultModel()),
}));
