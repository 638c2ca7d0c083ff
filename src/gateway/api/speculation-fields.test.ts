/** OVMS's prompt-lookup request fields (num_assistant_tokens, max_ngram_size) → SamplingParams.speculation, or a 400. */
import { describe, expect, it } from "vitest";
import type { EngineCapabilities } from "../../protocol/messages.js";
import { KeelHttpError } from "../http/errors.js";
import { parseChatRequest } from "./chat-request.js";
import { parseCompletionRequest } from "./completions.js";
import { checkCapabilities, checkSpeculation } from "./sampling.js";

const chat = (extra: Record<string, unknown>) => parseChatRequest({ model: "m", messages: [{ role: "user", content: "Hi" }], ...extra });
const caps: EngineCapabilities = { exactSeededResume: true, maxTopLogprobs: 5, extendedSampling: true, grammars: true, sharedPrefill: false, promptLookup: true };

function refusal(fn: () => unknown): KeelHttpError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(KeelHttpError);
    return err as KeelHttpError;
  }
  throw new Error("expected a 400");
}

describe("num_assistant_tokens / max_ngram_size", () => {
  it("map to speculation on chat and completions; either alone asks for it with OVMS's defaults (5, 3)", () => {
    expect(chat({ num_assistant_tokens: 8, max_ngram_size: 2 }).sampling.speculation).toEqual({ numAssistantTokens: 8, maxNgramSize: 2 });
    expect(chat({ max_ngram_size: 4 }).sampling.speculation).toEqual({ numAssistantTokens: 5, maxNgramSize: 4 });
    expect(chat({ num_assistant_tokens: 0 }).sampling.speculation).toEqual({ numAssistantTokens: 0, maxNgramSize: 3 });
    expect(chat({}).sampling.speculation).toBeUndefined();
    expect(parseCompletionRequest({ model: "m", prompt: "x", num_assistant_tokens: 3 }).sampling.speculation).toEqual({ numAssistantTokens: 3, maxNgramSize: 3 });
  });

  it("refuses values out of range with a 400 naming the field", () => {
    const big = refusal(() => chat({ num_assistant_tokens: 33 }));
    expect([big.status, big.param]).toEqual([400, "num_assistant_tokens"]);
    expect(big.message).toMatch(/between 0 and 32/);
    expect(refusal(() => chat({ max_ngram_size: 0 })).param).toBe("max_ngram_size");
    expect(refusal(() => chat({ num_assistant_tokens: 2.5 })).param).toBe("num_assistant_tokens");
  });

  it("need the engine's promptLookup capability, unless the request turns it off", () => {
    expect(checkCapabilities({ speculation: { numAssistantTokens: 5, maxNgramSize: 3 } }, null, caps, 100)).toBeNull();
    const openvino = { ...caps, extendedSampling: false, promptLookup: undefined };
    const refused = checkCapabilities({ speculation: { numAssistantTokens: 5, maxNgramSize: 3 } }, null, openvino, 100, "openvino-genai");
    expect(refused).toMatchObject({ status: 400, code: "unsupported_field", param: "num_assistant_tokens" });
    expect(refused?.message).toMatch(/openvino-genai\) does not apply prompt-lookup decoding/);
    expect(checkCapabilities({ speculation: { numAssistantTokens: 0, maxNgramSize: 3 } }, null, openvino, 100)).toBeNull();
  });

  it("asked for by the request with logprobs or a guide: a 400 (the engine verifies drafts for neither); 0 or neither field passes", () => {
    const on = { speculation: { numAssistantTokens: 5, maxNgramSize: 3 } };
    const withLogprobs = checkSpeculation(on, true, false);
    expect(withLogprobs).toMatchObject({ status: 400, param: "num_assistant_tokens" });
    expect(withLogprobs?.message).toMatch(/cannot be combined with log probabilities/);
    expect(checkSpeculation(on, false, true)?.message).toMatch(/cannot be combined with a guide/);
    expect(checkSpeculation(on, false, false)).toBeNull();
    expect(checkSpeculation({ speculation: { numAssistantTokens: 0, maxNgramSize: 3 } }, true, true)).toBeNull();
    expect(checkSpeculation({}, true, true)).toBeNull();
    // max_ngram_size alone asks for it (5 drafts): refused the same way.
    expect(checkSpeculation(chat({ max_ngram_size: 2, logprobs: true }).sampling, true, false)).toMatchObject({ status: 400 });
  });
});
