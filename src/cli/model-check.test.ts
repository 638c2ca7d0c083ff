import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { checkModelFile, pluginConfigRefusal } from "./model-check.js";

describe("checkModelFile", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-modelfile-"));
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  it("a directory gets a clear message (not EISDIR)", () => {
    expect(checkModelFile(dir)).toBe(`${dir} is a directory; --model_path needs a GGUF model file`);
  });

  it("a missing file, a file that is not GGUF, and an empty file are named as such", () => {
    const missing = path.join(dir, "missing.gguf");
    expect(checkModelFile(missing)).toBe(`the model file ${missing} does not exist`);
    const text = path.join(dir, "text.gguf");
    fs.writeFileSync(text, "hello world");
    expect(checkModelFile(text)).toMatch(/is not a GGUF file/);
    const empty = path.join(dir, "empty.gguf");
    fs.writeFileSync(empty, "");
    expect(checkModelFile(empty)).toMatch(/is not a GGUF file/);
  });

  it("a file starting with the GGUF magic passes the cheap check (the engine's load decides the rest)", () => {
    const f = path.join(dir, "magic.gguf");
    fs.writeFileSync(f, Buffer.from("GGUF\x03\x00\x00\x00", "latin1"));
    expect(checkModelFile(f)).toBeNull();
  });
});

describe("pluginConfigRefusal: a --plugin_config OpenVINO refused, told apart from other load failures", () => {
  it("names the flag and the key OpenVINO's refusal names (a value or an unknown key)", () => {
    const keys = ["CPU_RUNTIME_CACHE_CAPACITY", "NUM_STREAMS"];
    expect(pluginConfigRefusal("engine failed: Exception from src/plugins/intel_cpu/src/config.cpp:278: Wrong value abc for property key CPU_RUNTIME_CACHE_CAPACITY. Expected only integer numbers", keys)).toBe(
      "--plugin_config CPU_RUNTIME_CACHE_CAPACITY: OpenVINO refused it while loading the model",
    );
    expect(pluginConfigRefusal("NotFound: Unsupported property NOT_A_KEY by CPU plugin.", ["NOT_A_KEY"])).toBe("--plugin_config NOT_A_KEY: OpenVINO refused it while loading the model");
  });

  it("is null for a failure that only mentions a key, and names no key that is only part of another word", () => {
    expect(pluginConfigRefusal("engine failed: out of memory while compiling NUM_STREAMS=4 model", ["NUM_STREAMS"])).toBeNull();
    expect(pluginConfigRefusal("Wrong value x for property key CPU_RUNTIME_CACHE_CAPACITY", ["CACHE"])).toBe("--plugin_config: OpenVINO refused it while loading the model");
    expect(pluginConfigRefusal("Wrong value x for property key K", [])).toBeNull();
  });

  it("takes the key from the refusal's own words before any other key that appears in the text, and knows OpenVINO's other refusal phrasings", () => {
    const prep = "compiling the model for CPU (OpenVINO)… | engine failed: ";
    expect(pluginConfigRefusal(`${prep}Wrong value FAST for property key PERFORMANCE_HINT`, ["for", "PERFORMANCE_HINT"])).toBe("--plugin_config PERFORMANCE_HINT: OpenVINO refused it while loading the model");
    expect(pluginConfigRefusal(`${prep}Wrong value -5 for property key NUM_STREAMS`, ["key", "NUM_STREAMS"])).toBe("--plugin_config NUM_STREAMS: OpenVINO refused it while loading the model");
    expect(pluginConfigRefusal(`${prep}Could not read number of streams from str: abc; stoi`, ["NUM_STREAMS"])).toBe("--plugin_config: OpenVINO refused it while loading the model");
    expect(pluginConfigRefusal(`${prep}Could not convert to bool from string x`, ["ENABLE_MMAP"])).toBe("--plugin_config: OpenVINO refused it while loading the model");
    expect(pluginConfigRefusal(`${prep}expect kvcache type bf16, current: u3 , u3`, ["KV_CACHE_PRECISION"])).toBe("--plugin_config: OpenVINO refused it while loading the model");
  });
});
