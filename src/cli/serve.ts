/**
 * `keel serve`: from the command line to a serving gateway. One model from flags (resolved, checked in a throwaway
 * engine, its KV capacity settled), or several from `--config_path` (cli/serve-config.ts); then serve until the
 * shutdown drain (cli/shutdown.ts) has ended.
 *
 * Whatever stops the start is thrown as a {@link CliError} with its exit code; cli/main.ts prints it and exits.
 *
 * @module
 */
import { keelCacheRoot } from "../model/model-cache.js";
import type { AgentFlags } from "../gateway/models/agent-config.js";
import type { Gateway } from "../gateway/server.js";
import { HubError } from "../model/hub-download.js";
import { progressSink } from "../model/download-progress.js";
import { kvBlockTokens, llamaKvCacheBytes, openvinoKvElementBytes } from "../model/kv-bytes.js";
import { HOW_TO_PASS_A_MODEL, modelSourceFlagProblem, resolveHubModel, resolveServeModel, type ServeModel } from "../model/serve-model.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";
import type { EngineBackend, ModelMetadata } from "../protocol/messages.js";
import { CliError } from "./cli-error.js";
import { chooseEngine, engineBaseConfig, engineCommandFor, engineFlagProblems, type EngineChoice } from "./engine-choice.js";
import { usage } from "./flag-table.js";
import { FlagError, parseServeCommand, type ServeOptions } from "./flags.js";
import { kvCapacity } from "./kv-capacity.js";
import { checkModelFile, validateModel } from "./model-check.js";
import { serveFromConfig } from "./serve-config.js";
import { agentLine, impliedLines, serverLines } from "./start-summary.js";
import { engineCommandOverride, listen, serverSettings, type ServerSettings } from "./server-settings.js";
import { drainOnSignals } from "./shutdown.js";

/** How `keel serve` ended without an error: it printed what was asked (`--help`, `--pull`), or it served and drained. */
export type ServeEnd = "done" | "drained";

/** A line on stderr, as every start-up message of `keel serve`. */
const say = (line: string): void => void process.stderr.write(`keel serve: ${line}\n`);

/** Run `keel serve` with `argv`. @throws CliError with the message and exit code when it cannot serve */
export async function serve(argv: string[]): Promise<ServeEnd> {
  let options: ServeOptions;
  try {
    const command = parseServeCommand(argv);
    if (command.help) {
      process.stdout.write(usage() + "\n");
      return "done";
    }
    options = command.options;
  } catch (err) {
    if (err instanceof FlagError) throw new CliError(2, err.message, 'Run "keel serve --help" for the list of flags.');
    throw err;
  }
  const settings = serverSettings(options);
  // Several models from an OVMS config file: each gets its own engine (cli/serve-config.ts).
  if (options.configPath !== undefined) {
    const gw = await serveFromConfig(options.configPath, options, engineCommandOverride(), settings);
    await drainOnSignals(gw, options.shutdown_timeout * 1000);
    return "drained";
  }
  const model = await resolveModel(options);
  if (model === "pulled") return "done";
  const gw = await serveModel(options, model, settings);
  await drainOnSignals(gw, options.shutdown_timeout * 1000);
  return "drained";
}

/**
 * The model the flags name (a file, a directory, a catalogue name, a hub repository), downloaded when needed;
 * "pulled" when `--pull` asked only for the download. @throws CliError
 */
async function resolveModel(o: ServeOptions): Promise<ServeModel | "pulled"> {
  const source = {
    modelPath: o.model_path,
    sourceModel: o.sourceModel,
    modelRepositoryPath: o.modelRepositoryPath ?? (process.env["OVMS_MODEL_REPOSITORY_PATH"] || undefined),
    ggufFilename: o.ggufFilename,
    pull: o.pull ?? false,
    overwriteModels: o.overwriteModels ?? false,
  };
  const sourceProblem = modelSourceFlagProblem(source);
  if (sourceProblem) throw new CliError(2, sourceProblem);
  let model: ServeModel;
  // A bar redrawn in place on a terminal; one line per 10% in a log.
  const progress = (label: string) => progressSink(process.stderr, say, label);
  try {
    model = source.sourceModel !== undefined
      ? await resolveHubModel(
          { sourceModel: source.sourceModel, repositoryPath: source.modelRepositoryPath!, ggufFilename: source.ggufFilename, overwrite: source.overwriteModels },
          { log: say, progress },
        )
      : await resolveServeModel(source.modelPath, { fetch: { log: say, progress }, ggufFilename: source.ggufFilename, log: say });
  } catch (err) {
    // A malformed --source_model/--gguf_filename is a bad flag value (2); anything else is the model's or the hub's (1).
    throw new CliError(err instanceof HubError && err.failure === "bad-request" ? 2 : 1, (err as Error).message);
  }
  if (!source.pull) return model;
  // OVMS's --pull: download and exit; the file is only checked to be a GGUF (loading it is serving's job).
  const notGguf = checkModelFile(model.path);
  if (notGguf) throw new CliError(1, notGguf);
  say(`${model.kind === "hub" && model.downloaded ? "pulled" : "already pulled"} ${source.sourceModel} to ${model.path}`);
  return "pulled";
}

