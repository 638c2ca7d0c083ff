import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { CACHE_ROOT_RULE, keelCacheRoot } from "../model/model-cache.js";
import { engineFlagProblems } from "./engine-choice.js";
import { defaultEngineThreads, physicalCoresFromCpuinfo } from "./engine-threads.js";
import { metricFamilyNames, usage } from "./flag-table.js";
import { parseTargetDevice } from "./flag-values.js";
import { FlagError, parseServeCommand, parseServeFlags, withSettings, type ServeOptions } from "./flags.js";
import { parsePluginConfig } from "./plugin-config.js";

/** A 16-core host without hyper-threads, so that defaults do not depend on the machine running the tests. */
const HOST = { logicalCpus: 16, physicalCores: 16 };
const parse = (...argv: string[]): ServeOptions => parseServeFlags(argv, HOST);
const notes = (f: ServeOptions): string[] => f.notes.map((n) => `${n.level}: ${n.msg}`);

/** The seed's command line (issue #10), as a shell passes it. */
const SEED = ["--task=text_generation", "--target_device=GPU", '--plugin_config={"ENABLE_CPU_PINNING":false}', "--tool_parser", "qwen3coder", "--enable_tool_guided_generation", "true", "--reasoning_parser", "qwen3", "--kv_cache_precision", "u8", "--cache_size", "4", "--enable_prefix_caching", "true", "--cache_interval_multiplier", "64", "--max_num_seqs", "16", "--max_num_batched_tokens", "4096"];

describe("the seed's command line", () => {
  it("parses unchanged, every flag with its OVMS meaning", () => {
    const f = parse(...SEED);
    expect([f["task"], f["target_device"], f["tool_parser"], f["enable_tool_guided_generation"], f["reasoning_parser"]]).toEqual(["text_generation", "gpu", "qwen3coder", true, "qwen3"]);
    expect([f["kv_cache_precision"], f["cache_size"], f["enable_prefix_caching"], f["cache_interval_multiplier"], f["max_num_seqs"], f["max_num_batched_tokens"]]).toEqual(["u8", 4, true, 64, 16, 4096]);
    // The flags that change nothing in llama.cpp say so instead of being dropped.
    expect(notes(f).some((n) => n.startsWith("info: --plugin_config ENABLE_CPU_PINNING false"))).toBe(true);
    expect(notes(f).some((n) => n.startsWith("info: --cache_interval_multiplier 64 is a no-op"))).toBe(true);
  });

  it("--flag=value and --flag value give the same result", () => {
    const spaced = parse("--max_num_seqs", "4", "--target_device", "CPU", "--plugin_config", '{"KV_CACHE_PRECISION":"u8"}');
    const inline = parse("--max_num_seqs=4", "--target_device=CPU", '--plugin_config={"KV_CACHE_PRECISION":"u8"}');
    for (const k of ["max_num_seqs", "target_device", "kv_cache_precision"] as const) expect(inline[k]).toEqual(spaced[k]);
    expect([spaced["max_num_seqs"], spaced["target_device"], spaced["kv_cache_precision"]]).toEqual([4, "cpu", "u8"]);
  });
});

