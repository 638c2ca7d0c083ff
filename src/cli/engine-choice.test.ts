import path from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import { DEFAULT_ENGINE_COMMAND } from "../gateway/supervision/engine-client.js";
import { OPENVINO_WORKER } from "../engine-openvino/venv.js";
import { chooseEngine, engineBaseConfig, engineCommandFor, engineFlagProblems, openvinoConfigFields } from "./engine-choice.js";
import { parseServeFlags, type ServeOptions } from "./flags.js";

const HOST = { logicalCpus: 16, physicalCores: 16 };
const parse = (...argv: string[]): ServeOptions => parseServeFlags(argv, HOST);
const problems = (engine: "llama.cpp" | "openvino", ...argv: string[]): string[] => {
  const f = parse(...argv);
  return engineFlagProblems(engine, f, f.given);
};

describe("chooseEngine: --engine auto | llama.cpp | openvino", () => {
  const gguf = { kind: "file", path: "/m/model.gguf" };
  const ir = { kind: "openvino-ir", path: "/m/ir", gguf: null };
  const irWithGguf = { kind: "openvino-ir", path: "/m/ir", gguf: "/m/ir/model.gguf" };

  it("auto: an IR directory → openvino, a GGUF → llama.cpp", () => {
    expect(chooseEngine("auto", ir)).toEqual({ engine: "openvino", modelPath: "/m/ir", why: "an OpenVINO IR directory (--engine auto)" });
    expect(chooseEngine("auto", gguf)).toMatchObject({ engine: "llama.cpp", modelPath: "/m/model.gguf" });
    expect(chooseEngine("auto", { kind: "tiny", path: "/models/keel-tiny.gguf" }).engine).toBe("llama.cpp");
    // The IR saved next to a GGUF: the IR serves (it loads faster).
    expect(chooseEngine("auto", irWithGguf)).toMatchObject({ engine: "openvino", modelPath: "/m/ir" });
  });

  it("--engine openvino serves a GGUF or an IR directory", () => {
    expect(chooseEngine("openvino", gguf)).toMatchObject({ engine: "openvino", modelPath: "/m/model.gguf" });
    expect(chooseEngine("openvino", ir)).toMatchObject({ engine: "openvino", modelPath: "/m/ir", why: "--engine openvino" });
  });

  it("--engine llama.cpp refuses an IR directory clearly, unless a GGUF sits next to the IR", () => {
    expect(() => chooseEngine("llama.cpp", ir)).toThrow("--engine llama.cpp cannot serve /m/ir: it is an OpenVINO IR directory (openvino_model.xml) and llama.cpp serves GGUF files only; use --engine openvino (or auto), or pass a GGUF file");
    expect(chooseEngine("llama.cpp", irWithGguf)).toMatchObject({ engine: "llama.cpp", modelPath: "/m/ir/model.gguf" });
    expect(chooseEngine("llama.cpp", gguf)).toMatchObject({ engine: "llama.cpp", why: "--engine llama.cpp" });
  });
});

