/**
 * The guide and the parser agree by construction (issue #20): for every tool parser × tool_choice (auto with
 * guided generation, required, a named function) × template kind (one that shows tools, one that ignores them and
 * gets them injected), every text the request's guide can derive — sampled at random from the grammar the engine
 * receives, fed to the request's own output parser in random pieces — parses into `tool_calls` of declared tools
 * whose arguments are a JSON object the tool's schema accepts, with nothing of the call left in content.
 */
import { Ajv2020 } from "ajv/dist/2020.js";
import { describe, expect, it } from "vitest";
import type { EngineCapabilities, GuideSpec } from "../../protocol/messages.js";
import { QWEN3CODER_STYLE_TEMPLATE, QWEN3_STYLE_TEMPLATE } from "../../model/agent-templates.js";
import { outputParserFactory, toolsForTemplate } from "../api/agent-request.js";
import { KeelHttpError } from "../http/errors.js";
import type { AgentSettings } from "../models/agent-config.js";
import { ChatTemplate } from "../models/chat-template.js";
import { requestGuide } from "../models/guide-plan.js";
import { needsToolInjection } from "../models/tool-prompt.js";
import { TOOL_PARSERS, type ToolChoice, type ToolParserName, type ToolSpec } from "../tools.js";
import { GbnfGrammar, GbnfSampler } from "./gbnf-recognizer.js";
import { buildGuide } from "./guide.js";
import { ANY_ARGS, NO_ARGS, ROOT_ANYOF, ROOT_ENUM, SEARCH, WEATHER } from "./samples.js";

const ajv = new Ajv2020({ strict: false });
const caps: EngineCapabilities = { exactSeededResume: true, maxTopLogprobs: 5, extendedSampling: true, grammars: true, sharedPrefill: false };
const specials = { bosToken: "<s>", eosToken: "</s>" };
/** SmolLM2-135M-Instruct's template: role and content only. */
const SMOLLM2 =
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** A seeded random source (xorshift), so a failure reproduces. */
function rng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 2 ** 32;
  };
}

/** The tools per format: qwen3coder cannot write the arguments of a root enum or anyOf as one parameter list. */
function toolsFor(format: ToolParserName): ToolSpec[] {
  return format === "qwen3coder" ? [WEATHER, NO_ARGS, SEARCH, ANY_ARGS] : [WEATHER, NO_ARGS, SEARCH, ANY_ARGS, ROOT_ENUM, ROOT_ANYOF];
}

/** The template as the model unit would serve it for `format`: injected where it cannot show tools. */
function served(kind: "shows" | "ignores", format: ToolParserName): ChatTemplate {
  const t = new ChatTemplate(kind === "ignores" ? SMOLLM2 : format === "qwen3coder" ? QWEN3CODER_STYLE_TEMPLATE : QWEN3_STYLE_TEMPLATE, specials);
  expect(needsToolInjection(t.toolSupport())).toBe(kind === "ignores");
  return kind === "ignores" ? t.withToolPrompt(format) : t;
}

/** The texts a model may produce under `guide`: derivations of the forced rule, or free text then a triggered call. */
function samples(guide: GuideSpec, rand: () => number, n: number): string[] {
  const sampler = new GbnfSampler(new GbnfGrammar(guide.grammar), rand);
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    if (guide.start.kind === "rule") {
      out.push(sampler.sample(guide.start.rule));
      continue;
    }
    const triggers = guide.triggers ?? [];
    const t = triggers[Math.floor(rand() * triggers.length)]!;
    // The rule covers the trigger text itself; free text may precede a trigger that is not `atStart`.
    out.push((t.atStart ? "" : "Let me check. ") + sampler.sample(t.rule));
  }
  return out;
}

/** `text` pushed through the parser in random pieces (as tokens arrive), then finished as the model's end. */
function parse(factory: () => ReturnType<NonNullable<ReturnType<typeof outputParserFactory>>>, text: string, rand: () => number) {
  const p = factory();
  for (let i = 0; i < text.length; ) {
    const n = 1 + Math.floor(rand() * 6);
    p.push(text.slice(i, i + n));
    i += n;
  }
  p.finish("stop");
  return p.result();
}