describe("OVMS flags: accepted with their meaning", () => {
  it("--target_device maps CPU, GPU, GPU.0 and AUTO onto the engine's devices", () => {
    expect(["CPU", "GPU", "GPU.0", "AUTO", "AUTO:GPU,CPU"].map(parseTargetDevice)).toEqual(["cpu", "gpu", "gpu", "auto", "auto"]);
    expect(parse()["target_device"]).toBe("cpu");
  });

  it("--pipeline_type LM, LM_CB, AUTO; --dynamic_split_fuse true; --rest_workers 2..10000; --port 0; --metrics_enable true", () => {
    for (const v of ["LM", "LM_CB", "AUTO"]) expect(parse("--pipeline_type", v)["pipeline_type"]).toBe(v);
    expect(parse("--dynamic_split_fuse", "true")["dynamic_split_fuse"]).toBe(true);
    const off = parse("--dynamic_split_fuse", "false", "--max_num_batched_tokens", "64");
    expect(off["dynamic_split_fuse"]).toBe(false);
    expect(notes(off)).toContain("info: --dynamic_split_fuse false: prompts longer than --max_num_batched_tokens (64) are refused with 400, as OVMS");
    const f = parse("--rest_workers", "2", "--port", "0", "--metrics_enable", "true");
    expect([f["rest_workers"], f["port"], f["metrics_enable"]]).toEqual([2, 0, true]);
    expect(notes(f).some((n) => n.includes("--rest_workers 2 is a no-op"))).toBe(true);
    expect(parse("--rest_workers", "10000")["rest_workers"]).toBe(10000);
  });

  it("--log_path, --log_format, --cache_dir and TRACE logging", () => {
    const f = parse("--log_path", "/tmp/k.log", "--log_format", "text", "--cache_dir", "/tmp/c", "--log_level", "TRACE");
    expect([f["log_path"], f["log_format"], f["cache_dir"], f["log_level"]]).toEqual(["/tmp/k.log", "text", "/tmp/c", "TRACE"]);
  });

  it("--metrics_list names each family once, however often it is given (a second TYPE line fails a Prometheus scrape)", () => {
    expect(parse("--metrics_list", "keel_engine_steps_total,,keel_engine_steps_total, process_cpu_seconds_total")["metricsList"]).toEqual(["keel_engine_steps_total", "process_cpu_seconds_total"]);
  });

  it("--metrics_list takes known families: Keel's, the vLLM-named gauges and the OVMS families", () => {
    const [a, b] = metricFamilyNames();
    expect(parse("--metrics_list", `${a},${b}`)["metricsList"]).toEqual([a, b]);
    expect(parse("--metrics_list", "vllm:num_requests_running,ovms_requests_success,keel_engine_steps_total")["metricsList"]).toEqual([
      "vllm:num_requests_running", "ovms_requests_success", "keel_engine_steps_total",
    ]);
  });

  it("flags served by other modules are parsed into their camelCase fields; switches take no value", () => {
    const f = parse("--config_path", "c.json", "--source_model", "org/m", "--model_repository_path", "/m", "--pull", "--gguf_filename", "m.gguf", "--overwrite_models",
      "--api_key_file", "k.txt", "--allowed_origins", "http://a, http://b", "--allowed_methods", "GET,POST", "--allowed_headers", "x-a", "--allow_credentials=false");
    expect(f).toMatchObject({ configPath: "c.json", sourceModel: "org/m", modelRepositoryPath: "/m", pull: true, ggufFilename: "m.gguf", overwriteModels: true,
      apiKeyFile: "k.txt", allowedOrigins: ["http://a", "http://b"], allowedMethods: ["GET", "POST"], allowedHeaders: ["x-a"], allowCredentials: false });
    expect(parse()["pull"]).toBeUndefined();
    expect(() => parse("--pull", "true")).toThrow("--pull takes no value (write --pull alone, or --pull=true|false)");
    expect(() => parse("--max_num_seqs", "4", "stray")).toThrow('unexpected argument "stray"');
  });
});

