/**
 * `--config_path FILE`: OVMS's JSON configuration, the subset Keel serves (docs/models.md, "Several models"):
 *
 *   { "model_config_list": [ { "config": { "name": "a", "base_path": "model.gguf", "max_num_seqs": 4, … } } ] }
 *
 * `name` and `base_path` are OVMS's keys. OVMS keeps an LLM's engine settings in the model directory's graph.pbtxt;
 * Keel takes them in the same `config` object instead, under the names of its `keel serve` flags
 * ({@link MODEL_SETTINGS}). Any other key is refused with a message (nothing is accepted and ignored).
 *
 * This module only parses and checks the shape; turning an entry into an engine configuration is cli/serve-config.ts.
 */

/** Per-model settings a config entry may carry, named as the `keel serve` flags they override for that model. */
export const MODEL_SETTINGS = [
  "max_num_seqs",
  "max_num_batched_tokens",
  "max_model_len",
  "cache_size",
  "num_kv_blocks",
  "enable_prefix_caching",
  "kv_cache_precision",
  "target_device",
  "engine_threads",
  "max_queued_requests",
  "tool_parser",
  "reasoning_parser",
  "enable_tool_guided_generation",
] as const;
export type ModelSettingName = (typeof MODEL_SETTINGS)[number];

/** OVMS keys Keel does not serve, with why (the refusal names them). */
const OVMS_KEYS_REFUSED: Record<string, string> = {
  model_version_policy: "Keel serves one version per model",
  nireq: "Keel's concurrency is max_num_seqs",
  batch_size: "Keel batches continuously; use max_num_batched_tokens",
  shape: "not an LLM setting",
  layout: "not an LLM setting",
  plugin_config: "not supported per model in a config file yet; use the server's flags",
  stateful: "not an LLM setting",
};

/** One model of the config file. */
export interface ConfigEntry {
  name: string;
  /** As written: a GGUF file or a directory with one `.gguf` (relative to the config file's folder), a catalogue name or keel-tiny*. */
  basePath: string;
  /** The settings given for this model, as written (string form, checked by the flag parsers later). */
  settings: Partial<Record<ModelSettingName, string>>;
}

/** Parse a config file's text. @throws Error naming every problem found. */
export function parseConfigFile(text: string): ConfigEntry[] {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new Error(`the config file is not valid JSON: ${(err as Error).message}`);
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) throw new Error('the config file must be a JSON object with "model_config_list"');
  const problems: string[] = [];
  for (const key of Object.keys(doc)) {
    if (key === "model_config_list") continue;
    if (key === "mediapipe_config_list") problems.push('"mediapipe_config_list" is not supported: list each LLM under "model_config_list" with its GGUF base_path');
    else problems.push(`unknown top-level key "${key}" (Keel reads "model_config_list")`);
  }
  const list = (doc as { model_config_list?: unknown }).model_config_list;
  if (!Array.isArray(list) || list.length === 0) {
    problems.push('"model_config_list" must be a non-empty array of {"config": {...}}');
    throw new Error(problems.join("; "));
  }
  const entries: ConfigEntry[] = [];
  const names = new Set<string>();
  list.forEach((item: unknown, i) => {
    const where = `model_config_list[${i}]`;
    if (item === null || typeof item !== "object" || Array.isArray(item)) return void problems.push(`${where} must be an object {"config": {...}}`);
    for (const k of Object.keys(item)) if (k !== "config") problems.push(`${where}: unknown key "${k}" (only "config")`);
    const config = (item as { config?: unknown }).config;
    if (config === null || typeof config !== "object" || Array.isArray(config)) return void problems.push(`${where}.config must be an object`);
    const c = config as Record<string, unknown>;
    const name = c["name"];
    const basePath = c["base_path"];
    if (typeof name !== "string" || name.trim() === "") problems.push(`${where}.config.name must be a non-empty string`);
    else if (names.has(name)) problems.push(`model name "${name}" appears twice`);
    else names.add(name);
    if (typeof basePath !== "string" || basePath.trim() === "") problems.push(`${where}.config.base_path must be a non-empty string`);
    const settings: ConfigEntry["settings"] = {};
    for (const [k, v] of Object.entries(c)) {
      if (k === "name" || k === "base_path") continue;
      if ((MODEL_SETTINGS as readonly string[]).includes(k)) {
        if (typeof v === "string" || typeof v === "number" || typeof v === "boolean") settings[k as ModelSettingName] = String(v);
        else problems.push(`${where}.config.${k} must be a string, number or boolean`);
      } else if (k in OVMS_KEYS_REFUSED) {
        problems.push(`${where}.config.${k} is not supported: ${OVMS_KEYS_REFUSED[k]}`);
      } else {
        problems.push(`${where}.config: unknown key "${k}" (Keel accepts name, base_path, ${MODEL_SETTINGS.join(", ")})`);
      }
    }
    if (typeof name === "string" && typeof basePath === "string") entries.push({ name, basePath, settings });
  });
  if (problems.length > 0) throw new Error(problems.join("; "));
  return entries;
}
