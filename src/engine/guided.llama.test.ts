/**
 * Guided generation (params.guide) through the real step loop on the real llama.cpp adapter (tiny embedded model,
 * random weights, vocabulary 1019): whatever the weights, the grammar decides the shape; a grammar the request cannot
 * follow drops the guide for that request alone; a resumed guided request continues exactly.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureDefaultModel } from "../model/default-model.js";
import { PROTOCOL_VERSION, type EngineMessage, type GuideSpec, type RequestOutput, type SamplingParams } from "../protocol/messages.js";
import { LlamaAdapter } from "./llama/adapter.js";
import { StepLoop } from "./step-loop.js";

let adapter: LlamaAdapter;

beforeAll(async () => {
  adapter = await LlamaAdapter.open({ modelPath: await ensureDefaultModel(), sequences: 3, contextSize: 256, batchSize: 64, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
});

afterAll(async () => {
  await adapter?.dispose();
});

const PROMPT = "<|im_start|>user\nanswer me<|im_end|>\n<|im_start|>assistant\n";
const base: SamplingParams = { maxTokens: 24, temperature: 0, topP: 1, topK: -1, seed: 3, ignoreEos: false };

interface Run {
  tokens: number[];
  text: string;
  reason: string | undefined;
  dropped: string[];
  outputs: RequestOutput[];
}

/** Run requests to their finish on one fresh loop (batched together); returns each one's outputs by id. */
async function generateAll(reqs: { id: string; params: Partial<SamplingParams>; generated?: number[] }[]): Promise<Map<string, Run>> {
  const messages: EngineMessage[] = [];
  const loop = new StepLoop(adapter, { maxNumSeqs: 3, maxNumBatchedTokens: 64, maxModelLen: 256 }, (m) => messages.push(m));
  for (const r of reqs) {
    loop.submit({ v: PROTOCOL_VERSION, type: "add", id: r.id, prompt: { text: PROMPT }, params: { ...base, ...r.params }, ...(r.generated ? { generated: r.generated } : {}) });
  }
  do await loop.step();
  while (loop.scheduler.hasWork);
  expect(messages.filter((m) => m.type === "request_error")).toEqual([]);
  const runs = new Map<string, Run>();
  for (const r of reqs) {
    const outputs = messages.flatMap((m) => (m.type === "step" ? m.outputs : [])).filter((o) => o.id === r.id);
    runs.set(r.id, {
      tokens: outputs.flatMap((o) => o.tokens),
      text: outputs.map((o) => o.text).join(""),
      reason: outputs.at(-1)?.finish?.reason,
      dropped: outputs.flatMap((o) => (o.guideDropped !== undefined ? [o.guideDropped] : [])),
      outputs,
    });
  }
  return runs;
}

async function generate(params: Partial<SamplingParams>, generated?: number[]): Promise<Run> {
  return (await generateAll([{ id: "r", params, ...(generated ? { generated } : {}) }])).get("r")!;
}

const rule = (grammar: string, then: "free" | "end" = "end", name = "root"): GuideSpec => ({ grammar, start: { kind: "rule", rule: name, then } });
/** Token id of a one-token text. */
const idOf = (text: string): number => {
  const t = adapter.tokenize(text);
  const body = adapter.bosToken !== null && t[0] === adapter.bosToken ? t.slice(1) : t;
  expect(body).toHaveLength(1);
  return body[0]!;
};

