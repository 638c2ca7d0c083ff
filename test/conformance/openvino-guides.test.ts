/**
 * Keel's guides on the OpenVINO engine (issue #19, src/engine-openvino/guides.py), over the protocol against the real
 * worker on keel-tiny-f16 (random weights: the output is gibberish unless the grammar shapes it): triggers fire and
 * constrain what follows their text; guides built by the gateway (json_schema) come out schema-valid; what OpenVINO
 * cannot apply exactly is refused at add naming the engine; a grammar that would wedge OpenVINO's step() is refused
 * at add and a request running beside it is untouched.
 */
import { Ajv2020 } from "ajv/dist/2020.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildGuide } from "../../src/gateway/guided/guide.js";
import { SCHEMAS, TOOLS } from "../../src/gateway/guided/samples.js";
import type { GuideRequest } from "../../src/gateway/guided/types.js";
import { ensureTinyModel } from "../../src/model/default-model.js";
import { OPENVINO_WORKER } from "../../src/engine-openvino/venv.js";
import { PROTOCOL_VERSION, type GuideSpec, type RequestOutput, type SamplingParams } from "../../src/protocol/messages.js";
import { openvinoPython } from "../support/openvino.js";
import { isReady, launch, type EngineProcess } from "./engine-conformance.js";

let engine: EngineProcess;
let seq = 0;
const nextId = (tag: string) => `${tag}-${++seq}`;

beforeAll(async () => {
  engine = launch({
    command: await openvinoPython(),
    args: [OPENVINO_WORKER],
    config: { mode: "serve", modelPath: await ensureTinyModel("keel-tiny-f16"), maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 512, prefixCaching: false, threads: 1, flashAttention: false, kvCacheType: "f16", device: "cpu" },
  });
  await engine.waitFor(isReady);
}, 120_000);
afterAll(async () => {
  engine.send({ v: PROTOCOL_VERSION, type: "shutdown" });
  await engine.exited;
});

const params = (p: Partial<SamplingParams> = {}): SamplingParams => ({ maxTokens: 40, temperature: 1, topP: 1, topK: -1, seed: 1, ignoreEos: false, ...p });
const add = (id: string, text: string, p: Partial<SamplingParams>): void => engine.send({ v: PROTOCOL_VERSION, type: "add", id, prompt: { text }, params: params(p) });
const textOf = (outs: RequestOutput[]) => outs.map((o) => o.text).join("");

