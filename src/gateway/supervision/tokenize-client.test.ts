/**
 * The tokenize client: answers matched by id, engine errors and a missing engine rejected, unknown answers ignored,
 * pending questions failed when the engine dies.
 */
import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION, type TokenizeMessage } from "../../protocol/messages.js";
import { TokenizeClient } from "./tokenize-client.js";

describe("TokenizeClient", () => {
  it("matches answers to questions by id, in any order", async () => {
    const sent: TokenizeMessage[] = [];
    const c = new TokenizeClient((m) => sent.push(m) > 0);
    const a = c.tokenize("a", true);
    const b = c.tokenize("b", false);
    expect(sent.map((m) => [m.text, m.addSpecialTokens])).toEqual([["a", true], ["b", false]]);
    c.handle({ v: PROTOCOL_VERSION, type: "tokenized", id: sent[1]!.id, tokens: [2] });
    c.handle({ v: PROTOCOL_VERSION, type: "tokenized", id: "tok-unknown", tokens: [9] });
    c.handle({ v: PROTOCOL_VERSION, type: "tokenized", id: sent[0]!.id, error: "bad text" });
    await expect(b).resolves.toEqual([2]);
    await expect(a).rejects.toThrow("bad text");
  });

  it("rejects at once without an engine, and fails pending questions when the engine dies", async () => {
    await expect(new TokenizeClient(() => false).tokenize("x", true)).rejects.toThrow("no engine");
    const c = new TokenizeClient(() => true);
    const p = c.tokenize("x", true);
    c.failAll("the engine exited");
    await expect(p).rejects.toThrow("the engine exited");
  });
});
