/**
 * The step loop's handling of `params.guide` with a fake backend (byte tokens, a "grammar" = a set of complete
 * strings): what the sampler is configured with in each phase, when the phase moves relative to samples, and how a
 * sampler failure under a grammar is contained. The real llama.cpp path: guided.llama.test.ts and the conformance suite.
 */
import { describe, expect, it } from "vitest";
import type { EngineMessage, GuideSpec, RequestErrorMessage, RequestOutput, SamplingParams } from "../protocol/messages.js";
import { PROTOCOL_VERSION } from "../protocol/messages.js";
import type { CompiledGrammar, DecodeItem, GrammarState, SamplerConfig, SamplerHandle, ModelBackend } from "./backend.js";
import { StepLoop } from "./step-loop.js";

const EOG = 300;
const SPECIAL = 301;

interface FakeState extends GrammarState {
  text: string;
  allowed: string[];
}

class FakeSampler implements SamplerHandle {
  cfg: SamplerConfig;
  /** Every configuration applied, with whether a sample was in flight on this sampler at that moment. */
  readonly applied: { cfg: SamplerConfig; duringSample: boolean }[] = [];
  sampling = false;
  constructor(cfg: SamplerConfig) {
    this.cfg = cfg;
  }
  configure(cfg: SamplerConfig): void {
    this.applied.push({ cfg, duringSample: this.sampling });
    this.cfg = cfg;
  }
  dispose(): void {}
}

/** Bytes are tokens 0..255; the "model" prefers `preferred(history)`; a grammar masks like llama.cpp's sampler. */
class GuidedFakeBackend implements ModelBackend {
  readonly eogTokens = [EOG];
  readonly vocabSize = 512;
  readonly samplers: FakeSampler[] = [];
  /** The model's favourite next token for a sampler's history. */
  preferred: (history: number[]) => number = () => "z".charCodeAt(0);
  /** Make the next constrained sample throw (a native sampler failure under a grammar). */
  failConstrainedSample = false;
  private readonly histories = new Map<FakeSampler, number[]>();

  tokenize(text: string): number[] {
    return [...text].map((c) => c.charCodeAt(0));
  }
  bytesOf(token: number): Uint8Array {
    if (token < 256) return Uint8Array.of(token);
    return token === SPECIAL ? new TextEncoder().encode("<sp>") : new Uint8Array(0);
  }
  isEndOfGeneration(token: number): boolean {
    return token === EOG;
  }
  createSampler(cfg: SamplerConfig): SamplerHandle {
    const s = new FakeSampler(cfg);
    this.samplers.push(s);
    this.histories.set(s, []);
    return s;
  }
  async decode(items: DecodeItem[]): Promise<number[]> {
    return items.map((it, i) => (it.wantsLogits ? i : -1));
  }
  async sample(_idx: number, handle: SamplerHandle): Promise<number> {
    const s = handle as FakeSampler;
    s.sampling = true;
    await Promise.resolve(); // the sample is asynchronous, as the native worker is
    s.sampling = false;
    const history = this.histories.get(s)!;
    const g = (s.cfg.grammar ?? null) as FakeState | null;
    const allowedNow = (t: number): boolean => s.cfg.bias.get(t) !== -Infinity && (!g || this.grammarCanBeNext(g, t));
    let token = this.preferred(history);
    if (g && this.failConstrainedSample) {
      this.failConstrainedSample = false;
      g.dead = true;
      throw new Error("masked");
    }
    if (!allowedNow(token)) {
      const candidates = [...Array(256).keys(), EOG, SPECIAL].filter(allowedNow);
      if (candidates.length === 0) throw new Error("everything masked");
      token = candidates[0]!;
    }
    if (g && token !== EOG) g.text += String.fromCharCode(token);
    history.push(token);
    return token;
  }
  clearSequence(): void {}

