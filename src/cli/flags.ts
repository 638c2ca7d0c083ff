/**
 * `keel serve`'s command line (`--flag value` and `--flag=value`, OVMS's names) parsed once into typed, validated
 * options ({@link ServeOptions}); the rest of the CLI reads those, never the raw flags.
 *
 * Every problem of a command line is reported in one message (unknown flags, flags missing their value, bad values,
 * contradictions), never the first one per run.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { defaultEngineThreads, ENGINE_THREADS_RULE, hostCpus, type HostCpus } from "./engine-threads.js";
import { SERVE_FLAGS, type EngineName, type FlagSpec, type FlagValues } from "./flag-table.js";
import { parseValue } from "./flag-values.js";
import { parsePluginConfig } from "./plugin-config.js";

/** A line to log at start about a flag (what it does here, or that part of it is not applied). */
export interface FlagNote {
  level: "info" | "warn";
  msg: string;
  /** Logged only when this engine serves (absent: always); the engine is known once the model is. */
  engine?: EngineName;
}

/** The options of `keel serve`: every flag's value, with what `--plugin_config` and `--deterministic` settle. */
export interface ServeOptions extends Omit<FlagValues, "kv_cache_precision" | "engine_threads"> {
  /** `--kv_cache_precision`, else `--plugin_config`'s KV_CACHE_PRECISION, else f16. */
  kv_cache_precision: "f16" | "u8";
  /** `--engine_threads`, else `--plugin_config`'s INFERENCE_NUM_THREADS, else the host's default (engine-threads.ts). */
  engine_threads: number;
  /** `--plugin_config` as given: the OpenVINO engine applies every key (cli/engine-choice.ts). */
  pluginConfig?: Record<string, unknown>;
  /** A KV_CACHE_PRECISION of `--plugin_config` only the OpenVINO engine applies (the llama.cpp engine refuses it). */
  pluginOpenvinoOnlyKv?: string;
  /** Lines to log at start. */
  notes: FlagNote[];
  /** The flag names given on the command line. */
  given: ReadonlySet<string>;
}

/** A command line that cannot be served: its message names every problem. */
export class FlagError extends Error {}

/** A command line: `--help`, or the options to serve with. */
export type ServeCommand = { help: true } | { help: false; options: ServeOptions };

/** The raw value of each flag given (the last one wins, as OVMS), whether `--help` was asked, and what is wrong with the words of the command line. */
function readCommandLine(argv: string[]): { help: boolean; values: Map<string, string>; problems: string[] } {
  const options = Object.fromEntries([
    ...SERVE_FLAGS.map((f) => [f.name, { type: "bare" in f ? ("boolean" as const) : ("string" as const) }]),
    ["help", { type: "boolean" as const, short: "h" }],
  ]);
  const bare = new Set<string>(SERVE_FLAGS.filter((f) => "bare" in f).map((f) => f.name));
  // llama-server's multi-letter single-dash flags (`-np`, `-kvu`) would read as clusters of one-letter flags: they are
  // parsed as `--np` so that the report names them, as typed, with Keel's flag.
  const typed = new Map<string, string>();
  const args = argv.map((a) => {
    if (!/^-[A-Za-z]{2,}$/.test(a) || FOREIGN_FLAGS[a.slice(1)] === undefined) return a;
    typed.set(`-${a}`, a);
    return `-${a}`;
  });
  // Non-strict parsing with tokens, so that every unknown flag and every flag missing its value is reported in one
  // run instead of the first one only.
  const parsed = parseArgs({ args, options, strict: false, allowPositionals: true, tokens: true });
  const known = new Set(Object.keys(options));
  const unknown: string[] = [];
  const valueless: string[] = [];
  const values = new Map<string, string>();
  const tokens = parsed.tokens ?? [];
  for (const t of tokens) {
    if (t.kind !== "option") continue;
    if (!known.has(t.name)) unknown.push(typed.get(t.rawName) ?? t.rawName);
    else if (bare.has(t.name)) values.set(t.name, t.value ?? "true");
    // A value that is itself a flag (`--rest_port --max_num_seqs 4`) means the value was forgotten; that flag is
    // checked too (`--log_level --bogus` names both).
    else if (t.name !== "help" && (t.value === undefined || (!t.inlineValue && t.value.startsWith("--")))) {
      valueless.push(t.rawName);
      const swallowed = t.value?.slice(2).split("=")[0];
      if (swallowed !== undefined && !known.has(swallowed)) unknown.push(`--${swallowed}`);
    } else if (t.name !== "help" && t.value !== undefined) values.set(t.name, t.value);
  }
  const problems: string[] = [];
  if (unknown.length > 0) problems.push(`unknown flag${unknown.length > 1 ? "s" : ""} ${[...new Set(unknown)].map((f) => withKeelName(f, known)).join(", ")}`);
  if (valueless.length > 0) problems.push(`flag${valueless.length > 1 ? "s" : ""} ${valueless.join(", ")} need${valueless.length > 1 ? "" : "s"} a value`);
  // A value after a switch (`--pull true`) is a positional to the parser: say what the switch takes instead.
  const positionals: string[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!;
    if (t.kind !== "positional") continue;
    const prev = tokens[i - 1];
    if (prev?.kind === "option" && bare.has(prev.name) && prev.value === undefined) {
      problems.push(`${prev.rawName} takes no value (write ${prev.rawName} alone, or ${prev.rawName}=true|false)`);
    } else positionals.push(t.value);
  }
  if (positionals.length > 0) problems.push(`unexpected argument "${positionals[0]}"`);
  return { help: parsed.values["help"] === true, values, problems };
}

