/** An engine's refusal as the client sees it: the code's status, the field, and for a too-long prompt what to do. */
import { describe, expect, it } from "vitest";
import { engineErrorToHttp } from "./engine-errors.js";
import { contextLengthFor } from "./errors.js";

const TOO_LONG = "This model's maximum context length is 4096 tokens. However, you requested 4580 tokens (4080 in the messages, 500 in the completion).";

describe("engine refusals in HTTP terms", () => {
  it("a too-long prompt is a 400 on messages that says what to do, once", () => {
    const e = engineErrorToHttp("context_length_exceeded", TOO_LONG);
    expect([e.status, e.code, e.param]).toEqual([400, "context_length_exceeded", "messages"]);
    expect(e.message).toBe(`${TOO_LONG} Please reduce the length of the messages or completion.`);
    const pool = "This request needs 900 tokens of KV cache but the engine's whole pool holds 512 (16 blocks of 32); lower max_tokens or raise --cache_size / --num_kv_blocks.";
    expect(engineErrorToHttp("context_length_exceeded", pool).message).toBe(pool);
  });

  it("on /v1/completions and /v1/responses the same answer names prompt / input; other errors pass unchanged", () => {
    const e = engineErrorToHttp("context_length_exceeded", TOO_LONG);
    const completions = contextLengthFor(e, "prompt");
    expect([completions.param, completions.message]).toEqual(["prompt", "This model's maximum context length is 4096 tokens. However, you requested 4580 tokens (4080 in the prompt, 500 in the completion). Please reduce the length of the prompt or completion."]);
    expect(contextLengthFor(e, "input").param).toBe("input");
    const other = engineErrorToHttp("invalid_params", "the OpenVINO engine cannot apply this guide");
    expect(contextLengthFor(other, "prompt")).toBe(other);
    expect(engineErrorToHttp("engine_error", "boom").status).toBe(500);
  });
});
