import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { checkModelFile, parseServeFlags, ShutdownSignals } from "./cli.js";

describe("parseServeFlags", () => {
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

  it("--deterministic true turns prefix reuse and flash attention off", () => {
    const f = parseServeFlags(["--deterministic", "true"]);
    expect([f["deterministic"], f["enable_prefix_caching"], f["flash_attention"]]).toEqual([true, false, false]);
    const d = parseServeFlags([]);
    expect([d["deterministic"], d["enable_prefix_caching"]]).toEqual([false, true]);
  });

  it("--deterministic true refuses flags that contradict it", () => {
    expect(() => parseServeFlags(["--deterministic", "true", "--enable_prefix_caching", "true"])).toThrow(/contradicts --enable_prefix_caching true/);
    expect(() => parseServeFlags(["--deterministic", "true", "--flash_attention", "true"])).toThrow(/contradicts --flash_attention true/);
    expect(() => parseServeFlags(["--deterministic", "true", "--kv_cache_precision", "u8"])).toThrow(/contradicts --kv_cache_precision u8/);
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

describe("ShutdownSignals", () => {
  it("a signal repeated within 100 ms (npm forwarding the terminal's Ctrl-C) counts once", () => {
    const s = new ShutdownSignals(100);
    expect(s.receive(1000)).toBe("drain");
    expect(s.receive(1003)).toBe("same");
    expect(s.receive(1099)).toBe("same");
    expect(s.count).toBe(1);
  });

  it("a later signal means hurry", () => {
    const s = new ShutdownSignals(100);
    expect(s.receive(1000)).toBe("drain");
    expect(s.receive(1100)).toBe("hurry");
    expect(s.receive(5000)).toBe("hurry");
    expect(s.count).toBe(3);
  });
});
