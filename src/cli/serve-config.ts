/**
 * `keel serve --config_path FILE`: several models, each in its own engine (gateway/models/model-set.ts). Reads the file
 * (gateway/models/config-file.ts), turns each entry into an engine configuration with the server's flags as defaults and the
 * entry's settings on top, checks each model in a throwaway engine, and serves them; `POST /v1/config/reload` runs
 * the same resolution again (an invalid file changes nothing).
 */
import fs from "node:fs";
import path from "node:path";
import { parseConfigFile, type ConfigEntry } from "../gateway/models/config-file.js";
import type { ModelSpec } from "../gateway/models/model-set.js";
import type { Gateway } from "../gateway/server.js";
import { isTinyModelName } from "../model/default-model.js";
import { HYBRID_MODEL_NAME } from "../engine-openvino/hybrid-model.js";
import { kvBlockTokens, openvinoKvElementBytes } from "../model/kv-bytes.js";
import { isCatalogueName, keelCacheRoot } from "../model/model-cache.js";
import { openvinoIrDirectory, resolveServeModel } from "../model/serve-model.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";
import type { ModelMetadata } from "../protocol/messages.js";
import { CliError } from "./cli-error.js";
import { agentLine, impliedLines, serverLines } from "./start-summary.js";
import { chooseEngine, engineBaseConfig, engineCommandFor, engineFlagProblems, type EngineChoice, type ModelToServe } from "./engine-choice.js";
import { withSettings, type ServeOptions } from "./flags.js";
import { kvCapacity } from "./kv-capacity.js";
import { checkModelFile, validateModel } from "./model-check.js";
import { listen, type ServerSettings } from "./server-settings.js";

/**
 * The model an entry's base_path names: keel-tiny*, a catalogue name, a GGUF file, a folder with one `.gguf`, or an
 * OpenVINO IR folder (served by the OpenVINO engine under `--engine auto`, as a model from flags).
 */
async function entryModel(entry: ConfigEntry, configDir: string): Promise<ModelToServe> {
  if (isTinyModelName(entry.basePath) || isCatalogueName(entry.basePath) || entry.basePath === HYBRID_MODEL_NAME) return await resolveServeModel(entry.basePath);
  // OVMS resolves a relative base_path against the config file's folder.
  const p = path.resolve(configDir, entry.basePath);
  let file = p;
  if (fs.existsSync(p) && fs.statSync(p).isDirectory() && openvinoIrDirectory(p) !== null) return await resolveServeModel(p);
  if (fs.existsSync(p) && fs.statSync(p).isDirectory()) {
    const ggufs = fs.readdirSync(p).filter((f) => f.toLowerCase().endsWith(".gguf"));
    if (ggufs.length !== 1) throw new Error(`model "${entry.name}": ${p} is a folder with ${ggufs.length} .gguf files; base_path needs a GGUF file or a folder with exactly one`);
    file = path.join(p, ggufs[0]!);
  }
  const bad = checkModelFile(file);
  if (bad) throw new Error(`model "${entry.name}": ${bad}`);
  return { kind: "file", path: file };
}

/** One entry's options: the server's, overridden by the entry's settings (checked by the same schemas as the flags). */
function entryOptions(entry: ConfigEntry, options: ServeOptions): ServeOptions {
  const { options: out, problems } = withSettings(options, entry.settings);
  // --deterministic turns prefix reuse off and needs an f16 KV cache: an entry asking otherwise contradicts it (cli/flags.ts).
  if (out.deterministic && out.enable_prefix_caching && entry.settings.enable_prefix_caching !== undefined) problems.push("enable_prefix_caching true contradicts --deterministic true");
  if (out.deterministic && out.kv_cache_precision === "u8") problems.push("kv_cache_precision u8 contradicts --deterministic true (it needs an f16 KV cache)");
  if (problems.length > 0) throw new Error(`model "${entry.name}": ${problems.join("; ")}`);
  if (out.max_num_batched_tokens < out.max_num_seqs) {
    throw new Error(`model "${entry.name}": max_num_batched_tokens (${out.max_num_batched_tokens}) must be >= max_num_seqs (${out.max_num_seqs})`);
  }
  return out;
}

/** Models that loaded in a throwaway engine, by file identity and settings: a reload does not check them again. */
const checked = new Map<string, ModelMetadata>();

/** {@link validateModel}, once per model file (path, size, mtime) and engine settings. */
async function checkedModel(config: Omit<EngineConfig, "mode">, engineCommand: EngineCommand): Promise<ModelMetadata> {
  const st = fs.statSync(config.modelPath);
  const key = JSON.stringify([config, st.size, st.mtimeMs, engineCommand]);
  const hit = checked.get(key);
  if (hit) return hit;
  const meta = await validateModel(config, engineCommand, { log: (line) => void process.stderr.write(`keel serve: ${line}\n`), cacheRoot: keelCacheRoot() });
  checked.set(key, meta);
  return meta;
}

/** Largest config file read (bytes): a model list is a few KB. */
export const MAX_CONFIG_BYTES = 1 << 20;

/**
 * Read `file` and resolve every model to what its engine starts with (each model checked in a throwaway engine).
 * @throws Error with the reason (the file, an entry's setting, a model that does not load).
 */
