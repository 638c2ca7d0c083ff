/**
 * Unit tests of the guided-generation phase machine with a fake grammar backend: a "grammar" is a set of complete
 * strings per rule (`name ::= "a" | "b"`), tokens are strings. The llama.cpp side is pinned in
 * llama-adapter.contract.test.ts; the wire behaviour in test/conformance.
 */
import { describe, expect, it } from "vitest";
import type { GuideSpec } from "../../protocol/messages.js";
import { GuideState, matchTrigger, type GuideGrammar } from "./guide-state.js";
import type { CompiledGrammar, GrammarState } from "../backend.js";

const EOG = 0;
/** Token id → text. Ids ≥ 32 below 127 are single ASCII characters; a few multi-character tokens. */
const MULTI: Record<number, string> = { 1: "<think>", 2: "</think>", 3: "xy{", 4: "<sp>", 5: "é" };
const textOf = (t: number): string => (t === EOG ? "" : (MULTI[t] ?? String.fromCharCode(t)));
const tok = (s: string): number[] => [...s].map((c) => c.charCodeAt(0));

interface FakeState extends GrammarState {
  text: string;
  allowed: string[];
}

class FakeGrammar implements GuideGrammar {
  compiled: string[] = [];
  compileGrammar(grammar: string, rule: string, prefix = ""): CompiledGrammar {
    const line = grammar.split("\n").find((l) => l.startsWith(`${rule} ::=`));
    if (!line) throw new Error(`no rule ${rule}`);
    const alts = [...line.matchAll(/"([^"]*)"/g)].map((m) => prefix + m[1]!);
    this.compiled.push(`${prefix}|${rule}`);
    return { key: JSON.stringify(alts) } as CompiledGrammar;
  }
  createGrammarState(grammar: CompiledGrammar): GrammarState {
    return { grammar, dead: false, text: "", allowed: JSON.parse(grammar.key) as string[] } as FakeState;
  }
  grammarCanBeNext(state: GrammarState, token: number): boolean {
    const s = state as FakeState;
    if (s.dead) return false;
    if (token === EOG) return s.allowed.includes(s.text);
    const next = s.text + textOf(token);
    return s.allowed.some((a) => a.startsWith(next));
  }
  grammarAccept(state: GrammarState, token: number): void {
    if (token === EOG || !this.grammarCanBeNext(state, token)) {
      state.dead = true;
      throw new Error("refused");
    }
    (state as FakeState).text += textOf(token);
  }
  grammarIsComplete(state: GrammarState): boolean {
    return this.grammarCanBeNext(state, EOG);
  }
  /** The probe: some longer allowed string whose next character is not banned. */
  canContinue(state: GrammarState, banned: (t: number) => boolean = () => false): boolean {
    const s = state as FakeState;
    return s.allowed.some((a) => a.length > s.text.length && a.startsWith(s.text) && !banned(a.charCodeAt(s.text.length)));
  }
  bytesOf(token: number): Uint8Array {
    return new TextEncoder().encode(textOf(token));
  }
  isEndOfGeneration(token: number): boolean {
    return token === EOG;
  }
}

/** One live step: prepare, "sample" `token` (the native sampler feeds a constrained pick into the grammar), feed. */
async function live(g: GuideState, fake: FakeGrammar, token: number): Promise<{ constrained: boolean; ending: boolean }> {
  const s = await g.prepare(async (st) => fake.canContinue(st));
  if (s.grammar) {
    expect(fake.grammarCanBeNext(s.grammar, token)).toBe(true); // a test that samples outside the grammar is wrong
    if (token !== EOG) fake.grammarAccept(s.grammar, token);
  }
  g.onToken(token);
  return { constrained: s.grammar !== null, ending: s.ending };
}

const noBans = new Set<number>();
const spec = (s: Partial<GuideSpec>): GuideSpec => ({ grammar: "", start: { kind: "free" }, ...s });