/** Check `model` in a throwaway engine, settle its KV capacity and serve it. @throws CliError */
async function serveModel(o: ServeOptions, model: ServeModel, settings: ServerSettings): Promise<Gateway> {
  if (model.kind === "fallback") process.stderr.write(`keel serve: ${model.reason}\nkeel serve: serving the random-weight keel-tiny instead; ${HOW_TO_PASS_A_MODEL}\n`);
  // The engine that serves the model (--engine; cli/engine-choice.ts), and the flags that engine cannot honour.
  let choice: EngineChoice;
  try {
    choice = chooseEngine(o.engine, model);
  } catch (err) {
    throw new CliError(2, (err as Error).message);
  }
  const engineProblems = engineFlagProblems(choice.engine, o, o.given);
  if (engineProblems.length > 0) throw new CliError(2, engineProblems.join("; "));
  const modelPath = choice.modelPath;
  // A GGUF named by the operator gets the cheap magic check; an IR directory is the OpenVINO engine's to check.
  const namedGguf = model.kind === "file" || model.kind === "directory" || model.kind === "hub" || (model.kind === "openvino-ir" && choice.engine === "llama.cpp");
  const notAModel = namedGguf ? checkModelFile(modelPath) : null;
  if (notAModel) throw new CliError(1, notAModel);
  // The engine-neutral start configuration; maxModelLen is settled below.
  const base = engineBaseConfig(o, modelPath, choice.engine);
  const override = engineCommandOverride();
  let engineCommand: EngineCommand;
  try {
    engineCommand = await engineCommandFor(choice.engine, override, say);
  } catch (err) {
    throw new CliError(1, (err as Error).message);
  }
  let meta: ModelMetadata & { backend?: EngineBackend };
  try {
    meta = await validateModel({ ...base, maxModelLen: 256 }, engineCommand, { log: say, cacheRoot: keelCacheRoot() });
  } catch (err) {
    throw new CliError(1, (err as Error).message);
  }
  let capacity: ReturnType<typeof kvCapacity>;
  try {
    capacity = kvCapacity(meta, { maxModelLen: o.max_model_len, cacheGb: o.cache_size, maxNumSeqs: o.max_num_seqs, u8: o.kv_cache_precision === "u8", engine: choice.engine, kvBlocks: o.num_kv_blocks, blockTokens: kvBlockTokens(base.device), kvElementBytes: openvinoKvElementBytes(base.device, base.kvCacheType, base.pluginConfig) });
  } catch (err) {
    throw new CliError(2, `--${(err as Error).message}`);
  }
  const modelName = o.model_name ?? model.servedName;
  const agents: AgentFlags = { toolParser: o.tool_parser ?? null, reasoningParser: o.reasoning_parser ?? null, guideAuto: o.enable_tool_guided_generation };
  const gw = await listen({
    ...settings,
    modelName,
    modelAliases: modelAliases(model, modelName),
    engine: { ...base, maxModelLen: capacity.maxModelLen },
    engineCommand,
    agents,
  });
  logStart(gw, o, { model, modelName, choice, engineCommand, meta, capacity, prefixCaching: base.prefixCaching, device: base.device, apiKeyRequired: typeof settings.apiKey === "string", agents, engineConfig: base });
  return gw;
}

/** What the start lines say about the served model. */
interface Started {
  model: ServeModel;
  modelName: string;
  choice: EngineChoice;
  engineCommand: EngineCommand;
  meta: ModelMetadata & { backend?: EngineBackend };
  capacity: ReturnType<typeof kvCapacity>;
  prefixCaching: boolean;
  device: string;
  apiKeyRequired: boolean;
  /** `--tool_parser`, `--reasoning_parser`, `--enable_tool_guided_generation`. */
  agents: AgentFlags;
  /** The engine's start configuration (what the flags imply for it is logged). */
  engineConfig: Parameters<typeof impliedLines>[1] & Partial<Pick<EngineConfig, "kvUnified">>;
}