describe("OVMS flags: refused with why and what to use", () => {
  const refusals: [string[], RegExp][] = [
    [["--task", "embeddings"], /--task embeddings is not supported: .*--task text_generation/],
    [["--target_device", "GPU.1"], /GPU\.1: Keel cannot pick a GPU by index; .*CUDA_VISIBLE_DEVICES=1.*--target_device GPU/],
    [["--target_device", "NPU"], /--target_device NPU is not supported/],
    [["--target_device", "TPU"], /--target_device must be one of CPU, GPU, GPU\.0, AUTO/],
    [["--pipeline_type", "VLM_CB"], /--pipeline_type VLM_CB is not supported: Keel serves text-only models/],
    [["--dynamic_split_fuse", "maybe"], /--dynamic_split_fuse must be true or false/],
    [["--rest_workers", "1"], /--rest_workers must be an integer between 2 and 10000/],
    [["--port", "9000"], /--port 9000 is not supported: Keel serves no gRPC.*--rest_port/],
    [["--grpc_bind_address", "0.0.0.0"], /--grpc_bind_address is not supported: .*--rest_bind_address/],
    [["--max_prompt_len", "1024"], /--max_prompt_len is not supported: it is NPU-only/],
    [["--model_distribution_policy", "TENSOR_PARALLEL"], /--model_distribution_policy is not supported/],
    [["--draft_source_model", "org/d"], /--draft_source_model is not supported: Keel has no draft-model speculative decoding/],
    [["--allowed_local_media_path", "/x"], /--allowed_local_media_path is not supported: .*text-only/],
    [["--allowed_media_domains", "all"], /--allowed_media_domains is not supported/],
    [["--weight-format", "int8"], /--weight-format is not supported/],
    [["--metrics_enable", "false"], /--metrics_enable false is not supported: Keel always serves \/metrics/],
    [["--metrics_list", "keel_engine_steps_total,nope"], /--metrics_list names unknown metric family nope/],
    [["--metrics_list", ""], /--metrics_list names no metric family: leave it out/],
    [["--metrics_list", " , "], /--metrics_list names no metric family/],
    [["--cache_interval_multiplier", "0"], /--cache_interval_multiplier must be an integer/],
    [["--log_format", "yaml"], /--log_format must be one of text, json/],
  ];
  for (const [argv, message] of refusals) {
    it(`${argv.join(" ")}`, () => expect(() => parse(...argv)).toThrow(message));
  }

  it("every problem of the command line in one message, without the help text", () => {
    let message = "";
    try {
      parse("--bogus", "--task=rerank", "--port", "1", "--other=x");
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/^unknown flags --bogus, --other; --task rerank is not supported.*; --port 1 is not supported/);
    expect(message).not.toContain("Flags:");
  });
});

describe("--plugin_config", () => {
  it("maps KV_CACHE_PRECISION and INFERENCE_NUM_THREADS onto the engine", () => {
    const f = parse("--plugin_config", '{"KV_CACHE_PRECISION":"u8","INFERENCE_NUM_THREADS":3}');
    expect([f["kv_cache_precision"], f["engine_threads"]]).toEqual(["u8", 3]);
  });

  it("refuses a key that another flag also sets (OVMS's Doubled rule)", () => {
    expect(() => parse("--kv_cache_precision", "u8", "--plugin_config", '{"KV_CACHE_PRECISION":"u8"}')).toThrow("Doubled KV_CACHE_PRECISION parameter in plugin config (--kv_cache_precision sets it too; give it once)");
    expect(() => parse("--engine_threads", "2", "--plugin_config", '{"INFERENCE_NUM_THREADS":2}')).toThrow(/Doubled INFERENCE_NUM_THREADS/);
  });

  it("warns about keys it does not apply, and says what ENABLE_CPU_PINNING true does not do", () => {
    const r = parsePluginConfig('{"PERFORMANCE_HINT":"LATENCY","FOO":1,"ENABLE_CPU_PINNING":true}', new Set());
    expect(r.problems).toEqual([]);
    // The llama.cpp engine's lines (the OpenVINO engine applies every key: cli/engine-choice.test.ts).
    r.notes = r.notes.filter((n) => n.engine !== "openvino");
    expect(r.notes.map((n) => n.level)).toEqual(["warn", "warn", "warn"]);
    expect(r.notes[0]!.msg).toMatch(/PERFORMANCE_HINT is an OpenVINO runtime property with no llama.cpp equivalent/);
    expect(r.notes[1]!.msg).toMatch(/FOO is not a property Keel knows/);
    expect(r.notes[2]!.msg).toMatch(/ENABLE_CPU_PINNING true is not applied/);
  });

  it("refuses invalid JSON, a non-object and bad values", () => {
    expect(() => parse("--plugin_config", "{oops")).toThrow(/--plugin_config is not valid JSON/);
    expect(() => parse("--plugin_config", "[1]")).toThrow(/--plugin_config must be a JSON object, got an array/);
    expect(() => parse("--plugin_config", "[".repeat(5000) + "]".repeat(5000))).toThrow(/--plugin_config must be a JSON object, got an array/);
    expect(() => parse("--plugin_config", "7")).toThrow(/--plugin_config must be a JSON object, got a number/);
    expect(() => parse("--plugin_config", '{"KV_CACHE_PRECISION":5}')).toThrow(/KV_CACHE_PRECISION must be a precision name/);
    // An OpenVINO-only precision passes the flags; the llama.cpp engine refuses it once the engine is known.
    const bf16 = parse("--plugin_config", '{"KV_CACHE_PRECISION":"bf16"}');
    expect(bf16["pluginOpenvinoOnlyKv"]).toBe("bf16");
    expect(engineFlagProblems("llama.cpp", bf16, new Set(["plugin_config"]))).toEqual([expect.stringContaining('KV_CACHE_PRECISION "bf16" is an OpenVINO precision')]);
    expect(engineFlagProblems("openvino", bf16, new Set(["plugin_config"]))).toEqual([]);
    // Tool-guided generation: both engines apply guides (OpenVINO as XGrammar structural tags, issue #19).
    const guided = parse("--enable_tool_guided_generation", "true", "--tool_parser", "hermes3");
    expect(engineFlagProblems("openvino", guided, new Set(["enable_tool_guided_generation"]))).toEqual([]);
    expect(engineFlagProblems("llama.cpp", guided, new Set(["enable_tool_guided_generation"]))).toEqual([]);
    expect(() => parse("--plugin_config", '{"INFERENCE_NUM_THREADS":-1}')).toThrow(/INFERENCE_NUM_THREADS must be an integer/);
  });
});

