import { describe, expect, it } from "vitest";
import type { z } from "zod";
import { ENGINE_MESSAGES, GATEWAY_MESSAGES, mutations } from "../../test/support/protocol-mutations.js";
import { engineMessage } from "./engine-schema.js";
import { parseEngineMessage } from "./engine-validator.js";
import { gatewayMessage, samplingParams } from "./gateway-schema.js";
import { protocolJsonSchema } from "./json-schema.js";
import { PROTOCOL_VERSION } from "./messages.js";
import { compile, describeFailure } from "./schema-validator.js";

const defs = protocolJsonSchema().$defs;
const paramsOf = (messages: unknown[]): unknown[] => messages.flatMap((m) => ((m as { type: string }).type === "add" ? [(m as { params: unknown }).params] : []));

/** The compiled validator of each definition and the zod schema it was generated from. */
const pairs: [name: string, compiled: ReturnType<typeof compile>, zod: z.ZodType, valid: unknown[]][] = [
  ["gatewayMessage", compile(defs.gatewayMessage), gatewayMessage, GATEWAY_MESSAGES],
  ["samplingParams", compile(defs.samplingParams), samplingParams, paramsOf(GATEWAY_MESSAGES)],
  ["engineMessage", compile(defs.engineMessage), engineMessage, ENGINE_MESSAGES],
];

describe("the compiled validator of protocol.schema.json", () => {
  it.each(pairs)("%s: accepts every valid message shape", (_name, compiled, zod, valid) => {
    for (const m of valid) {
      expect(zod.safeParse(m).success, JSON.stringify(m)).toBe(true);
      expect(compiled(m)).toBeNull();
    }
  });

  it.each(pairs)("%s: agrees with zod on 3000 mutated messages", (name, compiled, zod, valid) => {
    const cases = mutations(valid as never[], 3000, name.length);
    let rejected = 0;
    for (const m of cases) {
      const ok = zod.safeParse(m).success;
      if (!ok) rejected += 1;
      expect(compiled(m) === null, `${JSON.stringify(m)}: ${describeFailure(compiled(m) ?? { path: [], message: "valid" })}`).toBe(ok);
    }
    // The mutations exercise both outcomes (a generator that only produced garbage would prove little).
    expect(rejected).toBeGreaterThan(300);
    expect(rejected).toBeLessThan(2900);
  });

  it("refuses a schema with a keyword outside the subset, or an unknown named check", () => {
    expect(() => compile({ type: "string", format: "email" })).toThrow(/keyword format/);
    expect(() => compile({ type: "object", "x-keel-checks": ["noSuchCheck"] })).toThrow(/check noSuchCheck/);
    expect(() => compile({ minimum: 1 })).toThrow(/minimum without a numeric type/);
  });

  it("names the path and the rule of a failure", () => {
    const v = compile(defs.engineMessage);
    const step = structuredClone(ENGINE_MESSAGES.find((m) => (m as { type: string }).type === "step")) as { outputs: { tokens: unknown[] }[] };
    step.outputs[1]!.tokens = [1, -4];
    expect(describeFailure(v(step)!)).toBe("outputs.1.tokens.1 must be >= 0");
    expect(describeFailure(v({ v: PROTOCOL_VERSION, type: "reboot" })!)).toMatch(/^type must be one of "loading", "tokenized", "ready"/);
    expect(describeFailure(v({ v: PROTOCOL_VERSION, type: "tokenized", id: "t" })!)).toBe("matches no alternative (first: tokens is required)");
  });
});

describe("parseEngineMessage", () => {
  it("passes a valid frame through as is (no copy)", () => {
    for (const m of ENGINE_MESSAGES) {
      const r = parseEngineMessage(m as Record<string, unknown>);
      expect(r.ok && r.message).toBe(m);
    }
  });

  it("ignores fields an engine adds (forward compatibility) but not a wrong type", () => {
    expect(parseEngineMessage({ v: PROTOCOL_VERSION, type: "pong", nonce: 1, step: 2, debug: { x: 1 } }).ok).toBe(true);
    expect(parseEngineMessage({ v: PROTOCOL_VERSION, type: "pong", nonce: "1", step: 2 })).toEqual({ ok: false, error: "invalid pong message: nonce must be a number" });
  });

  it("accepts an error code outside the catalogue (the gateway maps it to engine_error), not an empty one", () => {
    const refusal = { v: PROTOCOL_VERSION, type: "request_error", id: "a", message: "m" };
    expect(parseEngineMessage({ ...refusal, code: "new_code" }).ok).toBe(true);
    expect(parseEngineMessage({ ...refusal, code: "" }).ok).toBe(false);
  });

  it("rejects another protocol version, an unknown type and a step output without its text", () => {
    expect(parseEngineMessage({ v: 2, type: "pong", nonce: 1, step: 0 })).toEqual({ ok: false, error: "unsupported protocol version 2 (expected 1)" });
    expect(parseEngineMessage({ v: PROTOCOL_VERSION, type: "hello" })).toMatchObject({ ok: false, error: expect.stringMatching(/^invalid hello message: type must be one of/) });
    const step = { v: PROTOCOL_VERSION, type: "step", step: 1, batchTokens: 1, outputs: [{ id: "a", tokens: [1] }], stats: { waiting: 0, running: 1, activeSequences: 1, cachedSequences: 0, prefixCacheHitTokens: 0 } };
    expect(parseEngineMessage(step)).toEqual({ ok: false, error: "invalid step message: outputs.0.text is required" });
  });
});

describe("string lengths", () => {
  it("count code points, as zod does (an astral character is one)", () => {
    const max = compile({ type: "string", maxLength: 2 });
    const min = compile({ type: "string", minLength: 2 });
    expect(max("😀😀")).toBeNull();
    expect(max("😀😀😀")).not.toBeNull();
    expect(min("😀")).not.toBeNull();
    expect(min("😀😀")).toBeNull();
    expect(min("\ud800")).not.toBeNull();
  });
});
