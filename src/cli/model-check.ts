/**
 * The model check before serving: a cheap look at the file (is it a GGUF?), then a load in a throwaway engine
 * process, so that a model that makes llama.cpp abort (GGML_ASSERT) kills only that child, never the gateway.
 *
 * @module
 */
import fs from "node:fs";
import path from "node:path";
import { DEFAULT_ENGINE_COMMAND, spawnEngine } from "../gateway/supervision/engine-client.js";
import { LoadProgressLines } from "../gateway/supervision/load-progress.js";
import { checkKey, readCheck, writeCheck } from "./model-check-cache.js";
import type { EngineCommand, EngineConfig } from "../protocol/engine-config.js";
import type { EngineBackend, ModelMetadata } from "../protocol/messages.js";

/**
 * Check that `modelPath` names a readable GGUF file before an engine tries to load it.
 * @returns null when it looks like one, else a user-facing message.
 */
export function checkModelFile(modelPath: string): string | null {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(modelPath);
  } catch {
    return `the model file ${modelPath} does not exist`;
  }
  if (stat.isDirectory()) return `${modelPath} is a directory; --model_path needs a GGUF model file`;
  if (!stat.isFile()) return `${modelPath} is not a regular file; --model_path needs a GGUF model file`;
  const head = Buffer.alloc(4);
  let fd: number | null = null;
  try {
    fd = fs.openSync(modelPath, "r");
    const n = fs.readSync(fd, head, 0, 4, 0);
    if (n < 4 || head.toString("latin1") !== "GGUF") return `the model file ${modelPath} is not a GGUF file (it does not start with the GGUF magic)`;
  } catch (err) {
    return `the model file ${modelPath} cannot be read: ${(err as Error).message}`;
  } finally {
    if (fd !== null) fs.closeSync(fd);
  }
  return null;
}

/** Engine failures that are a JavaScript error inside the GGUF reader: the file ends early or is corrupt. */
const CORRUPT_GGUF = /Cannot read properties of undefined|out of range|Offset is outside the bounds|RangeError|Unexpected end|Maximum call stack/i;

/** The model check found no GPU backend although --target_device asked for one. */
export class NoGpuError extends Error {}

/**
 * OpenVINO's words when it refuses a property: a value (`Wrong value X for property key K`, `Could not read number of
 * streams from str`, `Could not convert to bool from string`, `expect kvcache type`) or a key (`Unsupported property K`).
 */
const OPENVINO_REFUSAL = /Wrong value|[Uu]nsupported property|[Nn]ot supported property|Could not (?:read|convert)|expect kvcache type/;
/** The key OpenVINO's refusal names, when it names one. */
const REFUSED_KEY = /(?:property key|[Uu]nsupported property|[Nn]ot supported property)\s+([A-Za-z0-9_.]+)/;

/**
 * A `--plugin_config` that OpenVINO refused while loading the model: the flag (and its key, when the message names one
 * of those given) instead of a verdict on the model; null when the failure is not such a refusal — a key's name
 * appearing in some other failure's message is not one.
 */
export function pluginConfigRefusal(detail: string, keys: readonly string[]): string | null {
  if (keys.length === 0 || !OPENVINO_REFUSAL.test(detail)) return null;
  // The key the refusal names; else a given key that appears as a whole word (a message about one value of it).
  const named = REFUSED_KEY.exec(detail)?.[1];
  const wholeWord = (k: string): boolean => k !== "" && new RegExp(`(^|[^A-Za-z0-9_])${k.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}([^A-Za-z0-9_]|$)`).test(detail);
  const key = named !== undefined && keys.includes(named) ? named : keys.find(wholeWord);
  return `--plugin_config${key !== undefined ? ` ${key}` : ""}: OpenVINO refused it while loading the model`;
}

/** The event of the engine's fatal line when a GPU was required and none loads (engine/main.ts). */
const NO_GPU_EVENT = "no_gpu_backend";

/** Signals that mean the model check was killed from outside (an OOM killer, an operator), not that it failed. */
const KILL_SIGNALS = new Set(["SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"]);

/** How long the phases of a passed check took in the llama.cpp engine (ms from its process start; null: not seen). */
interface CheckTimings {
  startMs: number;
  backendMs: number | null;
  modelMs: number | null;
  contextMs: number | null;
}

/** The check's lines: what it does and why before, its progress when slow, its time by phase after. */
function checkLines(modelPath: string, log: (line: string) => void): { progress: (p: number) => void; passed: (ms: number, t: CheckTimings | undefined) => void } {
  log(`checking ${path.basename(modelPath)} in a throwaway engine process (it loads the model once; a model that crashes the engine stops only that process)…`);
  const lines = new LoadProgressLines({ edges: false });
  const s = (ms: number | null): string => `${((ms ?? 0) / 1000).toFixed(1)} s`;
  return {
    progress: (p) => lines.take(p) && log(`checking the model: ${Math.floor(p * 100)}%`),
    passed: (ms, t) => log(`model check passed in ${s(ms)}${t ? ` (process start ${s(t.startMs)}, backend ${s(t.backendMs)}, model load ${s(t.modelMs)}, context ${s(t.contextMs)})` : ""}`),
  };
}