describe("engine threads default", () => {
  it("1 on <= 2 CPUs, else physical cores - 1, never more than the CPUs the process may use", () => {
    expect(defaultEngineThreads({ logicalCpus: 1, physicalCores: 1 })).toBe(1);
    expect(defaultEngineThreads({ logicalCpus: 2, physicalCores: 2 })).toBe(1);
    expect(defaultEngineThreads({ logicalCpus: 2, physicalCores: 1 })).toBe(1);
    expect(defaultEngineThreads({ logicalCpus: 4, physicalCores: 4 })).toBe(3);
    expect(defaultEngineThreads({ logicalCpus: 32, physicalCores: 16 })).toBe(15);
    expect(defaultEngineThreads({ logicalCpus: 4, physicalCores: 64 })).toBe(3);
    expect(parseServeFlags([], { logicalCpus: 16, physicalCores: 8 })["engine_threads"]).toBe(7);
    expect(parseServeFlags(["--engine_threads", "5"], { logicalCpus: 16, physicalCores: 8 })["engine_threads"]).toBe(5);
  });

  it("the thread count is always said at start; more threads than CPUs is a warning", () => {
    const notes = (argv: string[]) => parseServeFlags(argv, { logicalCpus: 2, physicalCores: 2 }).notes.filter((n) => n.msg.startsWith("engine threads"));
    expect(notes([])).toEqual([{ level: "info", msg: expect.stringContaining("engine threads: 1 (") }]);
    expect(notes(["--engine_threads", "2"])).toEqual([{ level: "info", msg: expect.stringContaining("engine threads: 2 (set;") }]);
    expect(notes(["--engine_threads=3"])).toEqual([{ level: "warn", msg: expect.stringContaining("more than this host's 2 CPUs") }]);
  });

  it("physical cores are the distinct (physical id, core id) pairs of /proc/cpuinfo", () => {
    const cpu = (p: number, c: number): string => `processor\t: x\nphysical id\t: ${p}\ncore id\t\t: ${c}\n\n`;
    expect(physicalCoresFromCpuinfo(cpu(0, 0) + cpu(0, 0) + cpu(0, 1) + cpu(0, 1))).toBe(2);
    expect(physicalCoresFromCpuinfo(cpu(0, 0) + cpu(1, 0))).toBe(2);
    expect(physicalCoresFromCpuinfo("processor\t: 0\n")).toBeNull();
  });
});