const CHOICES: ReadonlyArray<[string, ToolChoice, boolean]> = [
  ["auto (guided)", { kind: "auto" }, true],
  ["required", { kind: "required" }, false],
  ["named", { kind: "function", name: "get_weather" }, false],
];

describe.each(TOOL_PARSERS)("%s: every guided call parses into tool_calls", (format) => {
  describe.each(["shows", "ignores"] as const)("template %s tools", (kind) => {
    it.each(CHOICES)("tool_choice %s", (_label, toolChoice, guideAuto) => {
      const tools = toolsFor(format);
      const template = served(kind, format);
      const agents: AgentSettings = { toolParser: format, reasoningParser: null, guideAuto, toolParserSource: "flag", ...(kind === "ignores" ? { toolsInjected: true } : {}) };
      const body = { tools, toolChoice, parallelToolCalls: true, responseFormat: { kind: "text" as const } };
      const declared = toolsForTemplate(body);
      const prompt = template.render([{ role: "user", content: "Weather in Paris?" }], { tools: declared });
      // 1. The prompt declares every tool the request offers (by the template itself, or injected).
      for (const t of declared) expect(prompt).toContain(t.name);
      const guide = requestGuide(buildGuide, body, format, agents, prompt, caps)!;
      expect(guide).not.toBeNull();
      const factory = outputParserFactory(body, format, agents, prompt)!;
      const rand = rng(format.length * 31 + kind.length * 7 + _label.length);
      const seen = new Set<string>();
      for (const text of samples(guide, rand, 120)) {
        const r = parse(factory, text, rand);
        // 2. At least one call; a named choice or an injected template gives exactly one; no markup left in content.
        expect(r.toolCalls.length, text).toBeGreaterThan(0);
        if (toolChoice.kind === "function" || kind === "ignores") expect(r.toolCalls, text).toHaveLength(1);
        expect(r.content, text).not.toMatch(/<tool_call>|<function=|"name"/);
        for (const c of r.toolCalls) {
          // 3. A declared tool, arguments a JSON object its schema accepts.
          const tool = declared.find((t) => t.name === c.name);
          expect(tool, text).toBeDefined();
          seen.add(c.name);
          const args: unknown = JSON.parse(c.arguments);
          expect(typeof args === "object" && args !== null && !Array.isArray(args), `${text}\n${c.arguments}`).toBe(true);
          const ok = ajv.validate(tool!.parameters ?? { type: "object", properties: {}, additionalProperties: false }, args);
          expect(ok, `${text}\n${c.arguments}\n${JSON.stringify(ajv.errors)}`).toBe(true);
        }
      }
      // 4. The sampling reached every tool the choice allows.
      expect(seen.size).toBe(declared.length);
    });
  });
});