describe("OpenVINO engine: guides", () => {
  it.each([1, 2, 3])("a free-phase trigger ('e', then:end) constrains what follows its text: 'e' two digits '!' then the end (seed %i)", async (seed) => {
    const guide: GuideSpec = { grammar: 'call ::= "e" [0-9]{2} "!"', start: { kind: "free" }, triggers: [{ text: "e", rule: "call", then: "end" }] };
    const id = nextId("trigger-end");
    add(id, "say something", { guide, seed });
    const outs = await engine.finished(id);
    const text = textOf(outs);
    // Random weights write an "e" soon (tokens ending in it stay allowed); everything from the first one on is the rule.
    expect(text.indexOf("e"), JSON.stringify(text)).toBeGreaterThanOrEqual(0);
    expect(text.slice(text.indexOf("e"))).toMatch(/^e[0-9]{2}!$/);
    expect(outs.at(-1)!.finish!.reason).toBe("stop");
  });

  it("a trigger with then:free re-arms: every 'e' in the output starts the rule again", async () => {
    const guide: GuideSpec = { grammar: 'call ::= "e" [0-9]{2} "!"', start: { kind: "free" }, triggers: [{ text: "e", rule: "call" }] };
    const id = nextId("trigger-free");
    add(id, "say more", { guide, seed: 4, maxTokens: 60 });
    const text = textOf(await engine.finished(id));
    const parts = text.split("e").slice(1);
    expect(parts.length, JSON.stringify(text)).toBeGreaterThanOrEqual(2);
    for (const part of parts) expect(part).toMatch(/^[0-9]{2}!/);
  });

  it("a gateway-built json_schema guide yields schema-valid JSON (sampled, three seeds)", async () => {
    const schema = { type: "object", properties: { name: { type: "string", minLength: 1, maxLength: 8 }, age: { type: "integer", minimum: 0, maximum: 120 } }, required: ["name", "age"], additionalProperties: false };
    const request: GuideRequest = { tools: [], toolChoice: { kind: "auto" }, responseFormat: { kind: "json_schema", name: "person", schema, strict: true }, toolParser: null, reasoning: null, guideAuto: false, parallelToolCalls: true };
    const guide = buildGuide(request)!;
    const validate = new Ajv2020({ strict: false }).compile(schema);
    for (const seed of [1, 2, 3]) {
      const id = nextId("schema");
      add(id, "a person please", { guide, seed, maxTokens: 200 });
      const outs = await engine.finished(id);
      expect(outs.at(-1)!.finish!.reason).toBe("stop");
      expect(validate(JSON.parse(textOf(outs))), textOf(outs)).toBe(true);
    }
  });

  it.each(["hermes3", "qwen3coder"] as const)("gateway-built tool-guided `auto` guides (%s, reasoning qwen3: start-only and anywhere triggers) run; the text never opens a bare call that is not one", async (parser) => {
    const tool = { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 } }, required: ["city"], additionalProperties: false } };
    const request: GuideRequest = { tools: [tool], toolChoice: { kind: "auto" }, responseFormat: { kind: "text" }, toolParser: parser, reasoning: { parser: "qwen3", open: false }, guideAuto: true, parallelToolCalls: true };
    const guide = buildGuide(request)!;
    expect(guide.triggers?.some((t) => t.atStart) ?? false).toBe(parser === "hermes3");
    for (const seed of [1, 2, 3]) {
      const id = nextId(`auto-${parser}`);
      add(id, "weather?", { guide, seed, maxTokens: 60 });
      const outs = await engine.finished(id);
      expect(outs.at(-1)!.finish!.reason, JSON.stringify(outs.at(-1)!.finish)).toBe("length");
      const text = textOf(outs).trimStart();
      if (parser === "hermes3" && text.startsWith("{")) expect(text).toMatch(/^\{\s*"name"\s*:\s*"get_weather"/);
    }
  });

  it("every shape of the phase machine becomes a structural tag XGrammar compiles (none takes the worker down)", async () => {
    const grammar = 'ans ::= "yes" | "no"\ngate ::= "<think>" | ans\ncall ::= "<c>" [a-z]{1,3} "</c>"\nbare ::= "{" [a-z]{1,3} "}"';
    const R = { open: "<think>", close: "</think>" };
    const tagged = { text: "<c>", rule: "call" };
    const atStart = { text: "{", rule: "bare", atStart: true };
    const free = { kind: "free" } as const;
    const ans = { kind: "rule", rule: "ans", then: "end" } as const;
    const shapes: GuideSpec[] = [
      { grammar, start: { kind: "rule", rule: "ans", then: "free" }, triggers: [tagged] },
      { grammar, start: free, triggers: [{ ...tagged, then: "end" }] },
      { grammar, start: free, triggers: [tagged, atStart] },
      { grammar, start: free, triggers: [{ ...tagged, then: "end" }, { text: "<c>x", rule: "call" }] },
      { grammar, start: free, triggers: [tagged], reasoning: { ...R, after: free } },
      { grammar, start: free, triggers: [tagged, atStart], reasoning: { ...R, after: free } },
      { grammar, start: free, reasoning: { ...R, after: ans } },
      { grammar, start: { kind: "reasoning" }, triggers: [tagged], reasoning: { ...R, after: free } },
      { grammar, start: { kind: "reasoning" }, triggers: [tagged, atStart], reasoning: { ...R, after: free } },
      { grammar, start: { kind: "reasoning" }, reasoning: { ...R, after: ans } },
      { grammar, start: { kind: "rule", rule: "gate", then: "end" }, reasoning: { ...R, after: ans } },
      { grammar, start: { kind: "rule", rule: "gate", then: "free" }, triggers: [tagged, atStart], reasoning: { ...R, after: free } },
      { grammar, start: { kind: "rule", rule: "gate", then: "free" }, triggers: [tagged], reasoning: { ...R, after: { kind: "rule", rule: "ans", then: "free" } } },
    ];
    const ids = shapes.map((guide) => {
      const id = nextId("shape");
      add(id, "anything", { guide, maxTokens: 6 });
      return id;
    });
    for (const [i, id] of ids.entries()) expect(["stop", "length"], `shape ${i}`).toContain((await engine.finished(id)).at(-1)!.finish!.reason);
  });

  it("every guide the gateway builds from the shared sample schemas and tools (each call format, forced and auto, with and without reasoning) is applied: none refused, none takes the worker down", { timeout: 120_000 }, async () => {
    const base: GuideRequest = { tools: [], toolChoice: { kind: "auto" }, responseFormat: { kind: "text" }, toolParser: null, reasoning: null, guideAuto: true, parallelToolCalls: true };
    const requests: GuideRequest[] = SCHEMAS.map((schema) => ({ ...base, responseFormat: { kind: "json_schema", name: "s", schema: schema as Record<string, unknown>, strict: true } }));
    for (const toolParser of ["hermes3", "qwen3coder", "llama3"] as const) {
      for (const reasoning of [null, { parser: "qwen3", open: false }, { parser: "qwen3", open: true }] as const) {
        for (const toolChoice of [{ kind: "auto" }, { kind: "required" }, { kind: "function", name: "search" }] as const) {
          requests.push({ ...base, tools: TOOLS, toolParser, reasoning, toolChoice });
        }
      }
    }
    const ids = requests.map((r, i) => {
      const id = nextId(`sample-${i}`);
      add(id, "anything", { guide: buildGuide(r)!, seed: i, maxTokens: 8 });
      return id;
    });
    for (const [i, id] of ids.entries()) {
      const outs = await engine.finished(id);
      expect(["stop", "length"], JSON.stringify(requests[i])).toContain(outs.at(-1)!.finish!.reason);
    }
  });

  it("what OpenVINO cannot apply exactly is refused at add, naming the engine", async () => {
    const rule: GuideSpec = { grammar: 'root ::= "a"', start: { kind: "rule", rule: "root", then: "end" } };
    const trigger: GuideSpec = { grammar: 'obj ::= "{" [a-z]* "}"', start: { kind: "free" }, triggers: [{ text: "{", rule: "obj" }] };
    const cases: [GuideSpec, Partial<SamplingParams>][] = [
      // A trigger whose rule cannot start with its text (the llama.cpp engine would drop the guide at that trigger).
      [{ ...trigger, triggers: [{ text: "{{", rule: "obj" }] }, {}],
      [rule, { ignoreEos: true }],
      [rule, { minTokens: 3 }],
    ];
    for (const [guide, p] of cases) {
      const id = nextId("refused");
      add(id, "x", { guide, ...p });
      const refusal = await engine.refused(id);
      expect(refusal.code).toBe("invalid_params");
      expect(refusal.message).toContain("OpenVINO engine");
    }
  });

  it("enum and const values with U+0080–U+00FF before a hex digit come out exactly (°C, °F, éa1: XGrammar misreads them inside one literal)", async () => {
    const schema = { type: "object", properties: { u: { enum: ["°C", "°F"] }, v: { const: "éa1" } }, required: ["u", "v"], additionalProperties: false };
    const request: GuideRequest = { tools: [], toolChoice: { kind: "auto" }, responseFormat: { kind: "json_schema", name: "t", schema, strict: true }, toolParser: null, reasoning: null, guideAuto: false, parallelToolCalls: true };
    const guide = buildGuide(request)!;
    const validate = new Ajv2020({ strict: false }).compile(schema);
    for (const p of [{ temperature: 0 }, { seed: 1 }, { seed: 2 }]) {
      const id = nextId("latin1");
      add(id, "units", { guide, maxTokens: 80, ...p });
      const outs = await engine.finished(id);
      expect(outs.at(-1)!.finish!.reason).toBe("stop");
      expect(validate(JSON.parse(textOf(outs))), textOf(outs)).toBe(true);
    }
  });

  it("output under a rule is valid UTF-8 of the length the rule bounds: a token XGrammar takes but no UTF-8 decoder does is sampled again", async () => {
    // XGrammar reads an overlong form (C0 B3) as one character; random weights pick byte tokens often, so 48 sampled
    // runs of 1–6 free characters meet such tokens. The worker drops one and re-adds the request (utf8_guard.py).
    const guide: GuideSpec = { grammar: 'root ::= "<" [^<>\\x00-\\x1F]{1,6} ">"', start: { kind: "rule", rule: "root", then: "end" } };
    const resamples = () => engine.stderr.filter((l) => l.includes('"event":"utf8_resample"')).length;
    const before = resamples();
    const texts: string[] = [];
    for (let from = 0; from < 48; from += 3) {
      const ids = [0, 1, 2].map((k) => {
        const id = nextId("utf8");
        add(id, "write", { guide, temperature: 1.5, seed: 700 + from + k, maxTokens: 30 });
        return id;
      });
      for (const id of ids) {
        const outs = await engine.finished(id);
        expect(outs.at(-1)!.finish!.reason, JSON.stringify(outs.at(-1)!.finish)).toBe("stop");
        texts.push(textOf(outs));
      }
    }
    for (const text of texts) {
      expect(text).not.toContain("\uFFFD");
      expect(text).toMatch(/^<[^<>\x00-\x1F]{1,6}>$/u);
    }
    expect(texts.some((t) => /[^\x00-\x7F]/.test(t))).toBe(true);
    expect(resamples()).toBeGreaterThan(before);
  });

  it("grammars that would wedge OpenVINO's step() or leave it unconstrained are refused at add; a request beside them finishes untouched", async () => {
    const bystander = nextId("bystander");
    add(bystander, "keep going", { maxTokens: 30, temperature: 0 });
    const bad = ["root ::= [z-a]", 'root ::= "a"{3,1}', 'root ::= x\nx ::= x "a"', 'root ::= "a" undefined-rule'];
    const ids = bad.map((grammar) => {
      const id = nextId("bad-grammar");
      add(id, "x", { guide: { grammar, start: { kind: "rule", rule: "root", then: "end" } } });
      return id;
    });
    for (const id of ids) expect((await engine.refused(id)).code).toBe("invalid_params");
    const outs = await engine.finished(bystander);
    expect(outs.at(-1)!.finish!.reason).toBe("length");
    expect(outs.flatMap((o) => o.tokens)).toHaveLength(30);
    // And the pipeline still applies grammars.
    const after = nextId("after");
    add(after, "x", { guide: { grammar: 'root ::= "yes" | "no"', start: { kind: "rule", rule: "root", then: "end" } } });
    expect(["yes", "no"]).toContain(textOf(await engine.finished(after)));
  });
});