describe("parseServeFlags", () => {
  it("names Keel's flag for a vLLM or llama-server spelling", () => {
    expect(() => parseServeFlags(["--served-model-name", "foo"])).toThrow(/unknown flag --served-model-name \(Keel's: --model_name\)/);
    expect(() => parseServeFlags(["--max-num-seqs=4", "--host", "::"])).toThrow(/--max-num-seqs \(Keel's: --max_num_seqs\), --host \(Keel's: --rest_bind_address\)/);
    expect(() => parseServeFlags(["--bogus-flag", "1"])).toThrow(/unknown flag --bogus-flag;|unknown flag --bogus-flag$/);
    // llama-server's multi-letter single-dash flags are named as typed, not as clusters of one-letter flags.
    expect(() => parseServeFlags(["-np", "4", "-kvu"])).toThrow(/unknown flags -np \(Keel's: --max_num_seqs\), -kvu \(Keel's: --kv_unified\)/);
    expect(() => parseServeFlags(["-xyz"])).toThrow(/unknown flags -x, -y, -z/);
  });

  it("reports every unknown flag in one message", () => {
    expect(() => parseServeFlags(["--no_such", "1", "--max_num_seqs", "4", "--other=2", "--third"])).toThrow("unknown flags --no_such, --other, --third");
  });

  it("reports unknown flags, missing values and bad values together", () => {
    expect(() => parseServeFlags(["--bogus", "1", "--rest_port"])).toThrow("unknown flag --bogus; flag --rest_port needs a value");
    // A flag swallowed as the value of another is named too.
    expect(() => parseServeFlags(["--log_level", "--bogus"])).toThrow("unknown flag --bogus; flag --log_level needs a value");
    expect(() => parseServeFlags(["--nope", "--max_num_seqs", "0", "--log_level", "LOUD"])).toThrow(
      /^unknown flag --nope; --max_num_seqs must be an integer between 1 and 256, got "0"; .*log_level/,
    );
  });

  it("reports every known flag that misses its value", () => {
    expect(() => parseServeFlags(["--rest_port", "--max_num_seqs"])).toThrow("flag --rest_port needs a value");
    expect(() => parseServeFlags(["--model_name", "--rest_port", "1", "--max_num_seqs"])).toThrow("flags --model_name, --max_num_seqs need a value");
  });

  it("--deterministic true turns prefix reuse, flash attention and the shared KV buffer off", () => {
    const f = parseServeFlags(["--deterministic", "true"]);
    expect([f["deterministic"], f["enable_prefix_caching"], f["flash_attention"], f["kv_unified"]]).toEqual([true, false, false, false]);
    const d = parse();
    expect([d["deterministic"], d["enable_prefix_caching"], d["kv_unified"]]).toEqual([false, true, false]);
  });

  it("--deterministic true refuses flags that contradict it", () => {
    expect(() => parseServeFlags(["--deterministic", "true", "--enable_prefix_caching", "true"])).toThrow(/contradicts --enable_prefix_caching true/);
    expect(() => parseServeFlags(["--deterministic", "true", "--flash_attention", "true"])).toThrow(/contradicts --flash_attention true/);
    expect(() => parseServeFlags(["--deterministic", "true", "--kv_cache_precision", "u8"])).toThrow(/contradicts --kv_cache_precision u8/);
    // --kv_unified true is refused with the llama.cpp engine only (engine-choice.ts): OpenVINO's KV is always shared.
    expect(parseServeFlags(["--deterministic", "true", "--kv_unified", "true"])["kv_unified"]).toBe(true);
    expect(parseServeFlags(["--deterministic", "true", "--kv_unified", "false"])["kv_unified"]).toBe(false);
  });
});

describe("agent flags", () => {
  it("accept the known parsers and auto; default: none, guided auto off", () => {
    const f = parseServeFlags(["--tool_parser", "qwen3coder", "--reasoning_parser", "qwen3", "--enable_tool_guided_generation", "true"]);
    expect([f["tool_parser"], f["reasoning_parser"], f["enable_tool_guided_generation"]]).toEqual(["qwen3coder", "qwen3", true]);
    expect(parseServeFlags(["--tool_parser", "auto"])["tool_parser"]).toBe("auto");
    const d = parseServeFlags([]);
    expect([d["tool_parser"], d["reasoning_parser"], d["enable_tool_guided_generation"]]).toEqual([undefined, undefined, false]);
  });

  it("an unknown parser name is refused at start, naming the accepted ones (OVMS starts and fails every request)", () => {
    expect(() => parseServeFlags(["--tool_parser", "mistral"])).toThrow('--tool_parser must be one of hermes3, qwen3coder, llama3, auto, got "mistral"');
    expect(() => parseServeFlags(["--reasoning_parser", "gptoss"])).toThrow('--reasoning_parser must be one of qwen3, got "gptoss"');
    expect(() => parseServeFlags(["--enable_tool_guided_generation", "yes"])).toThrow(/--enable_tool_guided_generation must be true or false/);
  });
});

describe("parseServeCommand: the command line parsed once into typed options", () => {
  it("--help wins over bad values, not over a command line that cannot be read", () => {
    expect(parseServeCommand(["--help", "--max_num_seqs", "0"], HOST)).toEqual({ help: true });
    expect(parseServeCommand(["-h"], HOST)).toEqual({ help: true });
    expect(() => parseServeCommand(["--help", "--bogus"], HOST)).toThrow(new FlagError("unknown flag --bogus"));
    expect(() => parseServeFlags(["--help"], HOST)).toThrow(FlagError);
  });

  it("defaults are typed values; a bad value and a bad --plugin_config are reported together", () => {
    const { options } = parseServeCommand([], HOST) as { options: ServeOptions };
    expect([options.rest_port, options.rest_bind_address, options.kv_cache_precision, options.engine_threads, options.allowedOrigins, options.pull]).toEqual([8000, "0.0.0.0", "f16", 15, ["*"], undefined]);
    expect(() => parse("--max_num_seqs", "0", "--plugin_config", "{oops")).toThrow(/^--max_num_seqs must be an integer between 1 and 256, got "0"; --plugin_config is not valid JSON/);
  });

  it("a --config_path entry's settings go through the same schemas; their messages drop the dashes", () => {
    const { options, problems } = withSettings(parse("--max_num_seqs", "6"), { max_num_seqs: "2", kv_cache_precision: "u8", target_device: "GPU" });
    expect(problems).toEqual([]);
    expect([options.max_num_seqs, options.kv_cache_precision, options.target_device]).toEqual([2, "u8", "gpu"]);
    expect(withSettings(parse(), { max_num_seqs: "0", tool_parser: "x" }).problems).toEqual([
      'max_num_seqs must be an integer between 1 and 256, got "0"',
      'tool_parser must be one of hermes3, qwen3coder, llama3, auto, got "x"',
    ]);
  });
});

describe("--help and the cache directory", () => {
  it("states the cache root rule the code follows, as the README and docs/flags.md do", () => {
    // The rule as the code applies it: KEEL_CACHE_DIR wins, then XDG_CACHE_HOME, then the home directory.
    expect(keelCacheRoot({ KEEL_CACHE_DIR: "/k", XDG_CACHE_HOME: "/x" })).toBe("/k");
    expect(keelCacheRoot({ XDG_CACHE_HOME: "/x" })).toBe("/x/keel");
    expect(keelCacheRoot({})).toBe(path.join(os.homedir(), ".cache", "keel"));
    const cacheDirLine = usage().split("\n").find((l) => l.includes("--cache_dir"));
    expect(cacheDirLine).toContain(`(default: ${CACHE_ROOT_RULE})`);
    for (const doc of ["README.md", "docs/flags.md"]) {
      const text = fs.readFileSync(new URL(`../../${doc}`, import.meta.url), "utf8").replace(/`/g, "");
      expect(text, doc).toContain(CACHE_ROOT_RULE);
    }
  });
});
