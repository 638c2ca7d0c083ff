/**
 * `keel serve --config_path FILE`: several models, each in its own engine (gateway/models/model-set.ts). Reads the file
 * (gateway/models/config-file.ts), turns each entry into an engine configuration with the server's flags as defaults and the
 * entry's settings on top, checks each model in a throwaway engine, and serves them; `POST /v1/config/reload` runs
 * the same resolution again (an invalid file changes nothing).
 */
import fs from "node:fs";
import path from "node:path";
import { checkModelFile, SERVE_FLAGS, ShutdownSignals, validateModel } from "../cli.js";
import { parseConfigFile, type ConfigEntry } from "../gateway/models/config-file.js";
import type { ModelSpec } from "../gateway/models/model-set.js";
import { kvCapacity } from "./kv-capacity.js";
import { startGateway, type Gateway, type GatewayOptions } from "../gateway/server.js";
import type { ReasoningParserName, ToolParserName } from "../gateway/tools.js";
import { isTinyModelName } from "../model/default-model.js";
import { isCatalogueName } from "../model/model-cache.js";
import { openvinoIrDirectory, resolveServeModel } from "../model/serve-model.js";
import { chooseEngine, engineCommandFor, engineFlagProblems, engineBaseConfig, type EngineFlag, type ModelToServe } from "./engine-choice.js";
import { kvBlockTokens, openvinoKvElementBytes } from "../model/kv-bytes.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";
import type { ModelMetadata } from "../protocol/messages.js";

/**
 * The model an entry's base_path names: keel-tiny*, a catalogue name, a GGUF file, a folder with one `.gguf`, or an
 * OpenVINO IR folder (served by the OpenVINO engine under `--engine auto`, as a model from flags).
 */
