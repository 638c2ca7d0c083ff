import { describe, expect, it } from "vitest";
import type { EngineConfig } from "../protocol/engine-config.js";
import { parseEngineConfig, toAdapterOptions } from "./start-config.js";

const config: EngineConfig = {
  mode: "serve",
  modelPath: "/m.gguf",
  maxNumSeqs: 4,
  maxNumBatchedTokens: 64,
  maxModelLen: 512,
  prefixCaching: true,
  threads: 2,
  flashAttention: false,
  kvCacheType: "f16",
  device: "cpu",
  generation: 3,
};

describe("engine start configuration", () => {
  it("parses the engine-neutral EngineConfig", () => {
    expect(parseEngineConfig(JSON.stringify(config))).toEqual(config);
  });

  it("maps it onto the llama.cpp adapter: sequences, context, batch, device", () => {
    expect(toAdapterOptions({ ...config, device: "auto" })).toEqual({
      modelPath: "/m.gguf",
      sequences: 4,
      contextSize: 512,
      batchSize: 64,
      threads: 2,
      flashAttention: false,
      kvCacheType: "f16",
      gpu: "auto",
      kvUnified: false,
    });
    expect(toAdapterOptions({ ...config, kvUnified: true }).kvUnified).toBe(true);
  });

  it("names what is missing or invalid", () => {
    expect(() => parseEngineConfig(undefined)).toThrow(/missing the EngineConfig JSON argument/);
    const { maxModelLen: _dropped, ...noLen } = config;
    expect(() => parseEngineConfig(JSON.stringify(noLen))).toThrow("EngineConfig.maxModelLen is missing or invalid: undefined");
    expect(() => parseEngineConfig(JSON.stringify({ ...config, device: "npu" }))).toThrow('EngineConfig.device is missing or invalid: "npu"');
    expect(parseEngineConfig(JSON.stringify({ ...config, device: "gpu" })).device).toBe("gpu");
    expect(() => parseEngineConfig(JSON.stringify({ ...config, maxPromptLen: 0 }))).toThrow("EngineConfig.maxPromptLen is missing or invalid: 0");
    expect(parseEngineConfig(JSON.stringify({ ...config, maxPromptLen: 64 })).maxPromptLen).toBe(64);
    expect(() => parseEngineConfig(JSON.stringify({ ...config, kvUnified: "on" }))).toThrow('EngineConfig.kvUnified is missing or invalid: "on"');
    expect(parseEngineConfig(JSON.stringify({ ...config, kvUnified: true })).kvUnified).toBe(true);
    // The OpenVINO engine's fields are refused (the engine then exits with a fatal), never ignored.
    expect(() => parseEngineConfig(JSON.stringify({ ...config, kvBlocks: 16 }))).toThrow("EngineConfig.kvBlocks (--num_kv_blocks 16) is not supported by the llama.cpp engine: it has no shared KV block pool");
    expect(() => parseEngineConfig(JSON.stringify({ ...config, pluginConfig: { NUM_STREAMS: 2 } }))).toThrow(/EngineConfig.pluginConfig .* is not supported by the llama.cpp engine/);
    // The adapter's own option names are not the protocol's.
    expect(() => parseEngineConfig(JSON.stringify({ ...config, maxNumSeqs: undefined, sequences: 4 }))).toThrow(/maxNumSeqs/);
  });
});
