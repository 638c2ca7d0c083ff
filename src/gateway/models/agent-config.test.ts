import { describe, expect, it } from "vitest";
import { NO_AGENT_FLAGS, resolveAgentSettings } from "./agent-config.js";
import { pickToolParser } from "../parsers/index.js";

describe("resolveAgentSettings", () => {
  const hermesTemplate = "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>{{ x }}</tool_call>";

  it("a named parser is used as given; none stays none", () => {
    expect(resolveAgentSettings({ ...NO_AGENT_FLAGS, toolParser: "llama3" }, hermesTemplate, pickToolParser)).toMatchObject({ toolParser: "llama3", toolParserSource: "flag" });
    expect(resolveAgentSettings(NO_AGENT_FLAGS, hermesTemplate, pickToolParser)).toMatchObject({ toolParser: null, toolParserSource: "none" });
  });

  it("auto resolves from the template once it is known, and says so when it finds no format", () => {
    const auto = { ...NO_AGENT_FLAGS, toolParser: "auto" as const, reasoningParser: "qwen3" as const, guideAuto: true };
    expect(resolveAgentSettings(auto, hermesTemplate, pickToolParser)).toEqual({ toolParser: "hermes3", toolParserSource: "template", reasoningParser: "qwen3", guideAuto: true });
    expect(resolveAgentSettings(auto, "{{ messages }}", pickToolParser)).toMatchObject({ toolParser: null, toolParserSource: "auto_found_none" });
    expect(resolveAgentSettings(auto, null, pickToolParser)).toMatchObject({ toolParser: null, toolParserSource: "auto_found_none" });
  });
});