describe("flags per engine", () => {
  it("--engine and --num_kv_blocks parse; bad values are refused", () => {
    expect(parse()["engine"]).toBe("auto");
    expect(parse("--engine", "openvino", "--num_kv_blocks", "64")).toMatchObject({ engine: "openvino", num_kv_blocks: 64 });
    expect(() => parse("--engine", "vllm")).toThrow('--engine must be one of auto, llama.cpp, openvino, got "vllm"');
    expect(() => parse("--num_kv_blocks", "0")).toThrow(/--num_kv_blocks must be an integer between 1 and/);
  });

  it("--num_kv_blocks with the llama.cpp engine is refused (it has no shared pool); fine with openvino", () => {
    expect(problems("llama.cpp", "--num_kv_blocks", "16")).toEqual([expect.stringContaining("--num_kv_blocks sets the OpenVINO engine's shared KV block pool; the llama.cpp engine has none")]);
    expect(problems("openvino", "--num_kv_blocks", "16")).toEqual([]);
    expect(problems("llama.cpp")).toEqual([]);
  });

  it("--flash_attention true (a llama.cpp setting) is refused with openvino; a plugin value OpenVINO cannot take is named", () => {
    expect(problems("openvino", "--flash_attention", "true")).toEqual([expect.stringContaining("--flash_attention is a llama.cpp setting")]);
    expect(problems("openvino", "--flash_attention", "false")).toEqual([]);
    expect(problems("llama.cpp", "--flash_attention", "true")).toEqual([]);
    expect(problems("openvino", "--plugin_config", '{"NUM_STREAMS":2,"X":{"a":1}}')).toEqual(["--plugin_config X: the OpenVINO engine passes each key to OpenVINO as a string, number or boolean, got an object"]);
  });

  it("the OpenVINO fields of the engine configuration: kvBlocks, cacheGb (> 0 only), cacheIntervalMultiplier, the raw plugin config, deterministic, cacheDir", () => {
    const env = { KEEL_CACHE_DIR: "/var/cache/keel" };
    const f = parse("--num_kv_blocks", "16", "--cache_size", "2", "--plugin_config", '{"INFERENCE_PRECISION_HINT":"f32","PERFORMANCE_HINT":"LATENCY","NUM_STREAMS":1}', "--deterministic", "true", "--cache_interval_multiplier", "64");
    expect(openvinoConfigFields("openvino", f, env)).toEqual({
      kvBlocks: 16,
      cacheGb: 2,
      cacheIntervalMultiplier: 64,
      pluginConfig: { INFERENCE_PRECISION_HINT: "f32", PERFORMANCE_HINT: "LATENCY", NUM_STREAMS: 1 },
      deterministic: true,
      cacheDir: path.resolve("/var/cache/keel"),
    });
    expect(openvinoConfigFields("openvino", parse(), env)).toEqual({ deterministic: false, cacheDir: path.resolve("/var/cache/keel") });
    // llama.cpp gets none of them (it refuses kvBlocks and the raw plugin config).
    expect(openvinoConfigFields("llama.cpp", f, env)).toEqual({});
  });

  it("--plugin_config: llama.cpp's 'not applied' lines are for llama.cpp only; on openvino every key is said to be passed to OpenVINO", () => {
    const notes = parse("--plugin_config", '{"PERFORMANCE_HINT":"LATENCY","ENABLE_CPU_PINNING":true}').notes;
    const forEngine = (e: string) => notes.filter((n) => n.engine === undefined || n.engine === e).map((n) => n.msg);
    expect(forEngine("openvino").filter((m) => m.startsWith("--plugin_config"))).toEqual(["--plugin_config: every key is passed to OpenVINO as given (PERFORMANCE_HINT, ENABLE_CPU_PINNING)"]);
    expect(forEngine("llama.cpp").filter((m) => m.startsWith("--plugin_config"))).toEqual([
      expect.stringContaining("PERFORMANCE_HINT is an OpenVINO runtime property with no llama.cpp equivalent; not applied"),
      expect.stringContaining("ENABLE_CPU_PINNING true is not applied"),
    ]);
  });
});

