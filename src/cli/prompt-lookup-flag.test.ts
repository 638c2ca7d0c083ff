/** `--prompt_lookup` and OVMS's `--plugin_config {"prompt_lookup": true}`: parsed, passed to llama.cpp, refused elsewhere. */
import { describe, expect, it } from "vitest";
import { engineBaseConfig, engineFlagProblems } from "./engine-choice.js";
import { parseServeFlags, type ServeOptions } from "./flags.js";

const HOST = { logicalCpus: 16, physicalCores: 16 };
const parse = (...argv: string[]): ServeOptions => parseServeFlags(argv, HOST);

describe("--prompt_lookup", () => {
  it("is off by default and on with --prompt_lookup true or the plugin_config key", () => {
    expect(parse().prompt_lookup).toBe(false);
    expect(parse("--prompt_lookup", "true").prompt_lookup).toBe(true);
    expect(parse("--plugin_config", '{"prompt_lookup": true}').prompt_lookup).toBe(true);
    expect(parse("--plugin_config", '{"prompt_lookup": "false"}').prompt_lookup).toBe(false);
  });

  it("refuses a bad value, and the key given both ways (OVMS's Doubled rule)", () => {
    expect(() => parse("--prompt_lookup", "yes please")).toThrow(/prompt_lookup/);
    expect(() => parse("--plugin_config", '{"prompt_lookup": 3}')).toThrow(/prompt_lookup must be true or false, got 3/);
    expect(() => parse("--prompt_lookup", "true", "--plugin_config", '{"prompt_lookup": true}')).toThrow(/Doubled prompt_lookup/);
  });

  it("reaches the llama.cpp engine's start configuration; the OpenVINO engine and --deterministic refuse it", () => {
    const on = parse("--prompt_lookup", "true");
    expect(engineBaseConfig(on, "/m.gguf", "llama.cpp").promptLookup).toBe(true);
    expect(engineBaseConfig(parse(), "/m.gguf", "llama.cpp").promptLookup).toBeUndefined();
    expect(engineFlagProblems("llama.cpp", on, on.given)).toEqual([]);
    expect(engineFlagProblems("openvino", on, on.given).join()).toMatch(/--prompt_lookup .* refused with --engine openvino/);
    const det = parse("--prompt_lookup", "true", "--deterministic", "true");
    expect(engineFlagProblems("llama.cpp", det, det.given).join()).toMatch(/contradicts --deterministic true/);
  });
});
