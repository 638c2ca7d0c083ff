import { describe, expect, it } from "vitest";
import { CHATML_TEMPLATE } from "../../model/chat-templates.js";
import { QWEN3CODER_STYLE_TEMPLATE, QWEN3_STYLE_TEMPLATE } from "../../model/agent-templates.js";
import { createOutputParser } from "../parsers/index.js";
import { TOOL_PARSERS, type ToolSpec } from "../tools.js";
import { ChatTemplate, type ChatMessage } from "./chat-template.js";
import { callText, injectTools, needsToolInjection, toolSystemText } from "./tool-prompt.js";

/** SmolLM2-135M-Instruct's chat template, as its GGUF carries it: role and content only. */
const SMOLLM2 =
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
/** A Gemma-like template: no system role (it raises), user/assistant only. */
const NO_SYSTEM =
  "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ '<turn>' + m.role + '\\n' + m.content + '</turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<turn>model\\n' }}{% endif %}";

const specials = { bosToken: "<s>", eosToken: "</s>" };
const WEATHER: ToolSpec = { name: "get_weather", description: "Weather for a city", parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] } };
const user: ChatMessage = { role: "user", content: "Weather in Paris?" };

describe("probing what a template shows", () => {
  it("SmolLM2's template drops tools and tool calls, keeps a system message: tools are injected", () => {
    const s = new ChatTemplate(SMOLLM2, specials).toolSupport();
    expect(s).toEqual({ tools: false, toolCalls: false, systemRole: true });
    expect(needsToolInjection(s)).toBe(true);
  });

  it("the ChatML fallback drops tools too", () => {
    expect(needsToolInjection(new ChatTemplate(CHATML_TEMPLATE, specials).toolSupport())).toBe(true);
  });

  it("the Qwen3 and Qwen3-Coder style templates show tools and calls: nothing is injected", () => {
    for (const src of [QWEN3_STYLE_TEMPLATE, QWEN3CODER_STYLE_TEMPLATE]) {
      const s = new ChatTemplate(src, specials).toolSupport();
      expect(s).toEqual({ tools: true, toolCalls: true, systemRole: true });
      expect(needsToolInjection(s)).toBe(false);
    }
  });

  it("a template that raises on a system message reports no system role (the probe itself does not throw)", () => {
    expect(new ChatTemplate(NO_SYSTEM, specials).toolSupport()).toEqual({ tools: false, toolCalls: false, systemRole: false });
  });
});

describe("rendering with injected tools", () => {
  it("SmolLM2: with a tool the prompt differs from the prompt without (before: identical), and declares it in a system turn", () => {
    const plain = new ChatTemplate(SMOLLM2, specials);
    expect(plain.render([user], { tools: [WEATHER] })).toBe(plain.render([user]));
    const t = plain.withToolPrompt("qwen3coder");
    const prompt = t.render([user], { tools: [WEATHER] });
    expect(prompt.startsWith("<|im_start|>system\n# Tools\n")).toBe(true);
    expect(prompt).toContain('"name":"get_weather"');
    expect(prompt).toContain("<function=TOOL_NAME>\n<parameter=ARGUMENT_NAME>\nVALUE\n</parameter>");
    expect(prompt).not.toContain("You are a helpful AI assistant named SmolLM");
    expect(prompt.endsWith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")).toBe(true);
    // No tools in the request: the prompt is the template's own.
    expect(t.render([user])).toBe(plain.render([user]));
  });

  it("puts the tools before the client's own system text, in one system message", () => {
    const t = new ChatTemplate(SMOLLM2, specials).withToolPrompt("hermes3");
    const prompt = t.render([{ role: "system", content: "Be brief." }, user], { tools: [WEATHER] });
    expect(prompt.match(/<\|im_start\|>system/g)).toHaveLength(1);
    expect(prompt).toMatch(/<\/tool_call>\n[^]*\n\nBe brief\.<\|im_end\|>/);
    expect(prompt).toContain('<tool_call>\n{"name": "TOOL_NAME", "arguments": {"ARGUMENT_NAME": "VALUE"}}\n</tool_call>');
  });

  it("a template without a system role gets the tools at the start of the first user message", () => {
    const t = new ChatTemplate(NO_SYSTEM, specials).withToolPrompt("llama3");
    const prompt = t.render([user], { tools: [WEATHER] });
    expect(prompt.startsWith("<turn>user\n# Tools\n")).toBe(true);
    expect(prompt).toContain("\n\nWeather in Paris?</turn>");
  });

  it("a tool loop's history renders: the assistant's call as text in the parser's format, results as user tool_response blocks", () => {
    const t = new ChatTemplate(SMOLLM2, specials).withToolPrompt("qwen3coder");
    const history: ChatMessage[] = [
      user,
      { role: "assistant", content: "", toolCalls: [{ id: "call_1", name: "get_weather", arguments: '{"city":"Paris","days":2}' }, { id: "call_2", name: "get_weather", arguments: '{"city":"Lyon"}' }] },
      { role: "tool", content: "18 C", toolCallId: "call_1" },
      { role: "tool", content: "20 C", toolCallId: "call_2" },
    ];
    const prompt = t.render(history, { tools: [WEATHER] });
    expect(prompt).toContain("<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call><|im_end|>");
    expect(prompt).toContain("<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n20 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    expect(prompt).not.toContain("<|im_start|>tool");
  });

  it("an assistant's text before its calls is kept", () => {
    const out = injectTools([{ role: "assistant", content: "Let me check.", toolCalls: [{ id: "c", name: "get_weather", arguments: '{"city":"Oslo"}' }] }], [], "llama3", { tools: false, toolCalls: false, systemRole: true });
    expect(out).toEqual([{ role: "assistant", content: 'Let me check.\n{"name": "get_weather", "parameters": {"city":"Oslo"}}' }]);
  });
});

describe("a call written as text is read back by the parser of its format", () => {
  const tools = [WEATHER, { name: "ping" }];
  it.each(TOOL_PARSERS)("%s", (format) => {
    for (const args of ['{"city":"Paris","days":2}', '{"city":"a\\nb </x>"}', "{}"]) {
      const name = args === "{}" ? "ping" : "get_weather";
      const p = createOutputParser({ toolParser: format, tools, reasoningParser: null, reasoningOpen: false, newId: () => "id" });
      p.push(callText(format, { id: "x", name, arguments: args }));
      p.finish("stop");
      const r = p.result();
      expect(r.content).toBe("");
      expect(r.toolCalls.map((c) => [c.name, JSON.parse(c.arguments)])).toEqual([[name, JSON.parse(args)]]);
    }
  });

  it("the instructions name every tool with its schema", () => {
    const text = toolSystemText("hermes3", tools);
    expect(text).toContain('{"type":"function","function":{"name":"ping","parameters":{"type":"object","properties":{}}}}');
    expect(text).toContain(JSON.stringify(WEATHER.parameters));
  });
});
