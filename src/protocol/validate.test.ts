import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION } from "./messages.js";
import { checkSamplingParams, parseGatewayMessage, parseWithZod } from "./validate.js";
import { GATEWAY_MESSAGES, mutations } from "../../test/support/protocol-mutations.js";

const params = { maxTokens: 16, temperature: 0.7, topP: 0.9, topK: 40, seed: 123, ignoreEos: false };
const addText = { v: PROTOCOL_VERSION, type: "add", id: "req-1", prompt: { text: "hello" }, params };

function fails(raw: Record<string, unknown>): string {
  const r = parseGatewayMessage(raw);
  expect(r.ok).toBe(false);
  if (r.ok) throw new Error("unreachable");
  expect(typeof r.error).toBe("string");
  expect(r.error.length).toBeGreaterThan(0);
  return r.error;
}

describe("parseGatewayMessage: valid messages", () => {
  it.each([
    ["add with a text prompt", addText],
    ["add with token ids", { ...addText, prompt: { tokens: [1, 2, 0x7fffffff] } }],
    ["add with resumed tokens", { ...addText, generated: [5, 6] }],
    ["add with maxTokens null and extreme params", { ...addText, params: { ...params, maxTokens: null, temperature: 2, topP: 1, topK: -1, seed: 0xffffffff, ignoreEos: true } }],
    ["add with greedy sampling", { ...addText, params: { ...params, temperature: 0, topK: 0 } }],
    ["add with an empty text prompt", { ...addText, prompt: { text: "" } }],
    [
      "add with the whole sampling set",
      {
        ...addText,
        params: {
          ...params,
          presencePenalty: -2,
          frequencyPenalty: 2,
          repetitionPenalty: 1.3,
          minP: 0.05,
          logitBias: [[5, -100], [6, 100], [7, 0.5]],
          minTokens: 16,
          stopTokenIds: [2, 3],
          logprobs: 0,
        },
      },
    ],
    ["add with logprobs null", { ...addText, params: { ...params, logprobs: null } }],
    ["abort", { v: PROTOCOL_VERSION, type: "abort", ids: ["a", "b"] }],
    ["abort with no ids", { v: PROTOCOL_VERSION, type: "abort", ids: [] }],
    ["ping", { v: PROTOCOL_VERSION, type: "ping", nonce: 1712345678901 }],
    ["shutdown", { v: PROTOCOL_VERSION, type: "shutdown" }],
  ])("%s passes", (_name, raw) => {
    const r = parseGatewayMessage(raw as Record<string, unknown>);
    expect(r).toEqual({ ok: true, message: raw });
  });
});