/** The start lines: capacity, engine, device, flag notes, parsers and guides, implied settings, modes, security, the model. */
function logStart(gw: Gateway, o: ServeOptions, s: Started): void {
  const { maxModelLen, note: capacityNote, poolTokens } = s.capacity;
  const maxNumSeqs = o.max_num_seqs;
  const engine = s.choice.engine;
  // llama.cpp: a partition per sequence; OpenVINO: one pool shared by all, in the engine's own KV precision.
  const kvBytes = engine === "openvino" ? null : llamaKvCacheBytes(s.meta.kvElementsPerToken, o.kv_cache_precision === "u8" ? "q8_0" : "f16", maxModelLen, maxNumSeqs);
  // --kv_unified true on llama.cpp: the same bytes, one buffer that every sequence's cells come from.
  const shared = engine === "llama.cpp" && s.engineConfig.kvUnified === true;
  gw.log.info(
    { event: "capacity", tokensPerSequence: maxModelLen, sequences: maxNumSeqs, kvBytes, limitedBy: capacityNote, kvCachePrecision: o.kv_cache_precision, prefixCaching: s.prefixCaching, ...(engine === "openvino" ? { poolTokens: poolTokens ?? null } : { kvUnified: shared }) },
    engine === "openvino"
      ? `KV capacity: up to ${maxModelLen} tokens per sequence, ${maxNumSeqs} sequences sharing ${poolTokens !== undefined ? `a pool of ${poolTokens} tokens` : `a pool of max_model_len x max_num_seqs = ${maxModelLen * maxNumSeqs} tokens plus one block of headroom`}, limited by ${capacityNote}`
      : `KV capacity: ${maxModelLen} tokens per sequence x ${maxNumSeqs} sequences${kvBytes !== null ? ` = ${(kvBytes / 1e9).toFixed(2)} GB` : ""}${shared ? " in one buffer shared by the sequences (--kv_unified true)" : ""}, limited by ${capacityNote}`,
  );
  gw.log.info({ event: "engine", engine, why: s.choice.why, command: s.engineCommand.command }, `engine ${engine}: ${s.choice.why}`);
  const backend = s.meta.backend;
  gw.log.info({ event: "device", targetDevice: s.device, backend: backend ?? null }, `target device ${s.device}: ${engine} runs on ${backend ? (backend.gpu === false ? "cpu" : `${backend.gpu} (${backend.devices.join(", ")})`) : "unknown"}`);
  const { notes, security } = serverLines(o, s.apiKeyRequired, [engine]);
  for (const line of [...notes, agentLine(s.agents), ...impliedLines(engine, s.engineConfig, o.flash_attention)]) gw.log[line.level](line.fields, line.msg);
  if (o.deterministic) {
    if (engine === "openvino") gw.log.info({ event: "deterministic", prefixCaching: false }, "deterministic mode: prefix reuse off; the OpenVINO engine's numerics are exact by default on CPU (f32 inference and KV, no dynamic quantisation) unless --plugin_config overrides them");
    else gw.log.info({ event: "deterministic", prefixCaching: false, flashAttention: false, kvCachePrecision: "f16", kvUnified: false }, "deterministic mode: the same request and seed give the same text on every run (prefix reuse off)");
  }
  gw.log[security.level](security.fields, security.msg);
  const { model, modelName } = s;
  const modelPath = s.choice.modelPath;
  gw.log.info({ event: "model", name: modelName, kind: model.kind, path: modelPath, source: model.source }, `serving ${modelName} (${model.source}) from ${modelPath}`);
  if (model.kind === "fallback") gw.log.warn({ event: "default_model_unavailable", reason: model.reason }, `${model.reason}; serving keel-tiny instead: ${HOW_TO_PASS_A_MODEL}`);
  if (model.kind === "tiny" || model.kind === "fallback") gw.log.warn({ event: "demo_model", model: modelPath }, "serving a generated random-weight model: its output is gibberish by design");
}

/**
 * The names a request may use besides the served one: for a catalogue model, the name given to `--model_path`
 * (`qwen2.5-coder-0.5b-instruct` serves `Qwen2.5-Coder-0.5B-Instruct`) and, under `--model_name`, the catalogue's
 * served name too.
 */
export function modelAliases(model: ServeModel, modelName: string): string[] {
  if (model.kind !== "catalogue") return [];
  return [...new Set([model.name, model.servedName])].filter((n) => n !== modelName);
}
