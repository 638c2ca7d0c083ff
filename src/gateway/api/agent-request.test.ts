import { describe, expect, it } from "vitest";
import type { AgentSettings } from "../models/agent-config.js";
import { outputParserFactory, reasoningClosed, reasoningOpen, requestToolParser, toolsForTemplate } from "./agent-request.js";
import { KeelHttpError } from "../http/errors.js";
import type { ToolChoice } from "../tools.js";

const tools = [{ name: "a" }, { name: "b", parameters: { type: "object" } }];
const settings = (over: Partial<AgentSettings> = {}): AgentSettings => ({ toolParser: null, reasoningParser: null, guideAuto: false, toolParserSource: "none", ...over });
const req = (toolChoice: ToolChoice) => ({ tools, toolChoice });

describe("agent request helpers", () => {
  it("the template sees no tools for none, only the named one for a named choice, all otherwise", () => {
    expect(toolsForTemplate(req({ kind: "none" }))).toEqual([]);
    expect(toolsForTemplate(req({ kind: "function", name: "b" }))).toEqual([tools[1]]);
    expect(toolsForTemplate(req({ kind: "auto" }))).toEqual(tools);
    expect(toolsForTemplate(req({ kind: "required" }))).toEqual(tools);
  });

  it("active tools need a tool parser (400 naming the flag, saying when auto found none); none needs nothing", () => {
    expect(requestToolParser(req({ kind: "none" }), settings())).toBeNull();
    expect(requestToolParser(req({ kind: "auto" }), settings({ toolParser: "qwen3coder", toolParserSource: "flag" }))).toBe("qwen3coder");
    const err = (s: AgentSettings) => {
      try {
        requestToolParser(req({ kind: "required" }), s);
      } catch (e) {
        return e as KeelHttpError;
      }
      throw new Error("expected a 400");
    };
    expect(err(settings())).toMatchObject({ status: 400, param: "tools", code: "unsupported_field" });
    expect(err(settings()).message).toMatch(/without --tool_parser/);
    expect(err(settings({ toolParserSource: "auto_found_none" })).message).toMatch(/--tool_parser auto, but the model's chat template/);
  });

  it("reasoning open / closed from the rendered prompt, only with a reasoning parser", () => {
    const r = settings({ reasoningParser: "qwen3" });
    expect(reasoningOpen(r, "<|im_start|>assistant\n<think>\n")).toBe(true);
    expect(reasoningOpen(settings(), "<|im_start|>assistant\n<think>\n")).toBe(false);
    expect(reasoningClosed(r, "assistant\n<think>\n\n</think>\n\n")).toBe(true);
    expect(reasoningClosed(r, "assistant\n")).toBe(false);
  });

  it("no parser factory when nothing is parsed; one parser per call otherwise", () => {
    expect(outputParserFactory(req({ kind: "auto" }), null, settings(), "p")).toBeUndefined();
    const make = outputParserFactory(req({ kind: "auto" }), "hermes3", settings({ toolParser: "hermes3" }), "p")!;
    expect(make()).not.toBe(make());
    const p = make();
    p.push('<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>');
    p.finish("stop");
    expect(p.result().toolCalls.map((c) => c.name)).toEqual(["b"]);
  });
});