describe("parseGatewayMessage: invalid messages", () => {
  it.each([
    ["a wrong version", { ...addText, v: 2 }],
    ["a string version", { ...addText, v: "1" }],
    ["a missing version", { type: "ping", nonce: 1 }],
  ])("rejects %s", (_name, raw) => {
    expect(fails(raw as Record<string, unknown>)).toMatch(/unsupported protocol version/);
  });

  it("rejects an unknown type", () => {
    const err = fails({ v: PROTOCOL_VERSION, type: "reboot" });
    expect(err).toMatch(/^invalid reboot message/);
  });

  it("rejects a missing type", () => {
    fails({ v: PROTOCOL_VERSION, nonce: 1 });
  });

  it.each([
    ["empty id", { ...addText, id: "" }, "id"],
    ["id longer than 256", { ...addText, id: "x".repeat(257) }, "id"],
    ["missing prompt", { ...addText, prompt: undefined }, "prompt"],
    ["empty token prompt", { ...addText, prompt: { tokens: [] } }, "prompt"],
    ["negative token id", { ...addText, prompt: { tokens: [-1] } }, "prompt"],
    ["fractional token id", { ...addText, prompt: { tokens: [1.5] } }, "prompt"],
    ["bad resumed token", { ...addText, generated: ["a"] }, "generated"],
  ])("rejects add with %s, naming the field", (_name, raw, field) => {
    const err = fails(raw as Record<string, unknown>);
    expect(err).toMatch(/^invalid add message: /);
    expect(err).toContain(field);
  });

  it.each([
    ["maxTokens 0", { maxTokens: 0 }, "params.maxTokens"],
    ["temperature above 2", { temperature: 2.5 }, "params.temperature"],
    ["topP 0", { topP: 0 }, "params.topP"],
    ["topK -2", { topK: -2 }, "params.topK"],
    ["seed above uint32", { seed: 2 ** 32 }, "params.seed"],
    ["ignoreEos not boolean", { ignoreEos: "yes" }, "params.ignoreEos"],
    ["presencePenalty above 2", { presencePenalty: 2.5 }, "params.presencePenalty"],
    ["frequencyPenalty below -2", { frequencyPenalty: -3 }, "params.frequencyPenalty"],
    ["repetitionPenalty 0", { repetitionPenalty: 0 }, "params.repetitionPenalty"],
    ["minP above 1", { minP: 1.5 }, "params.minP"],
    ["a logit bias beyond 100", { logitBias: [[1, 101]] }, "params.logitBias"],
    ["a logit bias on a negative token", { logitBias: [[-1, 1]] }, "params.logitBias"],
    ["a token biased twice", { logitBias: [[1, 1], [1, 2]] }, "params.logitBias"],
    ["negative minTokens", { minTokens: -1 }, "params.minTokens"],
    ["minTokens above maxTokens", { maxTokens: 4, minTokens: 5 }, "params.minTokens"],
    ["a fractional stop token id", { stopTokenIds: [1.5] }, "params.stopTokenIds"],
    ["negative logprobs", { logprobs: -1 }, "params.logprobs"],
    ["an unknown parameter (never accepted and ignored)", { typicalP: 0.5 }, "typicalP"],
  ])("refuses only that request (invalid_params) for %s, naming the field", (_name, patch, field) => {
    const r = parseGatewayMessage({ ...addText, params: { ...params, ...patch } });
    expect(r.ok).toBe(false);
    if (r.ok || !("refuse" in r)) throw new Error("expected a refusal of the request");
    expect(r.refuse).toEqual({ id: "req-1", code: "invalid_params" });
    expect(r.error).toMatch(/^invalid sampling parameters: /);
    expect(r.error).toContain(field);
  });

  it("an add without an id or with non-object params is a protocol error, not a refusal", () => {
    for (const raw of [{ ...addText, id: undefined }, { ...addText, params: 7 }]) {
      const r = parseGatewayMessage(raw as Record<string, unknown>);
      expect(r.ok).toBe(false);
      expect("refuse" in r).toBe(false);
    }
  });

  it.each([
    ["abort without ids", { v: PROTOCOL_VERSION, type: "abort" }],
    ["abort with non-string ids", { v: PROTOCOL_VERSION, type: "abort", ids: [1] }],
    ["ping without nonce", { v: PROTOCOL_VERSION, type: "ping" }],
    ["ping with string nonce", { v: PROTOCOL_VERSION, type: "ping", nonce: "1" }],
  ])("rejects %s", (_name, raw) => {
    expect(fails(raw as Record<string, unknown>)).toMatch(/^invalid (abort|ping) message/);
  });
});

