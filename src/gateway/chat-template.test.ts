import { describe, expect, it } from "vitest";
import { ChatTemplate } from "./chat-template.js";
import { KeelHttpError } from "./errors.js";

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