describe("engineBaseConfig: one start configuration for the flags path and --config_path", () => {
  it("applies --dynamic_split_fuse false (a prompt must fit one step), --deterministic (no prefix reuse) and u8 KV", () => {
    const cfg = engineBaseConfig(parse("--dynamic_split_fuse", "false", "--max_num_batched_tokens", "512", "--kv_cache_precision", "u8"), "/m.gguf", "llama.cpp");
    expect(cfg).toMatchObject({ modelPath: "/m.gguf", maxPromptLen: 512, kvCacheType: "q8_0", flashAttention: true, prefixCaching: true });
    expect(engineBaseConfig(parse(), "/m.gguf", "llama.cpp").maxPromptLen).toBeUndefined();
    const det = parse("--deterministic", "true");
    expect(engineBaseConfig({ ...det, enable_prefix_caching: true }, "/m.gguf", "openvino").prefixCaching).toBe(false);
    expect(engineBaseConfig(parse("--engine", "openvino", "--num_kv_blocks", "16"), "/m.gguf", "openvino")).toMatchObject({ kvBlocks: 16 });
  });

  it("--warmup reaches the llama.cpp engine as auto / on / off; with OpenVINO true is refused, false and auto accepted", () => {
    expect(engineBaseConfig(parse(), "/m.gguf", "llama.cpp").warmup).toBe("auto");
    expect(engineBaseConfig(parse("--warmup", "true"), "/m.gguf", "llama.cpp").warmup).toBe("on");
    expect(engineBaseConfig(parse("--warmup", "false"), "/m.gguf", "llama.cpp").warmup).toBe("off");
    expect(engineBaseConfig(parse(), "/m.gguf", "openvino").warmup).toBeUndefined();
    expect(problems("openvino", "--warmup", "true")).toEqual([expect.stringContaining("--warmup true is a llama.cpp setting")]);
    expect(problems("openvino", "--warmup", "false")).toEqual([]);
    expect(problems("openvino", "--warmup", "auto")).toEqual([]);
    expect(problems("llama.cpp", "--warmup", "true")).toEqual([]);
    expect(() => parse("--warmup", "yes")).toThrow('--warmup must be one of auto, true, false, got "yes"');
  });

  it("--kv_unified true reaches the llama.cpp engine (absent otherwise); OpenVINO (a shared block pool) refuses false; node-llama-cpp's own addon refuses true", () => {
    expect(engineBaseConfig(parse(), "/m.gguf", "llama.cpp").kvUnified).toBeUndefined();
    expect(engineBaseConfig(parse("--kv_unified", "true"), "/m.gguf", "llama.cpp").kvUnified).toBe(true);
    expect(engineBaseConfig(parse("--kv_unified", "false"), "/m.gguf", "llama.cpp").kvUnified).toBeUndefined();
    expect(engineBaseConfig(parse("--kv_unified", "true"), "/m.gguf", "openvino").kvUnified).toBeUndefined();
    expect(problems("openvino", "--kv_unified", "false")).toEqual([expect.stringContaining("--kv_unified false is a llama.cpp setting")]);
    expect(problems("openvino", "--kv_unified", "true")).toEqual([]);
    expect(problems("llama.cpp", "--kv_unified", "false")).toEqual([]);
    expect(problems("llama.cpp", "--kv_unified", "true")).toEqual([]);
    const f = parse("--kv_unified", "true");
    expect(engineFlagProblems("llama.cpp", f, new Set(["kv_unified"]), { KEEL_NATIVE_SAMPLING: "off" })).toEqual([expect.stringContaining("KEEL_NATIVE_SAMPLING=off runs node-llama-cpp's own")]);
    expect(engineFlagProblems("llama.cpp", parse(), new Set(), { KEEL_NATIVE_SAMPLING: "off" })).toEqual([]);
    // --deterministic true refuses it on llama.cpp only: OpenVINO's KV is always one shared pool.
    const det = parse("--deterministic", "true", "--kv_unified", "true");
    expect(engineFlagProblems("llama.cpp", det, new Set(["deterministic", "kv_unified"]), {})).toEqual([expect.stringContaining("it contradicts --kv_unified true")]);
    expect(engineFlagProblems("openvino", det, new Set(["deterministic", "kv_unified"]), {})).toEqual([]);
    expect(() => parse("--kv_unified", "yes")).toThrow(/--kv_unified/);
  });

  it("KEEL_DECODE_OVERLAP is checked before any engine starts: not on/off, or on where nothing overlaps, is refused by name", () => {
    const env = (v: string) => ({ KEEL_DECODE_OVERLAP: v });
    const withEnv = (engine: "llama.cpp" | "openvino", v: string, ...args: string[]) => {
      const o = parse(...args);
      return engineFlagProblems(engine, o, o.given, env(v));
    };
    expect(withEnv("llama.cpp", "bogus", "--target_device", "GPU")).toEqual(['KEEL_DECODE_OVERLAP="bogus" is not on/off (1/0, true/false, yes/no)']);
    expect(withEnv("openvino", "bogus")).toEqual([expect.stringContaining('KEEL_DECODE_OVERLAP="bogus"')]);
    expect(withEnv("openvino", "on")).toEqual([expect.stringContaining("refused with --engine openvino")]);
    expect(withEnv("llama.cpp", "on")).toEqual([expect.stringContaining("with --target_device CPU there is none")]);
    expect(withEnv("llama.cpp", "on", "--target_device", "GPU")).toEqual([]);
    expect(withEnv("llama.cpp", "on", "--target_device", "AUTO")).toEqual([]);
    expect(withEnv("llama.cpp", "off")).toEqual([]);
    expect(withEnv("openvino", "0")).toEqual([]);
  });

  it("KEEL_MODEL_CHECK_CACHE is an on/off switch like the others: anything else is refused by name, on both engines", () => {
    const o = parse();
    expect(engineFlagProblems("llama.cpp", o, o.given, { KEEL_MODEL_CHECK_CACHE: "nope" })).toEqual(['KEEL_MODEL_CHECK_CACHE="nope" is not on/off (1/0, true/false, yes/no)']);
    expect(engineFlagProblems("openvino", o, o.given, { KEEL_MODEL_CHECK_CACHE: "nope" })).toEqual([expect.stringContaining("KEEL_MODEL_CHECK_CACHE")]);
    for (const v of ["off", "0", "on", "yes", ""]) expect(engineFlagProblems("llama.cpp", o, o.given, { KEEL_MODEL_CHECK_CACHE: v })).toEqual([]);
  });

  it("--deterministic with a --plugin_config precision key is refused on OpenVINO (it would void the exact numerics)", () => {
    expect(problems("openvino", "--deterministic", "true", "--plugin_config", '{"INFERENCE_PRECISION_HINT":"bf16"}')).toEqual([expect.stringContaining("--deterministic true needs the OpenVINO engine's exact numerics")]);
    expect(problems("openvino", "--deterministic", "true", "--plugin_config", '{"NUM_STREAMS":1}')).toEqual([]);
  });
});

describe("engineCommandFor", () => {
  afterEach(() => void vi.unstubAllEnvs());

  it("KEEL_ENGINE_COMMAND (the override) wins; llama.cpp is this package's engine; openvino runs worker.py with the venv's python", async () => {
    const fake = { command: "node", args: ["fake-engine.mjs"] };
    expect(await engineCommandFor("openvino", fake, () => undefined)).toBe(fake);
    expect(await engineCommandFor("llama.cpp", null, () => undefined)).toBe(DEFAULT_ENGINE_COMMAND);
    vi.stubEnv("KEEL_OPENVINO_PYTHON", "/opt/ov/bin/python");
    expect(await engineCommandFor("openvino", null, () => undefined)).toEqual({ command: "/opt/ov/bin/python", args: [OPENVINO_WORKER] });
  });
});