describe("roots that are not an object schema", () => {
  it("hermes3 and llama3 write an object for `{}`, a root enum and a root anyOf (before: `\"arguments\": 6942` was derivable)", () => {
    for (const format of ["hermes3", "llama3"] as const) {
      for (const tool of [ANY_ARGS, ROOT_ENUM, ROOT_ANYOF]) {
        const guide = buildGuide({ toolParser: format, tools: [tool], toolChoice: { kind: "required" }, parallelToolCalls: false, responseFormat: { kind: "text" }, guideAuto: false, reasoning: null })!;
        const g = new GbnfGrammar(guide.grammar);
        const rule = (guide.start as { rule: string }).rule;
        const key = format === "llama3" ? "parameters" : "arguments";
        const wrap = (args: string) => (format === "hermes3" ? `<tool_call>\n{"name": "${tool.name}", "${key}": ${args}}\n</tool_call>` : `{"name": "${tool.name}", "${key}": ${args}}`);
        expect(g.accepts(rule, wrap("6942"))).toBe(false);
        expect(g.accepts(rule, wrap('"text"'))).toBe(false);
        expect(g.accepts(rule, wrap("[1]"))).toBe(false);
        const valid = tool === ROOT_ENUM ? '{"mode":"fast"}' : tool === ROOT_ANYOF ? '{"id": 3}' : '{"a": [1]}';
        expect(g.accepts(rule, wrap(valid)), `${format} ${tool.name}`).toBe(true);
      }
    }
  });

  it("a root $ref is typed object where its target has no type, and refused where the target is another type", () => {
    const typeless: ToolSpec = { name: "r", parameters: { $ref: "#/$defs/A", $defs: { A: { properties: { x: { type: "integer" } } } } } };
    const guide = buildGuide({ toolParser: "hermes3", tools: [typeless], toolChoice: { kind: "required" }, parallelToolCalls: false, responseFormat: { kind: "text" }, guideAuto: false, reasoning: null })!;
    const g = new GbnfGrammar(guide.grammar);
    const rule = (guide.start as { rule: string }).rule;
    expect(g.accepts(rule, '<tool_call>\n{"name": "r", "arguments": {"x": 1}}\n</tool_call>')).toBe(true);
    expect(g.accepts(rule, '<tool_call>\n{"name": "r", "arguments": 1}\n</tool_call>')).toBe(false);
    const toString: ToolSpec = { name: "s", parameters: { $ref: "#/$defs/S", $defs: { S: { type: "string" } } } };
    const err = (() => {
      try {
        buildGuide({ toolParser: "llama3", tools: [toString], toolChoice: { kind: "required" }, parallelToolCalls: false, responseFormat: { kind: "text" }, guideAuto: false, reasoning: null });
      } catch (e) {
        return e;
      }
    })();
    expect(err).toBeInstanceOf(KeelHttpError);
    expect((err as KeelHttpError).status).toBe(400);
    expect((err as KeelHttpError).message).toContain("the root '$ref' must lead to an object schema");
  });

  it("qwen3coder refuses a root enum or anyOf with a 400 naming the tool's parameters (one parameter list is needed)", () => {
    for (const [i, tool] of [ROOT_ENUM, ROOT_ANYOF].entries()) {
      let err: unknown;
      try {
        buildGuide({ toolParser: "qwen3coder", tools: [WEATHER, tool], toolChoice: { kind: "required" }, parallelToolCalls: true, responseFormat: { kind: "text" }, guideAuto: false, reasoning: null });
      } catch (e) {
        err = e;
      }
      expect(err, tool.name).toBeInstanceOf(KeelHttpError);
      expect((err as KeelHttpError).param).toBe("tools[1].function.parameters");
      expect((err as KeelHttpError).message).toContain(i === 0 ? "a root 'enum'" : "a root 'anyOf'");
    }
  });
});

it("qwen3coder refuses a property name the parser would read back otherwise (`>`, `<`, a line break, blanks at the ends)", () => {
  for (const name of ["a>b", "<x", "a\nb", " a", ""]) {
    const tool: ToolSpec = { name: "f", parameters: { type: "object", properties: { [name]: { type: "string" } } } };
    let err: unknown;
    try {
      buildGuide({ toolParser: "qwen3coder", tools: [tool], toolChoice: { kind: "required" }, parallelToolCalls: true, responseFormat: { kind: "text" }, guideAuto: false, reasoning: null });
    } catch (e) {
      err = e;
    }
    expect(err, JSON.stringify(name)).toBeInstanceOf(KeelHttpError);
    expect((err as KeelHttpError).message).toContain("cannot be written as a qwen3coder parameter name");
  }
  // An inner blank is fine: the parser reads it back as written.
  const ok: ToolSpec = { name: "f", parameters: { type: "object", properties: { "my param": { type: "string" } }, required: ["my param"] } };
  expect(buildGuide({ toolParser: "qwen3coder", tools: [ok], toolChoice: { kind: "required" }, parallelToolCalls: true, responseFormat: { kind: "text" }, guideAuto: false, reasoning: null })).not.toBeNull();
});