describe("guided generation on the real engine", () => {
  it('a start rule `"yes" | "no"` with then:end yields exactly one of them and stops, greedy and sampled', async () => {
    const runs = await generateAll([0, 1, 2].map((i) => ({ id: `s${i}`, params: { guide: rule('root ::= "yes" | "no"'), temperature: i === 0 ? 0 : 1.5, seed: 10 + i } })));
    for (const run of runs.values()) {
      expect(["yes", "no"]).toContain(run.text);
      expect(run.reason).toBe("stop");
      expect(run.dropped).toEqual([]);
    }
  });

  it("then:free yields the rule's text first, then continues unconstrained", async () => {
    const run = await generate({ guide: rule('root ::= "hello"', "free"), ignoreEos: true, maxTokens: 12 });
    expect(run.text.startsWith("hello")).toBe(true);
    expect(run.text.length).toBeGreaterThan("hello".length);
    expect(run.reason).toBe("length");
  });

  it("a json-ish rule constrains sampled output to /^\\{[a-z]{1,8}\\}$/ for any seed", async () => {
    const guide = rule('root ::= "{" [a-z]{1,8} "}"');
    const runs = await generateAll([1, 2, 3].map((seed) => ({ id: `j${seed}`, params: { guide, temperature: 1.2, seed } })));
    for (const run of runs.values()) {
      expect(run.text).toMatch(/^\{[a-z]{1,8}\}$/);
      expect(run.reason).toBe("stop");
    }
  });

  it("a free-phase trigger constrains from the match on (the trigger token is forced with logit_bias)", async () => {
    const brace = idOf("{");
    const guide: GuideSpec = { grammar: 'obj ::= "{" [a-z]{1,8} "}"', start: { kind: "free" }, triggers: [{ text: "{", rule: "obj", then: "end" }] };
    const run = await generate({ guide, logitBias: [[brace, 100]], temperature: 0.7 });
    expect(run.text).toMatch(/^\{[a-z]{1,8}\}$/);
    expect(run.reason).toBe("stop");
  });

  it("the close text of reasoning starts reasoning.after (gate rule, close forced with logit_bias)", async () => {
    const close = idOf(">");
    const guide: GuideSpec = {
      grammar: 'gate ::= "<think>" | "no"\nans ::= "yes" | "no"',
      start: { kind: "rule", rule: "gate", then: "end" },
      reasoning: { open: "<think>", close: ">", after: { kind: "rule", rule: "ans", then: "end" } },
      specialTokens: [],
    };
    // Greedy with ">" at +100: the gate's grammar decides "<think>" or "no"; after "<think>", reasoning samples ">".
    const run = await generate({ guide, logitBias: [[close, 100]] });
    expect(run.text).toMatch(/^(<think>>(yes|no)|no)$/);
    expect(run.reason).toBe("stop");
  });

  it("a resumed guided request (generated) continues exactly, from every resume point", async () => {
    const guide: GuideSpec = {
      grammar: 'root ::= "hi"\nobj ::= "{" [a-z]{1,4} "}"',
      start: { kind: "rule", rule: "root", then: "free" },
      triggers: [{ text: "{", rule: "obj" }],
    };
    const params: Partial<SamplingParams> = { guide, temperature: 1.3, seed: 5, maxTokens: 20, ignoreEos: true, logitBias: [[idOf("{"), 100]] };
    const full = await generate(params);
    expect(full.tokens).toHaveLength(20);
    // The run went through many phases (the check is meaningful): the rule's text, then free "{" (forced by the
    // bias) triggering the object rule, free again after each "}".
    expect(full.text).toMatch(/^hi(\{[a-z]{1,4}\}){3,}/);
    for (const k of [1, 2, 3, 6, 10, 15]) {
      const resumed = await generate(params, full.tokens.slice(0, k));
      expect(resumed.tokens, `resumed at ${k}`).toEqual(full.tokens.slice(k));
    }
  });

  it("a grammar that masks every token (bias bans its only letters) drops the guide once; the request goes on", async () => {
    const runs = await generateAll([
      { id: "masked", params: { guide: rule('root ::= "yes" | "no"'), logitBias: [[idOf("y"), -100], [idOf("n"), -100]], maxTokens: 6, ignoreEos: true } },
      { id: "bystander", params: { guide: rule('root ::= "yes" | "no"'), maxTokens: 6 } },
    ]);
    const masked = runs.get("masked")!;
    expect(masked.dropped).toHaveLength(1);
    expect(masked.dropped[0]).toMatch(/grammar/);
    expect(masked.tokens).toHaveLength(6);
    expect(masked.reason).toBe("length");
    expect(["yes", "no"]).toContain(runs.get("bystander")!.text);
  });

  it("a grammar that does not compile, or names an undefined rule, refuses the add (invalid_params); the loop goes on", async () => {
    const messages: EngineMessage[] = [];
    const loop = new StepLoop(adapter, { maxNumSeqs: 3, maxNumBatchedTokens: 64, maxModelLen: 256 }, (m) => messages.push(m));
    const bad: [string, GuideSpec][] = [
      ["syntax", rule("root ::= [a-")],
      ["undefined", { grammar: 'root ::= "a"', start: { kind: "free" }, triggers: [{ text: "x", rule: "nope" }] }],
    ];
    for (const [id, guide] of bad) loop.submit({ v: PROTOCOL_VERSION, type: "add", id, prompt: { text: PROMPT }, params: { ...base, guide, maxTokens: 5 } });
    loop.submit({ v: PROTOCOL_VERSION, type: "add", id: "ok", prompt: { text: PROMPT }, params: { ...base, guide: rule('root ::= "yes" | "no"'), maxTokens: 5 } });
    do await loop.step();
    while (loop.scheduler.hasWork);
    const refused = messages.filter((m) => m.type === "request_error");
    expect(refused.map((m) => [m.id, m.code])).toEqual([["syntax", "invalid_params"], ["undefined", "invalid_params"]]);
    expect(refused[0]!.message).toMatch(/does not compile/);
    expect(refused[1]!.message).toMatch(/undefined grammar rules: nope/);
    const ok = messages.flatMap((m) => (m.type === "step" ? m.outputs : [])).filter((o) => o.id === "ok");
    expect(["yes", "no"]).toContain(ok.map((o) => o.text).join(""));
  });

  it("ignore_eos and min_tokens cannot mask a completed then:end rule: it stops right after the rule", async () => {
    for (const p of [{ ignoreEos: true }, { minTokens: 20 }]) {
      const run = await generate({ guide: rule('root ::= "yes" | "no"'), maxTokens: 24, temperature: 1, ...p });
      expect(["yes", "no"], JSON.stringify(p)).toContain(run.text);
      expect(run.reason).toBe("stop");
      expect(run.dropped).toEqual([]);
    }
  });

  it("output under a rule is valid UTF-8 of the length the rule bounds, whatever byte tokens the weights favour", async () => {
    // llama.cpp's grammar counts some invalid byte sequences (a lead byte past F4, overlong forms) as one character;
    // Keel's addon masks the tokens no strict decoder accepts (keel-grammar-utf8.cpp). Random weights pick byte
    // tokens often, so 48 sampled runs of 1–6 free characters meet such sequences.
    const counts = () => (adapter as unknown as { llama: { _bindings: { keelSamplingCounts(): { utf8Masked: number; utf8Unchecked: number } } } }).llama._bindings.keelSamplingCounts();
    const before = counts();
    const guide = rule('root ::= "<" [^<>\\x00-\\x1F]{1,6} ">"');
    const texts: string[] = [];
    for (let from = 0; from < 48; from += 3) {
      const runs = await generateAll([0, 1, 2].map((k) => ({ id: `u${from + k}`, params: { guide, temperature: 1.5, seed: 700 + from + k } })));
      for (const run of runs.values()) texts.push(run.text);
    }
    const after = counts();
    for (const text of texts) {
      expect(text).not.toContain("\uFFFD");
      expect(text).toMatch(/^<[^<>\x00-\x1F]{1,6}>$/u);
    }
    // Some run left ASCII (the mask mattered), and every guided sample was masked with the grammar's state read.
    expect(texts.some((t) => /[^\x00-\x7F]/.test(t))).toBe(true);
    expect(after.utf8Masked).toBeGreaterThan(before.utf8Masked);
    expect(after.utf8Unchecked).toBe(before.utf8Unchecked);
  });

  it("a bias that bans the rest of a character the rule requires drops the guide (never a token outside the rule)", async () => {
    // 日 is three byte tokens in this vocabulary; banning its second leaves the grammar nothing once the first is out.
    const bytes = adapter.tokenize("日").filter((t) => t !== adapter.bosToken);
    expect(bytes).toHaveLength(3);
    const run = await generate({ guide: rule('root ::= "日本"'), logitBias: [[bytes[1]!, -100]], maxTokens: 6, temperature: 1, seed: 5 });
    expect(run.dropped).toEqual([expect.stringMatching(/every token was masked/)]);
    expect(run.tokens[0]).toBe(bytes[0]);
    expect(run.tokens).not.toContain(bytes[1]);
  });

  it("log probabilities under a guide are the raw ones: the UTF-8 mask is undone once the token is sampled", async () => {
    // The rule allows every token the mask keeps, so greedy takes the same first token with and without it.
    const plain = await generate({ maxTokens: 1, logprobs: 5 });
    const guided = await generate({ maxTokens: 1, logprobs: 5, guide: rule("root ::= [^\\x00]{1,8}", "free") });
    expect(guided.tokens).toEqual(plain.tokens);
    expect(guided.outputs.flatMap((o) => o.logprobs ?? [])).toEqual(plain.outputs.flatMap((o) => o.logprobs ?? []));
    expect(plain.outputs.flatMap((o) => o.logprobs ?? [])[0]?.top).toHaveLength(5);
  });

  it("special tokens are banned inside a rule unless the guide lists them", async () => {
    const imStart = idOf("<|im_start|>");
    // The rule admits the marker text; +100 makes the special token the greedy pick unless it is banned.
    const g = (specialTokens: string[]): GuideSpec => ({ ...rule('root ::= "<|im_start|>" | "a"'), specialTokens });
    const banned = await generate({ guide: g([]), logitBias: [[imStart, 100]] });
    expect(banned.tokens).not.toContain(imStart);
    const allowed = await generate({ guide: g(["<|im_start|>"]), logitBias: [[imStart, 100]] });
    expect(allowed.tokens[0]).toBe(imStart);
  });
});