/** Each flag's value (given, else its default) through its schema; the problems in flag order. */
function parseValues(values: ReadonlyMap<string, string>): { out: Record<string, unknown>; problems: string[] } {
  const out: Record<string, unknown> = {};
  const problems: string[] = [];
  for (const f of SERVE_FLAGS as readonly FlagSpec[]) {
    const raw = values.get(f.name) ?? f.default;
    if (raw === undefined) {
      out[f.field ?? f.name] = undefined;
      continue;
    }
    const r = parseValue(f.value, raw);
    if (r.ok) out[f.field ?? f.name] = r.value;
    else problems.push(r.problem);
  }
  return { out, problems };
}

/**
 * Parse a `keel serve` command line: `--help`, or the typed options (defaults applied, `--plugin_config` keys mapped,
 * `--deterministic` applied, the notes to log at start).
 * @throws FlagError with a user-facing message naming every problem of the command line at once.
 */
export function parseServeCommand(argv: string[], host: HostCpus = hostCpus()): ServeCommand {
  const { help, values, problems } = readCommandLine(argv);
  // --help wins over bad values, not over a command line that cannot be read.
  if (help && problems.length === 0) return { help: true };
  const parsed = parseValues(values);
  problems.push(...parsed.problems);
  // Every value has passed its schema once `problems` is empty (checked below, with the plugin config's).
  const out = parsed.out as unknown as FlagValues;
  const notes: FlagNote[] = [];
  const given: ReadonlySet<string> = new Set(values.keys());
  const options: ServeOptions = { ...out, kv_cache_precision: out.kv_cache_precision ?? "f16", engine_threads: out.engine_threads ?? defaultEngineThreads(host), notes, given };
  // --plugin_config: its keys set other flags' values unless those flags are given too (OVMS's Doubled rule).
  const pluginRaw = values.get("plugin_config");
  if (pluginRaw !== undefined) {
    const plugin = parsePluginConfig(pluginRaw, given);
    problems.push(...plugin.problems);
    notes.push(...plugin.notes);
    if (plugin.kvCachePrecision !== undefined) options.kv_cache_precision = plugin.kvCachePrecision;
    if (plugin.threads !== undefined) options.engine_threads = plugin.threads;
    if (plugin.cacheDir !== undefined) options.cache_dir = plugin.cacheDir;
    if (plugin.promptLookup !== undefined) options.prompt_lookup = plugin.promptLookup;
    if (plugin.raw !== undefined) options.pluginConfig = plugin.raw;
    if (plugin.openvinoOnlyKv !== undefined) options.pluginOpenvinoOnlyKv = plugin.openvinoOnlyKv;
  }
  if (problems.length > 0) throw new FlagError(problems.join("; "));
  notes.push(threadsNote(options.engine_threads, given.has("engine_threads"), host), ...ovmsNotes(options, given));
  if (options.max_num_batched_tokens < options.max_num_seqs) {
    throw new FlagError(`--max_num_batched_tokens (${options.max_num_batched_tokens}) must be >= --max_num_seqs (${options.max_num_seqs})`);
  }
  if (options.deterministic) {
    // Deterministic mode turns off what changes the numerics between two runs of one request; an explicit request
    // for one of those contradicts it.
    if (values.get("enable_prefix_caching") === "true") throw new FlagError("--deterministic true turns prefix reuse off; it contradicts --enable_prefix_caching true");
    if (values.get("flash_attention") === "true") throw new FlagError("--deterministic true needs flash attention off; it contradicts --flash_attention true");
    if (options.kv_cache_precision === "u8") throw new FlagError("--deterministic true needs an f16 KV cache (u8 needs flash attention); it contradicts --kv_cache_precision u8");
    options.enable_prefix_caching = false;
    options.flash_attention = false;
    // The shared KV buffer is off unless asked for; `--kv_unified true` contradicts this mode on llama.cpp only (it is
    // what OpenVINO's KV always is), so that refusal is the engine's (cli/engine-choice.ts).
  }
  return { help: false, options };
}

/**
 * The options of a command line that serves (tests, tools): {@link parseServeCommand} without `--help`.
 * @throws FlagError naming every problem, or when the command line asks for `--help`
 */
export function parseServeFlags(argv: string[], host: HostCpus = hostCpus()): ServeOptions {
  const command = parseServeCommand(argv, host);
  if (command.help) throw new FlagError("--help asks for the list of flags, not for options to serve with");
  return command.options;
}