/** One run of the model check in a throwaway engine process; its progress lines (stdout, before the result) go to `onProgress`. */
async function runModelCheck(config: Omit<EngineConfig, "mode">, command: EngineCommand, onProgress?: (p: number) => void): Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }> {
  const child = spawnEngine(command, { ...config, mode: "validate" }, ["ignore", "pipe", "pipe"], false);
  let stdout = "";
  let stderr = "";
  let seen = 0;
  child.stdout!.setEncoding("utf8").on("data", (d: string) => {
    stdout += d;
    for (let end = stdout.indexOf("\n", seen); end >= 0; end = stdout.indexOf("\n", seen)) {
      const line = stdout.slice(seen, end);
      seen = end + 1;
      if (onProgress && line.startsWith('{"loading":')) onProgress((JSON.parse(line) as { loading: number }).loading);
    }
  });
  child.stderr!.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => {
    child.on("error", () => resolve([127, null]));
    child.on("exit", (c, s) => resolve([c, s]));
  });
  return { code, signal, stdout, stderr };
}

/**
 * Load the model in a throwaway child: a model that makes llama.cpp abort (GGML_ASSERT) kills only that child.
 * A check killed from outside (e.g. SIGKILL by an OOM killer) is not the model's fault: it is retried once, and if
 * it is killed again that is what the error says.
 * @param opts.log where the check says what it does, its progress and its time (none when absent)
 * @returns the model metadata. @throws Error with the child's last log line when it fails.
 */
export async function validateModel(config: Omit<EngineConfig, "mode">, command: EngineCommand = DEFAULT_ENGINE_COMMAND, opts: { log?: (line: string) => void; cacheRoot?: string } = {}): Promise<ModelMetadata & { backend?: EngineBackend }> {
  // 1. A check that passed for this very file, configuration and install is remembered (model-check-cache.ts).
  const key = opts.cacheRoot === undefined ? null : checkKey(config, command);
  const remembered = key === null ? null : readCheck(opts.cacheRoot!, key);
  if (remembered !== null) {
    opts.log?.(`model check: ${path.basename(config.modelPath)} passed before with these settings (remembered in ${path.join(opts.cacheRoot!, "checks")}; KEEL_MODEL_CHECK_CACHE=off checks again)`);
    return remembered;
  }
  const started = Date.now();
  const say = opts.log ? checkLines(config.modelPath, opts.log) : null;
  let run = await runModelCheck(config, command, say?.progress);
  if (run.signal && KILL_SIGNALS.has(run.signal)) run = await runModelCheck(config, command, say?.progress);
  const { code, signal, stdout, stderr } = run;
  if (code === 0) {
    const line = stdout.trim().split("\n").pop() ?? "";
    const result = JSON.parse(line) as { metadata: ModelMetadata; backend?: EngineBackend; timings?: CheckTimings };
    say?.passed(Date.now() - started, result.timings);
    const passed = result.backend ? { ...result.metadata, backend: result.backend } : result.metadata;
    if (key !== null) writeCheck(opts.cacheRoot!, key, config.modelPath, passed);
    return passed;
  }
  if (stderr.includes(`"event":"${NO_GPU_EVENT}"`)) {
    // Asked for a GPU, none loads: say so plainly (no model verdict, no silent CPU fallback). The OpenVINO engine
    // names its own cause (its GPU plugin needs an Intel GPU and its OpenCL runtime).
    const line = stderr.split("\n").find((l) => l.includes(`"event":"${NO_GPU_EVENT}"`)) ?? "";
    const openvino = line.includes("OpenVINO");
    const why = openvino
      ? `OpenVINO's GPU plugin cannot run here (it needs an Intel GPU and its OpenCL driver: ${/lib[\w.]*\.so[.\d]*: cannot open shared object file/.exec(line)?.[0] ?? "see the engine log"})`
      : "no GPU backend loads on this machine (node-llama-cpp's prebuilt CUDA, Vulkan and Metal backends were tried)";
    throw new NoGpuError(`--target_device GPU: ${why}; run on the CPU with --target_device CPU, or use --target_device AUTO to take a GPU only when one loads`);
  }
  if (signal && KILL_SIGNALS.has(signal)) {
    throw new Error(`the model check was killed (${signal}) twice while loading ${config.modelPath}; this is not a verdict on the model (out of memory? see the system log)`);
  }
  const detail = stderr
    .trim()
    .split("\n")
    .map((l) => {
      try {
        return (JSON.parse(l) as { msg?: string }).msg ?? l;
      } catch {
        return l;
      }
    })
    .filter((l) => l.trim())
    .slice(-3)
    .join(" | ");
  const refused = pluginConfigRefusal(detail, Object.keys(config.pluginConfig ?? {}));
  if (refused !== null) throw new Error(`${refused} (engine exit code ${code}): ${detail}`);
  if (CORRUPT_GGUF.test(detail)) throw new Error(`the model ${config.modelPath} cannot be loaded: the GGUF file is truncated or corrupt (its contents end early or do not parse)`);
  throw new Error(`the model ${config.modelPath} cannot be loaded (engine ${signal ? `killed by ${signal}` : `exit code ${code}`}): ${detail || "no message"}`);
}
