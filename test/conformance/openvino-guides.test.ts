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

  it("what OpenVINO cannot apply exactly is refused at add, naming the engine", async () => {
    const atStart: GuideSpec = { grammar: 'obj ::= "{" [a-z]* "}"', start: { kind: "free" }, triggers: [{ text: "{", rule: "obj", atStart: true }] };
    const rule: GuideSpec = { grammar: 'root ::= "a"', start: { kind: "rule", rule: "root", then: "end" } };
    const cases: [GuideSpec, Partial<SamplingParams>][] = [
      [atStart, {}],
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