describe("checkSamplingParams", () => {
  const limits = { vocabSize: 100, maxTopLogprobs: 20 };
  it("accepts in-vocabulary ids and logprobs up to the cap", () => {
    expect(checkSamplingParams({ ...params, logitBias: [[99, 1]], stopTokenIds: [0, 99], logprobs: 20 }, limits)).toBeNull();
  });
  it.each([
    ["a biased token outside the vocabulary", { logitBias: [[100, 1]] as [number, number][] }, /logitBias token 100/, "logitBias"],
    ["a stop token outside the vocabulary", { stopTokenIds: [5, 100] }, /stopTokenIds token 100/, "stopTokenIds"],
    ["logprobs above the cap", { logprobs: 21 }, /exceeds the engine's maximum of 20/, "logprobs"],
  ])("refuses %s, naming the field", (_name, patch, message, param) => {
    expect(checkSamplingParams({ ...params, ...patch }, limits)?.message).toMatch(message);
    expect(checkSamplingParams({ ...params, ...patch }, limits)?.param).toBe(param);
  });
  it("refuses any logprobs when the engine serves none", () => {
    // A field the engine serves not at all is refused without naming it (the capabilities say so).
    expect(checkSamplingParams({ ...params, logprobs: 0 }, { vocabSize: 100, maxTopLogprobs: -1 })).toEqual({ message: expect.stringMatching(/does not serve log probabilities/) });
  });
});

describe("tokenize messages", () => {
  it("accepts a tokenize question and refuses one without text or with a bad flag", () => {
    expect(parseGatewayMessage({ v: PROTOCOL_VERSION, type: "tokenize", id: "tok-1", text: "hi", addSpecialTokens: true })).toEqual({
      ok: true,
      message: { v: PROTOCOL_VERSION, type: "tokenize", id: "tok-1", text: "hi", addSpecialTokens: true },
    });
    expect(parseGatewayMessage({ v: PROTOCOL_VERSION, type: "tokenize", id: "tok-1", addSpecialTokens: true }).ok).toBe(false);
    expect(parseGatewayMessage({ v: PROTOCOL_VERSION, type: "tokenize", id: "tok-1", text: "hi", addSpecialTokens: "yes" }).ok).toBe(false);
  });
});

describe("params.guide shape", () => {
  const guide = {
    grammar: 'root ::= "yes" | "no"\ncall ::= "{" [a-z]+ "}"\ngate ::= "<think>" | root',
    start: { kind: "rule", rule: "gate", then: "end" },
    reasoning: { open: "<think>", close: "</think>", after: { kind: "free" } },
    triggers: [{ text: "<tool_call>", rule: "call" }, { text: "{", rule: "call", atStart: true, then: "end" }],
    specialTokens: ["<tool_call>"],
  };
  const withGuide = (g: unknown) => ({ ...addText, params: { ...params, guide: g } });
  const refusal = (g: unknown): string => {
    const r = parseGatewayMessage(withGuide(g));
    expect(r.ok).toBe(false);
    if (r.ok || !("refuse" in r)) throw new Error("expected an invalid_params refusal");
    expect(r.refuse).toEqual({ id: "req-1", code: "invalid_params" });
    return r.error;
  };

  it("accepts a well-formed guide (every field) and a minimal one", () => {
    expect(parseGatewayMessage(withGuide(guide)).ok).toBe(true);
    expect(parseGatewayMessage(withGuide({ grammar: "root ::= [a-z]", start: { kind: "free" } })).ok).toBe(true);
  });

  it.each([
    ["an empty grammar", { ...guide, grammar: "" }, /grammar/],
    ["a grammar over 4 MB", { ...guide, grammar: `root ::= "${"a".repeat(4 * 1024 * 1024)}"` }, /grammar/],
    ["a rule name that is not a GBNF identifier", { ...guide, start: { kind: "rule", rule: "my rule", then: "end" } }, /rule/],
    ["a rule phase without then", { ...guide, start: { kind: "rule", rule: "root" } }, /then/],
    ["an unknown phase kind", { ...guide, start: { kind: "json" } }, /start/],
    ["an empty trigger text", { ...guide, triggers: [{ text: "", rule: "call" }] }, /triggers/],
    ["a trigger without a rule", { ...guide, triggers: [{ text: "x" }] }, /triggers/],
    ["a reasoning start without markers", { grammar: "root ::= [a-z]", start: { kind: "reasoning" } }, /reasoning/],
    ["an empty close marker", { ...guide, reasoning: { ...guide.reasoning, close: "" } }, /close/],
    ["the reserved root rule name", { ...guide, start: { kind: "rule", rule: "keel-prefixed-root", then: "end" } }, /reserved/],
    ["a grammar defining the reserved rule", { ...guide, grammar: `${guide.grammar}\nkeel-prefixed-root ::= "x"` }, /reserved/],
    ["an unknown field", { ...guide, lazy: true }, /guide/],
  ])("refuses %s with invalid_params", (_name, g, message) => {
    expect(refusal(g)).toMatch(message);
  });

  it("is refused by an engine without grammars, accepted by one with them", () => {
    const p = { ...params, guide: guide as never };
    expect(checkSamplingParams(p, { vocabSize: 100, maxTopLogprobs: -1 })).toEqual({ message: expect.stringMatching(/guides/) });
    expect(checkSamplingParams(p, { vocabSize: 100, maxTopLogprobs: -1, grammars: true })).toBeNull();
  });
});

describe("the compiled fast path", () => {
  /** "ok", "protocol_error" or "refuse:<id>". */
  const verdict = (r: ReturnType<typeof parseGatewayMessage>): string => (r.ok ? "ok" : "refuse" in r ? `refuse:${r.refuse.id}` : "protocol_error");

  it("classifies every message as zod does, over the valid shapes and thousands of seeded mutations", () => {
    const cases = [...GATEWAY_MESSAGES, ...mutations(GATEWAY_MESSAGES, 3000, 21)];
    let accepted = 0;
    for (const m of cases) {
      const fast = parseGatewayMessage(m as Record<string, unknown>);
      const reference = parseWithZod(m as Record<string, unknown>);
      expect(verdict(fast), JSON.stringify(m)).toBe(verdict(reference));
      if (fast.ok) accepted += 1;
      // A refusal says what zod says.
      if (!fast.ok && !reference.ok) expect(fast.error).toBe(reference.error);
    }
    // Both kinds occur in the corpus (the check is not vacuous).
    expect(accepted).toBeGreaterThan(GATEWAY_MESSAGES.length);
    expect(accepted).toBeLessThan(cases.length);
  });

  it("an add with a 128-entry logit bias is accepted with its params as sent", () => {
    const logitBias: [number, number][] = Array.from({ length: 128 }, (_, i) => [128 + i, -100]);
    const add = { v: PROTOCOL_VERSION, type: "add", id: "r1", prompt: { text: "hi" }, params: { maxTokens: 8, temperature: 0, topP: 1, topK: 0, seed: 1, ignoreEos: true, logitBias } };
    const r = parseGatewayMessage(add);
    expect(r.ok && r.message.type === "add" && r.message.params.logitBias).toEqual(logitBias);
    // A duplicate token in the bias is refused for that request, as zod refuses it.
    const dup = { ...add, params: { ...add.params, logitBias: [[5, 1], [5, 2]] } };
    expect(verdict(parseGatewayMessage(dup))).toBe("refuse:r1");
  });
});
