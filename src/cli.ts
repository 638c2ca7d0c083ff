/**
 * The `keel` command line, as the bin (bin/keel.mjs), tests and tools import it: `main` and the `keel serve` flags.
 * The modules live in cli/: flags (flag-table, flag-values, flags), the model check, shutdown, serve, and main.
 *
 * @module
 */
export { main } from "./cli/main.js";
export { ENGINE_FLAG_VALUES, ENGINES, metricFamilyNames, SERVE_FLAGS, usage, type EngineFlag, type EngineName, type FlagValues } from "./cli/flag-table.js";
export { parseTargetDevice } from "./cli/flag-values.js";
export { FlagError, parseServeCommand, parseServeFlags, type FlagNote, type ServeCommand, type ServeOptions } from "./cli/flags.js";
export { checkModelFile, NoGpuError, validateModel } from "./cli/model-check.js";
export { ShutdownSignals } from "./cli/shutdown.js";