describe("GuideState", () => {
  it("a start rule with then:end constrains every token and, once complete with no continuation, lets only EOG follow", async () => {
    const fake = new FakeGrammar();
    const g = new GuideState(spec({ grammar: 'root ::= "yes" | "no"', start: { kind: "rule", rule: "root", then: "end" } }), fake, noBans);
    for (const t of tok("yes")) expect((await live(g, fake, t)).constrained).toBe(true);
    const last = await g.prepare(async (st) => fake.canContinue(st));
    expect(last.grammar).not.toBeNull();
    expect(last.ending).toBe(true);
    expect(g.takeDropped()).toBeUndefined();
  });

  it("a complete rule that can still continue keeps the grammar (not ending)", async () => {
    const fake = new FakeGrammar();
    const g = new GuideState(spec({ grammar: 'root ::= "ab" | "abc"', start: { kind: "rule", rule: "root", then: "end" } }), fake, noBans);
    for (const t of tok("ab")) await live(g, fake, t);
    const s = await g.prepare(async (st) => fake.canContinue(st));
    expect(s.ending).toBe(false);
    expect(s.grammar).not.toBeNull();
  });

  it("then:free releases the grammar once the rule is complete and cannot continue; triggers are re-armed", async () => {
    const fake = new FakeGrammar();
    const g = new GuideState(
      spec({ grammar: 'root ::= "hi"\nobj ::= "{a}"', start: { kind: "rule", rule: "root", then: "free" }, triggers: [{ text: "{", rule: "obj", then: "end" }] }),
      fake,
      noBans,
    );
    for (const t of tok("hi")) expect((await live(g, fake, t)).constrained).toBe(true);
    expect((await live(g, fake, tok(" ")[0]!)).constrained).toBe(false);
    expect(g.phase.kind).toBe("free");
    await live(g, fake, tok("{")[0]!);
    expect(g.phase).toMatchObject({ kind: "rule", rule: "obj", then: "end" });
    expect((await live(g, fake, tok("a")[0]!)).constrained).toBe(true);
  });

  it("a trigger inside a token replays that token into literal(prefix) + rule", async () => {
    const fake = new FakeGrammar();
    const g = new GuideState(spec({ grammar: 'obj ::= "{a}"', triggers: [{ text: "{", rule: "obj" }] }), fake, noBans);
    await live(g, fake, tok("q")[0]!);
    await live(g, fake, 3); // "xy{": the match starts at "{", inside this token
    expect(g.phase.kind).toBe("rule");
    const s = await g.prepare(async (st) => fake.canContinue(st));
    expect(fake.compiled.at(-1)).toBe("xy|obj");
    expect((s.grammar as FakeState).text).toBe("xy{");
    expect(fake.grammarCanBeNext(s.grammar!, tok("a")[0]!)).toBe(true);
  });

  it("a trigger whose replay the rule rejects drops the guide, reported exactly once", async () => {
    const fake = new FakeGrammar();
    const g = new GuideState(spec({ grammar: 'obj ::= "[a]"', triggers: [{ text: "{", rule: "obj" }] }), fake, noBans);
    await live(g, fake, tok("{")[0]!);
    const s = await g.prepare(async () => true);
    expect(s.grammar).toBeNull();
    expect(g.phase.kind).toBe("off");
    expect(g.takeDropped()).toMatch(/rejected/);
    expect(g.takeDropped()).toBeUndefined();
    await live(g, fake, tok("{")[0]!);
    expect(g.phase.kind).toBe("off");
  });

  it("a grammar that does not compile drops the guide (unconstrained, reported)", async () => {
    const fake = new FakeGrammar();
    const g = new GuideState(spec({ grammar: 'x ::= "a"', start: { kind: "rule", rule: "missing", then: "end" } }), fake, noBans);
    const s = await g.prepare(async () => true);
    expect(s.grammar).toBeNull();
    expect(g.takeDropped()).toMatch(/could not be built/);
  });

  it("atStart triggers match only after leading whitespace; others anywhere, first in list order wins", () => {
    expect(matchTrigger({ text: "{", rule: "r", atStart: true }, "  {", 1)).toBe(2);
    expect(matchTrigger({ text: "{", rule: "r", atStart: true }, "a{", 1)).toBeNull();
    expect(matchTrigger({ text: "<tool_call>", rule: "r" }, "ok <tool_call>", 4)).toBe(3);
    // Only a match that ends in the new text counts as new.
    expect(matchTrigger({ text: "ab", rule: "r" }, "abxx", 2)).toBeNull();
  });

  it("a gated start rule switches to reasoning on reasoning.open; the close text starts reasoning.after", async () => {
    const fake = new FakeGrammar();
    const g = new GuideState(
      spec({
        grammar: 'gate ::= "<think>" | "no"\nans ::= "ok"',
        start: { kind: "rule", rule: "gate", then: "end" },
        reasoning: { open: "<think>", close: "</think>", after: { kind: "rule", rule: "ans", then: "end" } },
      }),
      fake,
      noBans,
    );
    expect((await live(g, fake, 1)).constrained).toBe(true);
    expect(g.phase.kind).toBe("reasoning");
    for (const t of tok("hmm")) expect((await live(g, fake, t)).constrained).toBe(false);
    await live(g, fake, 2);
    expect(g.phase).toMatchObject({ kind: "rule", rule: "ans" });
    for (const t of tok("ok")) expect((await live(g, fake, t)).constrained).toBe(true);
    expect((await g.prepare(async (st) => fake.canContinue(st))).ending).toBe(true);
  });

  it("a free start phase whose model opens reasoning itself arms no trigger inside it, and re-arms after the close", async () => {
    const fake = new FakeGrammar();
    const guide = spec({ grammar: 'o ::= "{}"', reasoning: { open: "<think>", close: "</think>", after: { kind: "free" } }, triggers: [{ text: "{", rule: "o", then: "end" }] });
    const g = new GuideState(guide, fake, noBans);
    for (const t of [...tok("\n"), 1, ...tok("a{b")]) expect((await live(g, fake, t)).constrained).toBe(false);
    expect(g.phase.kind).toBe("reasoning");
    await live(g, fake, 2);
    expect(g.phase).toMatchObject({ kind: "free", text: "" });
    await live(g, fake, tok("{")[0]!);
    expect(g.phase).toMatchObject({ kind: "rule", rule: "o" });
    // Text first: the gate closes and a later "<think>" is plain free text, where the trigger fires.
    const h = new GuideState(guide, fake, noBans);
    for (const t of [...tok("hi"), 1, ...tok("{")]) await live(h, fake, t);
    expect(h.phase).toMatchObject({ kind: "rule", rule: "o" });
  });

  it("the close text spelled across tokens is found; text behind it starts the free phase", async () => {
    const fake = new FakeGrammar();
    const g = new GuideState(
      spec({ grammar: 'o ::= "{}"', start: { kind: "reasoning" }, reasoning: { open: "<think>", close: "</think>", after: { kind: "free" } }, triggers: [{ text: "{", rule: "o", then: "end" }] }),
      fake,
      noBans,
    );
    for (const t of tok("a</thi")) await live(g, fake, t);
    expect(g.phase.kind).toBe("reasoning");
    for (const t of tok("nk>")) await live(g, fake, t);
    expect(g.phase).toMatchObject({ kind: "free", text: "" });
    await live(g, fake, tok("{")[0]!);
    expect(g.phase).toMatchObject({ kind: "rule", rule: "o" });
  });

  it("replaying a live run's tokens reaches the same phases at every position (resume continues exactly)", async () => {
    const guide = spec({
      grammar: 'root ::= "hi"\nobj ::= "{a}" | "{ab}"',
      start: { kind: "rule", rule: "root", then: "free" },
      triggers: [{ text: "{", rule: "obj" }],
    });
    const fake = new FakeGrammar();
    const a = new GuideState(guide, fake, noBans);
    const tokens = [...tok("hi"), ...tok("x"), 3, ...tok("a}"), ...tok("zz{ab}"), ...tok("q")];
    const livePhases: string[] = [];
    for (const t of tokens) {
      await live(a, fake, t);
      livePhases.push(JSON.stringify({ k: a.phase.kind, r: a.phase.kind === "rule" ? a.phase.rule : null }));
    }
    // Every prefix replayed reaches the live phase, and the next live step decides the same.
    for (let n = 1; n <= tokens.length; n++) {
      const b = new GuideState(guide, fake, noBans);
      for (const t of tokens.slice(0, n)) b.onToken(t, { isBanned: () => false });
      expect(JSON.stringify({ k: b.phase.kind, r: b.phase.kind === "rule" ? b.phase.rule : null })).toBe(livePhases[n - 1]);
    }
    expect(livePhases.filter((p) => p.includes('"rule"')).length).toBeGreaterThan(4);
  });

  it("a replayed token the rule rejects while incomplete drops the guide silently (the first engine reported it)", () => {
    const fake = new FakeGrammar();
    const g = new GuideState(spec({ grammar: 'root ::= "yes"', start: { kind: "rule", rule: "root", then: "end" } }), fake, noBans);
    g.onToken(tok("y")[0]!, { isBanned: () => false });
    g.onToken(tok("q")[0]!, { isBanned: () => false });
    expect(g.phase.kind).toBe("off");
    expect(g.takeDropped()).toBeUndefined();
  });

  it("bans only special tokens whose text the spec does not list", () => {
    const specials = [
      { token: 7, text: "<tool_call>" },
      { token: 8, text: "<|im_start|>" },
    ];
    expect([...GuideState.bansFor(spec({ specialTokens: ["<tool_call>"] }), specials)]).toEqual([8]);
  });
});
