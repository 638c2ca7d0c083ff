import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION } from "./messages.js";
import { parseGatewayMessage } from "./validate.js";

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
    ["maxTokens 0", { ...addText, params: { ...params, maxTokens: 0 } }, "params.maxTokens"],
    ["temperature above 2", { ...addText, params: { ...params, temperature: 2.5 } }, "params.temperature"],
    ["topP 0", { ...addText, params: { ...params, topP: 0 } }, "params.topP"],
    ["topK -2", { ...addText, params: { ...params, topK: -2 } }, "params.topK"],
    ["seed above uint32", { ...addText, params: { ...params, seed: 2 ** 32 } }, "params.seed"],
    ["ignoreEos not boolean", { ...addText, params: { ...params, ignoreEos: "yes" } }, "params.ignoreEos"],
    ["missing params", { ...addText, params: undefined }, "params"],
    ["bad resumed token", { ...addText, generated: ["a"] }, "generated"],
  ])("rejects add with %s, naming the field", (_name, raw, field) => {
    const err = fails(raw as Record<string, unknown>);
    expect(err).toMatch(/^invalid add message: /);
    expect(err).toContain(field);
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
