/**
 * The start lines about parsers, guides and implied settings, from real command lines: parsed as `keel serve` parses
 * them and turned into the engine's start configuration as serving does (engineBaseConfig).
 */
import { describe, expect, it } from "vitest";
import { engineBaseConfig } from "./engine-choice.js";
import type { EngineName } from "./flag-table.js";
import { parseServeFlags } from "./flags.js";
import { agentLine, impliedLines } from "./start-summary.js";

const HOST = { logicalCpus: 16, physicalCores: 16 };

/** The start lines of a command line served by `engine`: the parser line, then the implied settings. */
function startLines(argv: string[], engine: EngineName = "llama.cpp") {
  const o = parseServeFlags(argv, HOST);
  const base = engineBaseConfig(o, "/m.gguf", engine);
  return [agentLine({ toolParser: o.tool_parser ?? null, reasoningParser: o.reasoning_parser ?? null, guideAuto: o.enable_tool_guided_generation }), ...impliedLines(engine, base, o.flash_attention)];
}

describe("the start summary", () => {
  it("the seed's flags: the tool and reasoning parsers, guided calls, and flash attention turned on by the u8 KV cache", () => {
    const lines = startLines(["--tool_parser", "qwen3coder", "--enable_tool_guided_generation", "true", "--reasoning_parser", "qwen3", "--kv_cache_precision", "u8"]);
    expect(lines).toEqual([
      {
        level: "info",
        fields: { event: "agents", toolParser: "qwen3coder", reasoningParser: "qwen3", toolGuidedGeneration: true },
        msg: "tool calls parsed as qwen3coder (--tool_parser qwen3coder), guided by the tool's JSON schema under every tool_choice (--enable_tool_guided_generation true); reasoning parsed as qwen3 into reasoning_content (--reasoning_parser qwen3)",
      },
      {
        level: "info",
        fields: { event: "implied", setting: "flash_attention", value: true, because: "kv_cache_precision u8" },
        msg: "--kv_cache_precision u8: K and V cached as q8_0, and flash attention turned on (llama.cpp needs it for a quantized V cache; --flash_attention was false)",
      },
    ]);
  });

  it("the u8 KV cache set through --plugin_config implies the same", () => {
    const lines = startLines(["--plugin_config", '{"KV_CACHE_PRECISION":"u8"}']);
    expect(lines.map((l) => l.fields)).toContainEqual({ event: "implied", setting: "flash_attention", value: true, because: "kv_cache_precision u8" });
  });

  it("no agent flags: the line says tools are refused and reasoning stays in content; f16 implies nothing", () => {
    expect(startLines([])).toEqual([
      {
        level: "info",
        fields: { event: "agents", toolParser: null, reasoningParser: null, toolGuidedGeneration: false },
        msg: "tool calls not parsed (--tool_parser unset: a chat request with tools is a 400 naming the flag); reasoning not parsed (stays in content; --reasoning_parser unset)",
      },
    ]);
  });

  it("--tool_parser auto without guidance, and guidance without a parser (a warning: it does nothing)", () => {
    expect(startLines(["--tool_parser", "auto"])[0]!.msg).toBe(
      "tool calls parsed in the format of the model's chat template (--tool_parser auto: chosen and logged when the engine is ready), guided under tool_choice required or a named function only (--enable_tool_guided_generation false); reasoning not parsed (stays in content; --reasoning_parser unset)",
    );
    const [line] = startLines(["--enable_tool_guided_generation", "true"]);
    expect(line!.level).toBe("warn");
    expect(line!.msg).toContain("--enable_tool_guided_generation true does nothing without --tool_parser");
  });

  it("u8 with flash attention asked for says it is on without 'turned on'; the OpenVINO engine has no such implication", () => {
    expect(startLines(["--kv_cache_precision", "u8", "--flash_attention", "true"])[1]!.msg).toBe("--kv_cache_precision u8: K and V cached as q8_0, with flash attention (on)");
    expect(startLines(["--kv_cache_precision", "u8"], "openvino")).toHaveLength(1);
  });

  it("--dynamic_split_fuse false caps a prompt at the step budget", () => {
    const lines = startLines(["--dynamic_split_fuse", "false", "--max_num_batched_tokens", "512"]);
    expect(lines[1]).toEqual({
      level: "info",
      fields: { event: "implied", setting: "max_prompt_len", value: 512, because: "dynamic_split_fuse false" },
      msg: "--dynamic_split_fuse false: a prompt is prefilled in one step, so one longer than --max_num_batched_tokens (512) is refused with a 400",
    });
  });
});