async function entryModel(entry: ConfigEntry, configDir: string): Promise<ModelToServe> {
  if (isTinyModelName(entry.basePath) || isCatalogueName(entry.basePath)) return await resolveServeModel(entry.basePath);
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

/** One entry's settings: the server's flags, overridden by the entry's (checked by the same parsers as the flags). */
function entryFlags(entry: ConfigEntry, flags: Record<string, unknown>): Record<string, unknown> {
  const out = { ...flags };
  const problems: string[] = [];
  for (const [k, raw] of Object.entries(entry.settings)) {
    const spec = SERVE_FLAGS.find((f) => f.name === k);
    try {
      out[k] = spec?.parse ? spec.parse(raw) : raw;
    } catch (err) {
      problems.push((err as Error).message.replace(`--${k}`, k));
    }
  }
  // --deterministic turns prefix reuse off and needs an f16 KV cache: an entry asking otherwise contradicts it (cli.ts).
  if (out["deterministic"] === true && out["enable_prefix_caching"] === true && entry.settings.enable_prefix_caching !== undefined) problems.push("enable_prefix_caching true contradicts --deterministic true");
  if (out["deterministic"] === true && out["kv_cache_precision"] === "u8") problems.push("kv_cache_precision u8 contradicts --deterministic true (it needs an f16 KV cache)");
  if (problems.length > 0) throw new Error(`model "${entry.name}": ${problems.join("; ")}`);
  if ((out["max_num_batched_tokens"] as number) < (out["max_num_seqs"] as number)) {
    throw new Error(`model "${entry.name}": max_num_batched_tokens (${out["max_num_batched_tokens"]}) must be >= max_num_seqs (${out["max_num_seqs"]})`);
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
  const meta = await validateModel(config, engineCommand);
  checked.set(key, meta);
  return meta;
}

/** Largest config file read (bytes): a model list is a few KB. */
export const MAX_CONFIG_BYTES = 1 << 20;

/**
 * Read `file` and resolve every model to what its engine starts with (each model checked in a throwaway engine).
 * @throws Error with the reason (the file, an entry's setting, a model that does not load).
 */
export async function resolveConfigModels(file: string, flags: Record<string, unknown>, engineOverride: EngineCommand | null): Promise<ModelSpec[]> {
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
    const f = entryFlags(entry, flags);
    const model = await entryModel(entry, path.dirname(path.resolve(file)));
    // 1. The engine: the top-level --engine for every model, `auto` deciding per model (an IR folder → openvino).
    let choice: ReturnType<typeof chooseEngine>;
    try {
      choice = chooseEngine(((f["engine"] as EngineFlag | undefined) ?? "auto"), model);
    } catch (err) {
      throw new Error(`model "${entry.name}": ${(err as Error).message}`);
    }
    const given = new Set([...((flags["given"] as Set<string> | undefined) ?? []), ...Object.keys(entry.settings)]);
    const engineProblems = engineFlagProblems(choice.engine, f, given);
    if (engineProblems.length > 0) throw new Error(`model "${entry.name}": ${engineProblems.join("; ")}`);
    if (model.kind === "openvino-ir" && choice.engine === "llama.cpp") {
      const bad = checkModelFile(choice.modelPath);
      if (bad) throw new Error(`model "${entry.name}": ${bad}`);
    }
    const modelPath = choice.modelPath;
    const engineCommand = await engineCommandFor(choice.engine, engineOverride, (l) => void process.stderr.write(`keel serve: ${l}\n`));
    const u8 = f["kv_cache_precision"] === "u8";
    const maxNumSeqs = f["max_num_seqs"] as number;
    const base = engineBaseConfig(f, modelPath, choice.engine);
    let meta;
    try {
      meta = await checkedModel({ ...base, maxModelLen: 256 }, engineCommand);
    } catch (err) {
      throw new Error(`model "${entry.name}": ${(err as Error).message}`);
    }
    // The same capacity rule as a single model from flags (cli/kv-capacity.ts).
    let maxModelLen: number;
    try {
      ({ maxModelLen } = kvCapacity(meta, { maxModelLen: f["max_model_len"] as number | undefined, cacheGb: f["cache_size"] as number, maxNumSeqs, u8, engine: choice.engine, kvBlocks: f["num_kv_blocks"] as number | undefined, blockTokens: kvBlockTokens(base.device), kvElementBytes: openvinoKvElementBytes(base.device, base.kvCacheType, base.pluginConfig) }));
    } catch (err) {
      throw new Error(`model "${entry.name}": ${(err as Error).message}`);
    }
    specs.push({
      name: entry.name,
      engine: { ...base, maxModelLen },
      agents: {
        toolParser: (f["tool_parser"] as ToolParserName | "auto" | undefined) ?? null,
        reasoningParser: (f["reasoning_parser"] as ReasoningParserName | undefined) ?? null,
        guideAuto: f["enable_tool_guided_generation"] as boolean,
      },
      maxQueuedRequests: f["max_queued_requests"] as number,
      engineCommand,
      engineName: choice.engine,
    });
  }
  return specs;
}

/** Serve the models of `flags.config_path` until SIGTERM/SIGINT (the same drain as a single model). */
export async function serveFromConfig(
  flags: Record<string, unknown>,
  engineOverride: EngineCommand | null,
  server: Pick<GatewayOptions, "logDestination" | "apiKey" | "cors" | "metricsList"> = {},
): Promise<void> {
  const file = flags["configPath"] as string;
  if (flags["model_path"] !== undefined || flags["model_name"] !== undefined) {
    process.stderr.write("keel serve: --config_path lists the models; it cannot be combined with --model_path or --model_name\n");
    process.exit(2);
  }
  let specs: ModelSpec[];
  try {
    specs = await resolveConfigModels(file, flags, engineOverride);
  } catch (err) {
    process.stderr.write(`keel serve: ${(err as Error).message}\n`);
    process.exit(1);
  }
  const logLevel = ({ DEBUG: "debug", INFO: "info", WARNING: "warn", ERROR: "error" } as const)[flags["log_level"] as "INFO"];
  let gw: Gateway;
  try {
    gw = await startGateway({
      host: flags["rest_bind_address"] as string,
      port: flags["rest_port"] as number,
      modelName: specs[0]!.name,
      engine: specs[0]!.engine,
      models: specs,
      reloadModels: () => resolveConfigModels(file, flags, engineOverride),
      bodyLimit: flags["max_request_body"] as number,
      maxQueuedRequests: flags["max_queued_requests"] as number,
      requestTimeoutMs: (flags["request_timeout"] as number) * 1000,
      maxStreamBuffer: flags["max_stream_buffer"] as number,
      engineStallTimeoutMs: (flags["engine_stall_timeout"] as number) * 1000,
      logLevel,
      ...server,
    });
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const what = e.code === "EADDRINUSE" ? `port ${flags["rest_port"]} on ${flags["rest_bind_address"]} is already in use` : e.message;
    process.stderr.write(`keel serve: cannot listen: ${what}\n`);
    process.exit(1);
  }
  for (const s of specs) {
    gw.log.info({ event: "engine", name: s.name, engine: s.engineName ?? null, command: s.engineCommand?.command ?? null }, `${s.name}: engine ${s.engineName ?? "(not said)"}`);
    gw.log.info({ event: "model", name: s.name, path: s.engine.modelPath, tokensPerSequence: s.engine.maxModelLen, sequences: s.engine.maxNumSeqs }, `serving ${s.name} from ${s.engine.modelPath}`);
  }
  // 1. First signal: drain every model; 2. a later distinct one: stop waiting for in-flight requests.
  const signals = new ShutdownSignals();
  const shutdown = (sig: string): void => {
    const meaning = signals.receive();
    if (meaning === "same") return;
    gw.log.info({ event: "shutdown", signal: sig, count: signals.count }, "shutting down");
    if (meaning === "hurry") return gw.hurryDrain();
    gw.drain((flags["shutdown_timeout"] as number) * 1000)
      .catch((err: unknown) => gw.log.error({ err: (err as Error)?.message }, "error during shutdown"))
      .finally(() => process.exit(0));
  };
  process.on("SIGTERM", () => shutdown("SIGTERM"));
  process.on("SIGINT", () => shutdown("SIGINT"));
}