export async function resolveConfigModels(file: string, options: ServeOptions, engineOverride: EngineCommand | null): Promise<ModelSpec[]> {
  let text: string;
  try {
    // A regular file of bounded size only: opening a FIFO blocks until a writer comes and /dev/zero never ends, and
    // either would stall the one event loop every model's streams run on (a reload happens while they stream).
    const st = await fs.promises.stat(file);
    if (!st.isFile()) throw new Error("not a regular file");
    if (st.size > MAX_CONFIG_BYTES) throw new Error(`larger than ${MAX_CONFIG_BYTES} bytes`);
    text = await fs.promises.readFile(file, "utf8");
  } catch (err) {
    throw new Error(`cannot read the config file ${file}: ${(err as Error).message}`);
  }
  const entries = parseConfigFile(text);
  const specs: ModelSpec[] = [];
  for (const entry of entries) {
    const f = entryOptions(entry, options);
    const model = await entryModel(entry, path.dirname(path.resolve(file)));
    // 1. The engine: the top-level --engine for every model, `auto` deciding per model (an IR folder → openvino).
    let choice: EngineChoice;
    try {
      choice = chooseEngine(f.engine, model);
    } catch (err) {
      throw new Error(`model "${entry.name}": ${(err as Error).message}`);
    }
    // 2. The flags that engine cannot honour, given on the command line or in the entry.
    const given = new Set([...options.given, ...Object.keys(entry.settings)]);
    const engineProblems = engineFlagProblems(choice.engine, f, given);
    if (engineProblems.length > 0) throw new Error(`model "${entry.name}": ${engineProblems.join("; ")}`);
    if (model.kind === "openvino-ir" && choice.engine === "llama.cpp") {
      const bad = checkModelFile(choice.modelPath);
      if (bad) throw new Error(`model "${entry.name}": ${bad}`);
    }
    // 3. The model loads in a throwaway engine.
    const engineCommand = await engineCommandFor(choice.engine, engineOverride, (l) => void process.stderr.write(`keel serve: ${l}\n`));
    const base = engineBaseConfig(f, choice.modelPath, choice.engine);
    let meta;
    try {
      meta = await checkedModel({ ...base, maxModelLen: 256 }, engineCommand);
    } catch (err) {
      throw new Error(`model "${entry.name}": ${(err as Error).message}`);
    }
    // 4. The same capacity rule as a single model from flags (cli/kv-capacity.ts).
    let maxModelLen: number;
    try {
      ({ maxModelLen } = kvCapacity(meta, { maxModelLen: f.max_model_len, cacheGb: f.cache_size, maxNumSeqs: f.max_num_seqs, u8: f.kv_cache_precision === "u8", engine: choice.engine, kvBlocks: f.num_kv_blocks, blockTokens: kvBlockTokens(base.device), kvElementBytes: openvinoKvElementBytes(base.device, base.kvCacheType, base.pluginConfig) }));
    } catch (err) {
      throw new Error(`model "${entry.name}": ${(err as Error).message}`);
    }
    specs.push({
      name: entry.name,
      engine: { ...base, maxModelLen },
      agents: { toolParser: f.tool_parser ?? null, reasoningParser: f.reasoning_parser ?? null, guideAuto: f.enable_tool_guided_generation },
      maxQueuedRequests: f.max_queued_requests,
      engineCommand,
      engineName: choice.engine,
    });
  }
  return specs;
}

/**
 * Serve the models of the config file `file` (the caller drains on the shutdown signals, as for a single model).
 * @throws CliError: exit 2 when flags name a model too, exit 1 when a model cannot be served or the port is taken
 */
export async function serveFromConfig(file: string, options: ServeOptions, engineOverride: EngineCommand | null, settings: ServerSettings): Promise<Gateway> {
  if (options.model_path !== undefined || options.model_name !== undefined) {
    throw new CliError(2, "--config_path lists the models; it cannot be combined with --model_path or --model_name");
  }
  let specs: ModelSpec[];
  try {
    specs = await resolveConfigModels(file, options, engineOverride);
  } catch (err) {
    throw new CliError(1, (err as Error).message);
  }
  const gw = await listen({
    ...settings,
    modelName: specs[0]!.name,
    engine: specs[0]!.engine,
    models: specs,
    reloadModels: () => resolveConfigModels(file, options, engineOverride),
  });
  // The server-wide lines once (flag notes for the engines served, the API key), then each model's.
  const engines = [...new Set(specs.map((s) => s.engineName).filter((e): e is NonNullable<typeof e> => e !== undefined))];
  const { notes, security } = serverLines(options, typeof settings.apiKey === "string", engines);
  for (const line of [...notes, security]) gw.log[line.level](line.fields, line.msg);
  for (const s of specs) {
    gw.log.info({ event: "engine", name: s.name, engine: s.engineName ?? null, command: s.engineCommand?.command ?? null }, `${s.name}: engine ${s.engineName ?? "(not said)"}`);
    gw.log.info({ event: "model", name: s.name, path: s.engine.modelPath, tokensPerSequence: s.engine.maxModelLen, sequences: s.engine.maxNumSeqs }, `serving ${s.name} from ${s.engine.modelPath}`);
    const implied = s.engineName ? impliedLines(s.engineName, s.engine, options.flash_attention) : [];
    for (const line of [agentLine(s.agents), ...implied]) gw.log[line.level]({ ...line.fields, name: s.name }, `${s.name}: ${line.msg}`);
  }
  return gw;
}
