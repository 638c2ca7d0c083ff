/**
 * checkCapabilities: the extended sampling fields run only on an engine that applies them — all of them with
 * `extendedSampling`, else only those it lists in `samplingFields` (the OpenVINO engine: no logit_bias).
 */
import { describe, expect, it } from "vitest";
import type { EngineCapabilities } from "../../protocol/messages.js";
import { checkCapabilities, type ExtendedSampling } from "./sampling.js";

const base: EngineCapabilities = { exactSeededResume: true, maxTopLogprobs: 0, extendedSampling: false, grammars: false, sharedPrefill: false };
const openvino: EngineCapabilities = { ...base, samplingFields: ["presencePenalty", "frequencyPenalty", "repetitionPenalty", "minP", "minTokens", "stopTokenIds"] };
const VOCAB = 1000;

describe("checkCapabilities and samplingFields", () => {
  it("without extendedSampling the listed fields are accepted, one not listed is refused naming it", () => {
    const listed: ExtendedSampling = { presencePenalty: 1, frequencyPenalty: -1, repetitionPenalty: 1.2, minP: 0.1, minTokens: 3, stopTokenIds: [7] };
    expect(checkCapabilities(listed, null, openvino, VOCAB)).toBeNull();
    const refused = checkCapabilities({ presencePenalty: 1, logitBias: [[5, 10]] }, null, openvino, VOCAB);
    expect(refused?.status).toBe(400);
    expect(refused).toMatchObject({ code: "unsupported_field", param: "logit_bias" });
    expect(refused?.message).toContain("The current engine does not apply this sampling parameter.");
    // With the engine's name from its ready message, the 400 names it.
    expect(checkCapabilities({ logitBias: [[5, 10]] }, null, openvino, VOCAB, "openvino-genai@2026.4.1")?.message).toContain("The current engine (openvino-genai@2026.4.1) does not apply this sampling parameter.");
    expect(checkCapabilities({}, { param: "top_logprobs", n: 2 }, openvino, VOCAB, "openvino-genai@2026.4.1")?.message).toBe("Invalid value for 'top_logprobs': the current engine (openvino-genai@2026.4.1) returns only the sampled token's log probability, no alternatives (got 2); use 0, or serve with --engine llama.cpp for alternatives.");
  });

  it("without extendedSampling and without a list, every extended field is refused (the first one named)", () => {
    expect(checkCapabilities({ minP: 0.1 }, null, base, VOCAB)).toMatchObject({ code: "unsupported_field", param: "min_p" });
    expect(checkCapabilities({ stopTokenIds: [1] }, null, { ...base, samplingFields: [] }, VOCAB)?.param).toBe("stop_token_ids");
    expect(checkCapabilities({}, null, base, VOCAB)).toBeNull();
  });

  it("with extendedSampling every field is accepted, whatever samplingFields says; token ids are still checked against the vocabulary", () => {
    const all: ExtendedSampling = { presencePenalty: 1, logitBias: [[5, 10]], minTokens: 2, stopTokenIds: [3] };
    expect(checkCapabilities(all, null, { ...base, extendedSampling: true }, VOCAB)).toBeNull();
    expect(checkCapabilities(all, null, { ...base, extendedSampling: true, samplingFields: ["minP"] }, VOCAB)).toBeNull();
    expect(checkCapabilities({ stopTokenIds: [VOCAB] }, null, openvino, VOCAB)).toMatchObject({ code: "invalid_value", param: "stop_token_ids" });
  });

  it("a logit_bias that bans every token of the vocabulary is a 400 (a sampler would still have to pick a banned one); all but one is served", () => {
    const ext = { ...base, extendedSampling: true };
    const all = Array.from({ length: VOCAB }, (_, t): [number, number] => [t, -100]);
    expect(checkCapabilities({ logitBias: all }, null, ext, VOCAB)).toMatchObject({ status: 400, code: "invalid_value", param: "logit_bias" });
    expect(checkCapabilities({ logitBias: all }, null, ext, VOCAB)?.message).toContain("bans every token of the vocabulary (1000 tokens at -100)");
    expect(checkCapabilities({ logitBias: all.slice(1) }, null, ext, VOCAB)).toBeNull();
    expect(checkCapabilities({ logitBias: [...all.slice(1), [0, -99]] }, null, ext, VOCAB)).toBeNull();
  });
});
