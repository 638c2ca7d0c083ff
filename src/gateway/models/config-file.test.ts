import { describe, expect, it } from "vitest";
import { MODEL_SETTINGS, parseConfigFile } from "./config-file.js";

const doc = (entries: unknown[], extra: Record<string, unknown> = {}) => JSON.stringify({ model_config_list: entries, ...extra });

describe("parseConfigFile (OVMS's config.json, Keel's subset)", () => {
  it("reads name, base_path and per-model settings (numbers and booleans as the flags' text)", () => {
    const entries = parseConfigFile(
      doc([{ config: { name: "a", base_path: "a.gguf", max_num_seqs: 4, enable_prefix_caching: false, tool_parser: "hermes3" } }, { config: { name: "b", base_path: "keel-tiny" } }]),
    );
    expect(entries).toEqual([
      { name: "a", basePath: "a.gguf", settings: { max_num_seqs: "4", enable_prefix_caching: "false", tool_parser: "hermes3" } },
      { name: "b", basePath: "keel-tiny", settings: {} },
    ]);
  });

  it("accepts every documented per-model setting", () => {
    const config: Record<string, unknown> = { name: "a", base_path: "a.gguf" };
    for (const k of MODEL_SETTINGS) config[k] = "1";
    expect(Object.keys(parseConfigFile(doc([{ config }]))[0]!.settings).sort()).toEqual([...MODEL_SETTINGS].sort());
  });

  it("refuses unknown and unsupported keys, naming each one in one message", () => {
    const run = () => parseConfigFile(doc([{ config: { name: "a", base_path: "a.gguf", nireq: 2, colour: "red" }, extra: 1 }], { monitoring: {} }));
    expect(run).toThrow(/unknown top-level key "monitoring"/);
    expect(run).toThrow(/model_config_list\[0\]: unknown key "extra"/);
    expect(run).toThrow(/config\.nireq is not supported/);
    expect(run).toThrow(/unknown key "colour"/);
  });

  it("refuses a missing name or base_path, duplicate names, an empty list, non-JSON and mediapipe graphs", () => {
    expect(() => parseConfigFile(doc([{ config: { base_path: "a.gguf" } }]))).toThrow(/config\.name must be a non-empty string/);
    expect(() => parseConfigFile(doc([{ config: { name: "a" } }]))).toThrow(/config\.base_path must be a non-empty string/);
    expect(() => parseConfigFile(doc([{ config: { name: "a", base_path: "x" } }, { config: { name: "a", base_path: "y" } }]))).toThrow(/"a" appears twice/);
    expect(() => parseConfigFile(doc([]))).toThrow(/non-empty array/);
    expect(() => parseConfigFile("{not json")).toThrow(/not valid JSON/);
    expect(() => parseConfigFile(doc([{ config: { name: "a", base_path: "x" } }], { mediapipe_config_list: [] }))).toThrow(/mediapipe_config_list" is not supported/);
    expect(() => parseConfigFile(doc([{ config: { name: "a", base_path: "x", max_num_seqs: [1] } }]))).toThrow(/max_num_seqs must be a string, number or boolean/);
  });
});
