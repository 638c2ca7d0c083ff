import { describe, expect, it } from "vitest";
import { ChatTemplate } from "./chat-template.js";
import { isWellFormed } from "../requests/utf8-stream.js";
import { KeelHttpError } from "../http/errors.js";

const CHATML =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const specials = { bosToken: "<s>", eosToken: "</s>" };

describe("ChatTemplate", () => {
  const chatml = new ChatTemplate(CHATML, specials);
  const convo = [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Hi" },
  ];

  it("renders ChatML with a generation prompt by default", () => {
    expect(chatml.render(convo)).toBe(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    );
  });

  it("omits the generation prompt when addGenerationPrompt is false", () => {
    expect(chatml.render(convo, { addGenerationPrompt: false })).toBe(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    );
  });

  it("passes content through verbatim (no HTML escaping, multi-line kept)", () => {
    expect(chatml.render([{ role: "user", content: "<b>&\n\"x\"" }], { addGenerationPrompt: false })).toBe(
      "<|im_start|>user\n<b>&\n\"x\"<|im_end|>\n",
    );
  });

  it("exposes bos_token and eos_token", () => {
    const t = new ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}", specials);
    expect(t.render([{ role: "user", content: "a" }, { role: "assistant", content: "b" }])).toBe("<s>a</s>b</s>");
  });

  it("turns raise_exception into a 400 template_error carrying the template's message", () => {
    const t = new ChatTemplate(
      "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok",
      specials,
    );
    expect(t.render([{ role: "user", content: "x" }])).toBe("ok");
    let caught: unknown;
    try {
      t.render([{ role: "assistant", content: "x" }]);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(KeelHttpError);
    const e = caught as KeelHttpError;
    expect(e.status).toBe(400);
    expect(e.code).toBe("template_error");
    expect(e.message).toContain("Conversation must start with a user message");
  });

  it("turns runtime failures into a 400 template_error", () => {
    const t = new ChatTemplate("{{ messages[0].content | no_such_filter }}", specials);
    expect(() => t.render([{ role: "user", content: "x" }])).toThrow(
      expect.objectContaining({ status: 400, code: "template_error", message: expect.stringContaining("no_such_filter") }),
    );
  });

  it("rejects an empty rendered prompt with a 400 template_error", () => {
    const t = new ChatTemplate("{% if false %}x{% endif %}", specials);
    expect(() => t.render(convo)).toThrow(expect.objectContaining({ status: 400, code: "template_error" }));
  });

  it("fails at construction (load time) on a template that does not parse", () => {
    let caught: unknown;
    try {
      new ChatTemplate("{% for m in messages %}", specials);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(Error);
    expect(caught).not.toBeInstanceOf(KeelHttpError);
    expect((caught as Error).message).toMatch(/^Chat template does not parse: /);
  });

  it("passes chat_template_kwargs to the template (enable_thinking) and refuses overriding its own variables", () => {
    const t = new ChatTemplate("{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}{{ messages[0].content }}", specials);
    expect(t.render(convo, { kwargs: { enable_thinking: false } })).toBe(`/no_think ${convo[0]!.content}`);
    expect(t.render(convo, { kwargs: { enable_thinking: true } })).toBe(convo[0]!.content);
    expect(t.render(convo)).toBe(convo[0]!.content);
    expect(() => t.render(convo, { kwargs: { messages: [] } })).toThrow(expect.objectContaining({ status: 400, param: "chat_template_kwargs.messages" }));
    expect(() => t.render(convo, { kwargs: { add_generation_prompt: false } })).toThrow(expect.objectContaining({ status: 400, code: "invalid_value" }));
  });
});

/**
 * A hermes-style template in the manner of Qwen2.5's (written for this test): tools as JSON lines in the system turn,
 * assistant tool calls as `<tool_call>` JSON with `tojson` arguments, tool results in the user turn, earlier
 * reasoning in `<think>`.
 */
const HERMES = [
  "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}<tool>{{ tool | tojson }}</tool>{%- endfor %}<|im_end|>\n{%- endif %}",
  "{%- for message in messages %}",
  "{%- if message.role == 'assistant' %}<|im_start|>assistant\n",
  "{%- if message.reasoning_content is defined %}<think>{{ message.reasoning_content }}</think>{%- endif %}",
  "{{ message.content }}",
  "{%- if message.tool_calls is defined %}{%- for call in message.tool_calls %}<tool_call>{\"id\": \"{{ call.id }}\", \"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}</tool_call>{%- endfor %}{%- endif %}<|im_end|>\n",
  "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response id={{ message.tool_call_id }}{% if message.name is defined %} name={{ message.name }}{% endif %}>{{ message.content }}</tool_response><|im_end|>\n",
  "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}",
  "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}",
].join("");

describe("ChatTemplate with tools (hermes-style template)", () => {
  const t = new ChatTemplate(HERMES, specials);
  const weather = { name: "get_weather", description: "Weather of a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } };

  it("declares tools in OpenAI's nested shape, and none when the list is empty", () => {
    const out = t.render([{ role: "user", content: "Hi" }], { tools: [weather] });
    const declared = [...out.matchAll(/<tool>(.*?)<\/tool>/g)].map((m) => JSON.parse(m[1]!));
    expect(declared).toHaveLength(1);
    expect(declared[0]).toEqual({ type: "function", function: weather });
    expect(t.render([{ role: "user", content: "Hi" }], { tools: [] })).not.toContain("# Tools");
  });

  it("round-trips tool calls (JSON arguments as objects, not double-encoded), tool results and reasoning", () => {
    const out = t.render(
      [
        { role: "user", content: "Weather in Paris?" },
        { role: "assistant", content: "", reasoningContent: "need the tool", toolCalls: [{ id: "call_1", name: "get_weather", arguments: '{"city": "Paris"}' }] },
        { role: "tool", content: "sunny", toolCallId: "call_1", name: "get_weather" },
      ],
      { addGenerationPrompt: false },
    );
    const call = /<tool_call>(.*?)<\/tool_call>/.exec(out)![1]!;
    expect(JSON.parse(call)).toEqual({ id: "call_1", name: "get_weather", arguments: { city: "Paris" } });
    expect(out).toContain("<think>need the tool</think>");
    expect(out).toContain("<tool_response id=call_1 name=get_weather>sunny</tool_response>");
  });

  it("keeps arguments that are not a JSON object as the string", () => {
    const out = t.render([{ role: "assistant", content: "", toolCalls: [{ id: "c", name: "f", arguments: "not json" }] }], { addGenerationPrompt: false });
    const call = /<tool_call>(.*?)<\/tool_call>/.exec(out)![1]!;
    expect(JSON.parse(call).arguments).toBe("not json");
  });

  it("arguments whose JSON escapes a lone surrogate stay the string (parsed, they would hold no character: a tokenizer refuses them)", () => {
    const args = '{"a":"\\ud800"}';
    const out = t.render([{ role: "assistant", content: "", toolCalls: [{ id: "c", name: "f", arguments: args }] }], { addGenerationPrompt: false });
    const call = /<tool_call>(.*?)<\/tool_call>/.exec(out)![1]!;
    expect(JSON.parse(call).arguments).toBe(args);
    expect(isWellFormed(out)).toBe(true);
  });

  it("arguments nested thousands deep stay the string (the template's tojson would overflow the stack on them)", () => {
    const deep = "{\"a\":".repeat(5000) + "1" + "}".repeat(5000);
    const out = t.render([{ role: "assistant", content: "", toolCalls: [{ id: "c", name: "f", arguments: deep }] }], { addGenerationPrompt: false });
    expect(out).toContain(JSON.stringify(deep).slice(0, 40));
  });

  it("leaves message keys undefined when a message lacks them", () => {
    const probe = new ChatTemplate("{% for m in messages %}{{ m.tool_calls is defined }},{{ m.tool_call_id is defined }},{{ m.reasoning_content is defined }}{% endfor %}", specials);
    expect(probe.render([{ role: "user", content: "x" }], { addGenerationPrompt: false })).toBe("false,false,false");
  });
});