  // Grammar support: a rule is the set of its string alternatives.
  compileGrammar(grammar: string, rule: string, prefix = ""): CompiledGrammar {
    const line = grammar.split("\n").find((l) => l.startsWith(`${rule} ::=`));
    if (!line) throw new Error(`undefined rule ${rule}`);
    return { key: JSON.stringify([...line.matchAll(/"([^"]*)"/g)].map((m) => prefix + m[1]!)) };
  }
  createGrammarState(grammar: CompiledGrammar): GrammarState {
    return { grammar, dead: false, text: "", allowed: JSON.parse(grammar.key) as string[] } as FakeState;
  }
  grammarCanBeNext(state: GrammarState, token: number): boolean {
    const s = state as FakeState;
    if (s.dead) throw new Error("a dead grammar state was used (process abort in llama.cpp)");
    if (token === EOG) return s.allowed.includes(s.text);
    if (token >= 256) return false;
    const next = s.text + String.fromCharCode(token);
    return s.allowed.some((a) => a.startsWith(next));
  }
  grammarAccept(state: GrammarState, token: number): void {
    if (!this.grammarCanBeNext(state, token) || token === EOG) throw new Error("refused");
    (state as FakeState).text += String.fromCharCode(token);
  }
  grammarIsComplete(state: GrammarState): boolean {
    return this.grammarCanBeNext(state, EOG);
  }
  async grammarCanContinue(_idx: number, state: GrammarState, bias: ReadonlyMap<number, number>): Promise<boolean> {
    const s = state as FakeState;
    return s.allowed.some((a) => a.length > s.text.length && a.startsWith(s.text) && bias.get(a.charCodeAt(s.text.length)) !== -Infinity);
  }
  specialTokens(): readonly { token: number; text: string }[] {
    return [{ token: SPECIAL, text: "<sp>" }];
  }
}

const base: SamplingParams = { maxTokens: 10, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: false };

async function runAll(backend: ModelBackend, reqs: { id: string; params: Partial<SamplingParams> }[]): Promise<{ messages: EngineMessage[]; outs: (id: string) => RequestOutput[] }> {
  const messages: EngineMessage[] = [];
  const loop = new StepLoop(backend, { maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 128 }, (m) => messages.push(m));
  for (const r of reqs) loop.submit({ v: PROTOCOL_VERSION, type: "add", id: r.id, prompt: { text: "p" }, params: { ...base, ...r.params } });
  do await loop.step();
  while (loop.scheduler.hasWork);
  return { messages, outs: (id) => messages.flatMap((m) => (m.type === "step" ? m.outputs.filter((o) => o.id === id) : [])) };
}
const textOf = (outs: RequestOutput[]): string => outs.map((o) => o.text).join("");

describe("step loop with params.guide (fake backend)", () => {
  it("every configure inside a rule carries the grammar and the special-token bans; none happens during a sample", async () => {
    const b = new GuidedFakeBackend();
    const guide: GuideSpec = { grammar: 'root ::= "abc"', start: { kind: "rule", rule: "root", then: "free" } };
    const { outs } = await runAll(b, [{ id: "r", params: { guide, temperature: 0.5, maxTokens: 6, ignoreEos: true } }]);
    expect(textOf(outs("r"))).toBe("abczzz");
    const applied = b.samplers[0]!.applied;
    // Temperature: one configure per sample (new seed). The first three are in the rule, the rest free.
    expect(applied).toHaveLength(6);
    for (const a of applied.slice(0, 3)) {
      expect(a.cfg.grammar).not.toBeNull();
      expect(a.cfg.bias.get(SPECIAL)).toBe(-Infinity);
    }
    for (const a of applied.slice(3)) {
      expect(a.cfg.grammar ?? null).toBeNull();
      expect(a.cfg.bias.has(SPECIAL)).toBe(false);
    }
    expect(applied.some((a) => a.duringSample)).toBe(false);
  });

  it("a sampler failure under a grammar drops that request's guide once and resamples; a bystander is untouched", async () => {
    const b = new GuidedFakeBackend();
    b.failConstrainedSample = true;
    const guide: GuideSpec = { grammar: 'root ::= "abc"', start: { kind: "rule", rule: "root", then: "end" } };
    const { outs } = await runAll(b, [
      { id: "failing", params: { guide, maxTokens: 4, ignoreEos: true } },
      { id: "bystander", params: { guide } },
    ]);
    const failing = outs("failing");
    expect(failing.flatMap((o) => (o.guideDropped ? [o.guideDropped] : []))).toHaveLength(1);
    expect(failing[0]!.guideDropped).toMatch(/masked/); // reported with the very token that was resampled
    expect(textOf(failing)).toBe("zzzz");
    expect(failing.at(-1)!.finish!.reason).toBe("length");
    expect(textOf(outs("bystander"))).toBe("abc");
    expect(outs("bystander").at(-1)!.finish!.reason).toBe("stop");
  });

  it("a completed then:end rule under ignore_eos lifts the EOG ban for that sample and ends the request", async () => {
    const b = new GuidedFakeBackend();
    const guide: GuideSpec = { grammar: 'root ::= "ab"', start: { kind: "rule", rule: "root", then: "end" } };
    const { outs } = await runAll(b, [{ id: "r", params: { guide, ignoreEos: true, minTokens: 8 } }]);
    const r = outs("r");
    expect(r.flatMap((o) => o.tokens)).toEqual([97, 98, EOG]);
    expect(r.at(-1)!.finish).toMatchObject({ reason: "stop", completionTokens: 3 });
    const last = b.samplers[0]!.applied.at(-1)!.cfg;
    expect(last.bias.has(EOG)).toBe(false);
  });

  it("a backend without grammar support refuses a guide with invalid_params (never ignores it)", async () => {
    const b = new GuidedFakeBackend();
    Object.defineProperty(b, "grammarCanContinue", { value: undefined }); // one grammar method missing = none
    const guide: GuideSpec = { grammar: 'root ::= "ab"', start: { kind: "free" } };
    const { messages } = await runAll(b, [{ id: "r", params: { guide } }]);
    const refusal = messages.find((m): m is RequestErrorMessage => m.type === "request_error");
    expect(refusal).toMatchObject({ id: "r", code: "invalid_params" });
  });
});
