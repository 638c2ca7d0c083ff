/**
 * requestGuide with a recording fake builder: what the builder is asked (reasoning open from the prompt, schemas
 * checked even when `auto` is not guided), when the guide reaches the engine, and the 400s.
 */
import { describe, expect, it } from "vitest";
import type { EngineCapabilities, GuideSpec } from "../../protocol/messages.js";
import type { AgentSettings } from "./agent-config.js";
import { invalidValue, KeelHttpError } from "../http/errors.js";
import { requestGuide } from "./guide-plan.js";
import type { GuideRequest } from "../guided/types.js";
import type { ResponseFormat, ToolChoice, ToolSpec } from "../tools.js";

const caps = (grammars: boolean): EngineCapabilities => ({ exactSeededResume: true, maxTopLogprobs: 5, extendedSampling: true, grammars, sharedPrefill: false });
const agents = (over: Partial<AgentSettings> = {}): AgentSettings => ({ toolParser: "hermes3", reasoningParser: null, guideAuto: false, toolParserSource: "flag", ...over });
const tool: ToolSpec = { name: "f", parameters: { type: "object" } };
const GUIDE: GuideSpec = { grammar: 'root ::= "x"', start: { kind: "rule", rule: "root", then: "end" } };

function fields(toolChoice: ToolChoice, responseFormat: ResponseFormat = { kind: "text" }, tools: ToolSpec[] = [tool]) {
  return { tools, toolChoice, parallelToolCalls: true, responseFormat };
}

/** A builder that records its requests and returns `GUIDE` for anything guided (as buildGuide would). */
function recorder(result: GuideSpec | null = GUIDE) {
  const asked: GuideRequest[] = [];
  return { asked, build: (r: GuideRequest) => (asked.push(r), result) };
}

describe("requestGuide", () => {
  it("tools injected into the prompt (the template cannot show them): one call per turn, whatever parallel_tool_calls says", () => {
    const r = recorder();
    requestGuide(r.build, fields({ kind: "required" }), "qwen3coder", agents({ toolParser: "qwen3coder", toolsInjected: true }), "p", caps(true));
    requestGuide(r.build, fields({ kind: "required" }), "qwen3coder", agents({ toolParser: "qwen3coder" }), "p", caps(true));
    expect(r.asked.map((a) => a.parallelToolCalls)).toEqual([false, true]);
  });

  it("tools injected: a forced call starts at once (no <think> gate) unless the prompt opened reasoning; auto keeps it", () => {
    const r = recorder();
    const injected = agents({ toolParser: "llama3", reasoningParser: "qwen3", toolsInjected: true, guideAuto: true });
    requestGuide(r.build, fields({ kind: "required" }), "llama3", injected, "<|im_start|>assistant\n", caps(true));
    requestGuide(r.build, fields({ kind: "function", name: "f" }), "llama3", injected, "<|im_start|>assistant\n", caps(true));
    requestGuide(r.build, fields({ kind: "required" }), "llama3", injected, "<|im_start|>assistant\n<think>\n", caps(true));
    requestGuide(r.build, fields({ kind: "auto" }), "llama3", injected, "<|im_start|>assistant\n", caps(true));
    requestGuide(r.build, fields({ kind: "required" }), "llama3", agents({ toolParser: "llama3", reasoningParser: "qwen3" }), "<|im_start|>assistant\n", caps(true));
    expect(r.asked.map((a) => a.reasoning)).toEqual([null, null, { parser: "qwen3", open: true }, { parser: "qwen3", open: false }, { parser: "qwen3", open: false }]);
  });

  it("required: the guide goes to the engine; reasoning is open when the prompt ends with <think>", () => {
    const r = recorder();
    const g = requestGuide(r.build, fields({ kind: "required" }), "hermes3", agents({ reasoningParser: "qwen3" }), "<|im_start|>assistant\n<think>\n", caps(true));
    expect(g).toBe(GUIDE);
    expect(r.asked[0]).toMatchObject({ toolParser: "hermes3", toolChoice: { kind: "required" }, reasoning: { parser: "qwen3", open: true }, guideAuto: false });
    requestGuide(r.build, fields({ kind: "required" }), "hermes3", agents({ reasoningParser: "qwen3" }), "<|im_start|>assistant\n", caps(true));
    expect(r.asked[1]!.reasoning).toEqual({ parser: "qwen3", open: false });
    // Thinking switched off by the template (an empty closed block): the guide has no reasoning phase.
    requestGuide(r.build, fields({ kind: "required" }), "hermes3", agents({ reasoningParser: "qwen3" }), "<|im_start|>assistant\n<think>\n\n</think>\n\n", caps(true));
    expect(r.asked[2]!.reasoning).toBeNull();
  });

  it("auto without --enable_tool_guided_generation: schemas are still checked (built as guided), but nothing is sent", () => {
    const r = recorder();
    expect(requestGuide(r.build, fields({ kind: "auto" }), "hermes3", agents(), "p", caps(false))).toBeNull();
    expect(r.asked[0]!.guideAuto).toBe(true);
    const bad = () => {
      throw invalidValue("tools[0].function.parameters", "Invalid value for 'tools[0].function.parameters': bad schema");
    };
    expect(() => requestGuide(bad, fields({ kind: "auto" }), "hermes3", agents(), "p", caps(true))).toThrow(KeelHttpError);
  });

  it("auto with the flag: guided and sent", () => {
    const r = recorder();
    expect(requestGuide(r.build, fields({ kind: "auto" }), "hermes3", agents({ guideAuto: true }), "p", caps(true))).toBe(GUIDE);
    expect(r.asked[0]!.guideAuto).toBe(true);
  });

  it("a needed guide on an engine without grammars is a 400 naming the field", () => {
    const rf: ResponseFormat = { kind: "json_object" };
    const err = (() => {
      try {
        requestGuide(recorder().build, fields({ kind: "none" }, rf, []), null, agents(), "p", caps(false));
      } catch (e) {
        return e as KeelHttpError;
      }
      return null;
    })();
    expect(err).toBeInstanceOf(KeelHttpError);
    expect({ status: err!.status, param: err!.param }).toEqual({ status: 400, param: "response_format" });
    expect(() => requestGuide(recorder().build, fields({ kind: "required" }), "hermes3", agents(), "p", caps(false))).toThrow(/grammar/);
  });

  it("nothing to constrain: null, whatever the engine", () => {
    expect(requestGuide(recorder(null).build, fields({ kind: "none" }), null, agents(), "p", caps(false))).toBeNull();
  });
});