/** The engine threads line, always said at start; more threads than CPUs is a warning. */
function threadsNote(threads: number, given: boolean, host: HostCpus): FlagNote {
  if (!given && threads === defaultEngineThreads(host)) {
    return { level: "info", msg: `engine threads: ${threads} (${host.physicalCores} physical cores, ${host.logicalCpus} CPUs; rule: ${ENGINE_THREADS_RULE})` };
  }
  if (threads > host.logicalCpus) {
    // More threads than CPUs oversubscribes the cores (bench/threads.mjs: 0.01–0.03× of the best on 2 shared cores).
    return { level: "warn", msg: `engine threads: ${threads}, more than this host's ${host.logicalCpus} CPUs: expect a large slowdown (rule for the default: ${ENGINE_THREADS_RULE})` };
  }
  return { level: "info", msg: `engine threads: ${threads} (set; ${host.physicalCores} physical cores, ${host.logicalCpus} CPUs)` };
}

/** What the OVMS flags that change nothing (or little) here do, said at start instead of dropped. */
function ovmsNotes(o: ServeOptions, given: ReadonlySet<string>): FlagNote[] {
  const notes: FlagNote[] = [];
  if (given.has("cache_interval_multiplier")) {
    notes.push({ engine: "llama.cpp", level: "info", msg: `--cache_interval_multiplier ${o.cache_interval_multiplier} is a no-op here: it sets the state-block interval of linear-attention models in OpenVINO GenAI; llama.cpp keeps every token's KV for attention models and one state per sequence for recurrent ones` });
    notes.push({ engine: "openvino", level: "info", msg: `--cache_interval_multiplier ${o.cache_interval_multiplier}: applied (OpenVINO GenAI's linear-attention checkpoint interval on hybrid models with prefix caching: every KV block x ${o.cache_interval_multiplier} tokens; attention-only models do not use it)` });
  }
  if (given.has("rest_workers")) {
    notes.push({ level: "info", msg: `--rest_workers ${o.rest_workers} is a no-op here: Keel's gateway is one event loop without a worker pool; concurrency is bounded by --max_num_seqs and --max_queued_requests` });
  }
  if (given.has("pipeline_type")) notes.push({ level: "info", msg: `--pipeline_type ${o.pipeline_type}: Keel runs continuous batching (LM_CB) for every text model` });
  if (given.has("dynamic_split_fuse")) {
    notes.push({
      level: "info",
      msg: o.dynamic_split_fuse
        ? "--dynamic_split_fuse true: long prompts are prefilled in chunks of --max_num_batched_tokens, interleaved with decoding"
        : `--dynamic_split_fuse false: prompts longer than --max_num_batched_tokens (${o.max_num_batched_tokens}) are refused with 400, as OVMS`,
    });
  }
  return notes;
}

/** The flags a `--config_path` entry may set for its model, by name. */
export type EntrySettingName = keyof FlagValues & (typeof SERVE_FLAGS)[number]["name"];

/**
 * `options` with `settings` (a config entry's, as written) parsed by the same schemas as the flags.
 * @returns the options, and each bad setting's problem (the flag's message without its dashes)
 */
export function withSettings(options: ServeOptions, settings: Partial<Record<EntrySettingName, string>>): { options: ServeOptions; problems: string[] } {
  const out: Record<string, unknown> = { ...options };
  const problems: string[] = [];
  for (const [name, raw] of Object.entries(settings) as [EntrySettingName, string][]) {
    const spec = (SERVE_FLAGS as readonly FlagSpec[]).find((f) => f.name === name)!;
    const r = parseValue(spec.value, raw);
    if (r.ok) out[name] = r.value;
    else problems.push(r.problem.replace(`--${name}`, name));
  }
  return { options: out as unknown as ServeOptions, problems };
}

/** vLLM's and llama-server's flags whose Keel name is not their own with `_` for `-` (README's table). */
const FOREIGN_FLAGS: Readonly<Record<string, string>> = {
  "served-model-name": "model_name",
  alias: "model_name",
  model: "model_path",
  m: "model_path",
  host: "rest_bind_address",
  "api-key": "api_key_file",
  "tool-call-parser": "tool_parser",
  "enable-auto-tool-choice": "tool_parser",
  np: "max_num_seqs",
  "parallel": "max_num_seqs",
  c: "max_model_len",
  "ctx-size": "max_model_len",
  kvu: "kv_unified",
};

/** An unknown flag, with Keel's name for it when it is a vLLM or llama-server spelling (`--max-num-seqs`). */
function withKeelName(raw: string, known: ReadonlySet<string>): string {
  const name = raw.replace(/^-+/, "").split("=")[0]!;
  const keel = FOREIGN_FLAGS[name] ?? (known.has(name.replace(/-/g, "_")) ? name.replace(/-/g, "_") : undefined);
  return keel === undefined || !known.has(keel) ? raw : `${raw} (Keel's: --${keel})`;
}
