/**
 * The step loop's sampling: the extended sampling set (min_tokens, stop tokens, penalties, bias, logprobs), one
 * native call per step (backend.sampleMany), and the event loop's turn between steps. Harness:
 * test/support/engine-fake-backend.ts.
 */
import { describe, expect, it } from "vitest";
import type { EngineMessage, RequestErrorMessage, StepMessage } from "../protocol/messages.js";
import type { SamplerHandle } from "./backend.js";
import { StepLoop } from "./step-loop.js";
import { add, EOG, EOT, FakeBackend, FakeSampler, params, setup } from "../../test/support/engine-fake-backend.js";

describe("StepLoop: the extended sampling set", () => {
  /** Fake logits where `ranked[0]` is the most likely token, then ranked[1], … (everything else far below). */
  const ranking = (ranked: number[]): number[] => {
    const l = new Array<number>(512).fill(-50);
    ranked.forEach((t, i) => (l[t] = 10 - i));
    return l;
  };
  const textOf = (t: ReturnType<typeof setup>, id: string): string => t.outputsOf(id).map((o) => o.text).join("");
  const tokensOf = (t: ReturnType<typeof setup>, id: string): number[] => t.outputsOf(id).flatMap((o) => o.tokens);

  it("min_tokens bans EOG and stop tokens until reached, counting resumed tokens, then they end the request", async () => {
    const t = setup({ maxModelLen: 64 });
    // The model always prefers EOG, then "x" (a stop token), then "a".
    t.backend.logits = () => ranking([EOG, 0x78, 0x61]);
    t.loop.submit(add("m", "p", { maxTokens: 10, minTokens: 3, stopTokenIds: [0x78] }));
    t.loop.submit(add("r", "p", { maxTokens: 10, minTokens: 3, stopTokenIds: [0x78] }, { generated: [0x61, 0x61] }));
    t.loop.submit(add("plain", "p", { maxTokens: 10 }));
    await t.drain();
    expect(tokensOf(t, "m")).toEqual([0x61, 0x61, 0x61, EOG]);
    expect(t.outputsOf("m").at(-1)!.finish).toEqual({ reason: "stop", promptTokens: 1, completionTokens: 4 });
    expect(textOf(t, "m")).toBe("aaa");
    // Two tokens were generated before the resume: one more before EOG may end it.
    expect(tokensOf(t, "r")).toEqual([0x61, EOG]);
    expect(t.outputsOf("r").at(-1)!.finish).toEqual({ reason: "stop", promptTokens: 3, completionTokens: 2 });
    expect(tokensOf(t, "plain")).toEqual([EOG]);
    // The bans are lifted once: the sampler is reconfigured when min_tokens is reached, not per token before.
    const m = t.backend.samplers[0]!;
    expect([...m.created.bias]).toEqual([[EOG, -Infinity], [EOT, -Infinity], [0x78, -Infinity]]);
    expect(m.configs.map((c) => c.bias.size)).toEqual([0]);
  });

  it("stop_token_ids end the request with reason stop; the token is reported without text, also under ignore_eos", async () => {
    const t = setup({ maxModelLen: 64 });
    const script = [0x68, 0x69, 0x21, 0x7a];
    t.backend.script = (s) => script[s.history.length]!;
    t.loop.submit(add("s", "p", { maxTokens: 10, stopTokenIds: [0x21], ignoreEos: true }));
    await t.drain();
    expect(tokensOf(t, "s")).toEqual([0x68, 0x69, 0x21]);
    expect(textOf(t, "s")).toBe("hi");
    expect(t.outputsOf("s").at(-1)!.finish).toEqual({ reason: "stop", promptTokens: 1, completionTokens: 3 });
  });

  it("logit_bias is additive and -100 bans: the biased argmax changes accordingly", async () => {
    const t = setup({ maxModelLen: 64 });
    t.backend.logits = () => ranking([0x61, 0x62, 0x63]);
    t.loop.submit(add("none", "p", { maxTokens: 2 }));
    t.loop.submit(add("ban", "p", { maxTokens: 2, logitBias: [[0x61, -100]] }));
    t.loop.submit(add("lift", "p", { maxTokens: 2, logitBias: [[0x63, 2.5]] }));
    await t.drain();
    expect(textOf(t, "none")).toBe("aa");
    expect(textOf(t, "ban")).toBe("bb");
    expect(textOf(t, "lift")).toBe("cc");
    expect([...t.backend.samplers[1]!.created.bias]).toEqual([[0x61, -Infinity]]);
    expect([...t.backend.samplers[2]!.created.bias]).toEqual([[0x63, 2.5]]);
  });

  it("presence and frequency penalties count generated tokens only (not the prompt) and reconfigure greedy sampling", async () => {
    const t = setup({ maxModelLen: 64 });
    t.backend.logits = () => ranking([0x61, 0x62, 0x63]);
    // The prompt is full of "a": a generated-only penalty leaves the first token alone.
    t.loop.submit(add("pres", "aaaa", { maxTokens: 4, presencePenalty: 1.5 }));
    t.loop.submit(add("freq", "aaaa", { maxTokens: 5, frequencyPenalty: 0.6 }));
    await t.drain();
    // Presence 1.5, once per used token: a(10) → b (9 > a's 8.5) → a (8.5 > b's 7.5 and c's 8) → a (it does not grow).
    expect(textOf(t, "pres")).toBe("abaa");
    // Frequency 0.6 per occurrence: a(10) → a(9.4) → b(9) → a(8.8) → b(8.4)… as the counts grow.
    const freq = t.backend.samplers[1]!;
    expect(freq.configs.map((c) => [...c.bias])).toEqual([[[0x61, -0.6]], [[0x61, -0.6 * 2]], [[0x61, -0.6 * 2], [0x62, -0.6]], [[0x61, -0.6 * 3], [0x62, -0.6]]]);
    expect(textOf(t, "freq")).toBe("aabab");
  });

  it("repetition penalty covers prompt + resumed tokens: the sampler gets them as its history", async () => {
    const t = setup({ maxModelLen: 64 });
    t.backend.logits = () => ranking([0x61, 0x62, 0x63]);
    t.loop.submit(add("rep", "ab", { maxTokens: 3, repetitionPenalty: 1.25 }, { generated: [0x63] }));
    t.loop.submit(add("off", "ab", { maxTokens: 3 }));
    await t.drain();
    expect(t.backend.samplers[0]!.penaltyHistory).toEqual([0x61, 0x62, 0x63]);
    expect(t.backend.samplers[0]!.created.repetitionPenalty).toBe(1.25);
    expect(t.backend.samplers[1]!.penaltyHistory).toEqual([]);
    // All of a, b, c are penalised equally (10/1.25, 9/1.25, 8/1.25): the order stays, "a" wins.
    expect(textOf(t, "rep")).toBe("aa");
  });

  it("a continuation with `generated` samples exactly what the uninterrupted run did, at every resume point", async () => {
    // Logits that depend on the position, so every token matters; all penalties and bias on.
    const logitsAt = (pos: number): number[] => {
      const l = new Array<number>(512).fill(-50);
      for (let k = 0; k < 6; k++) l[0x61 + ((pos * 5 + k * 3) % 7)] = 6 - k * 0.7;
      l[EOG] = pos % 4 === 0 ? 6.5 : -50;
      return l;
    };
    const p = { maxTokens: 12, presencePenalty: 0.4, frequencyPenalty: 0.3, repetitionPenalty: 1.2, minTokens: 9, logitBias: [[0x62, 0.5]] as [number, number][] };
    const run = async (generated: number[]): Promise<number[]> => {
      const t = setup({ maxModelLen: 64 });
      t.backend.logits = (_s, item) => logitsAt(item.pos + item.tokens.length);
      t.loop.submit(add("c", "abcab", p, generated.length > 0 ? { generated } : {}));
      await t.drain();
      return [...generated, ...tokensOf(t, "c")];
    };
    const full = await run([]);
    expect(full.length).toBeGreaterThan(9);
    expect(new Set(full).size).toBeGreaterThan(3);
    for (let k = 1; k < full.length - 1; k++) expect(await run(full.slice(0, k)), `resumed after ${k}`).toEqual(full);
  });

  it("logprobs: one entry per token from the backend, at the token's own logit index; none unless asked", async () => {
    const t = setup({ maxNumSeqs: 2 });
    t.loop.submit(add("lp", "abc", { maxTokens: 3, logprobs: 2 }));
    t.loop.submit(add("no", "xy", { maxTokens: 3 }));
    await t.drain();
    const outs = t.outputsOf("lp").filter((o) => o.tokens.length > 0);
    expect(outs).toHaveLength(3);
    for (const o of outs) {
      // Each entry carries its token's raw bytes (protocol TokenLogprob.bytes).
      expect(o.logprobs).toEqual([{ token: o.tokens[0], logprob: -(o.tokens[0]! + 1), bytes: [...t.backend.bytesOf(o.tokens[0]!)], top: [{ token: 0, logprob: -1, bytes: [0] }, { token: 1, logprob: -2, bytes: [1] }] }]);
    }
    expect(t.outputsOf("no").some((o) => o.logprobs !== undefined)).toBe(false);
    // Only the request that asked paid a call; its logit index is the one it was sampled at (it is first in each batch).
    expect(t.backend.logprobCalls.map(([idx, , top]) => [idx, top])).toEqual([[0, 2], [0, 2], [0, 2]]);
    expect(t.backend.logprobCalls.map(([, tok]) => tok)).toEqual(outs.map((o) => o.tokens[0]));
  });

  it("refuses params the engine cannot serve with invalid_params: out-of-vocabulary ids, logprobs over the cap or without support", async () => {
    const t = setup();
    t.loop.submit(add("bias", "a", { logitBias: [[600, 1]] }));
    t.loop.submit(add("stop", "a", { stopTokenIds: [512] }));
    t.loop.submit(add("lp", "a", { logprobs: 21 }));
    t.loop.submit(add("ok", "a", { logprobs: 20, maxTokens: 1 }));
    await t.drain();
    const errs = t.messages.filter((m): m is RequestErrorMessage => m.type === "request_error");
    expect(errs.map((e) => [e.id, e.code])).toEqual([["bias", "invalid_params"], ["stop", "invalid_params"], ["lp", "invalid_params"]]);
    expect(t.outputsOf("ok").at(-1)!.logprobs![0]!.top).toHaveLength(20);
    expect(t.loop.maxTopLogprobs).toBe(20);
    const bare = setup();
    Object.assign(bare.backend, { logprobs: undefined });
    expect(bare.loop.maxTopLogprobs).toBe(-1);
    bare.loop.submit(add("lp0", "a", { logprobs: 0 }));
    await bare.loop.step();
    expect(bare.messages).toEqual([expect.objectContaining({ type: "request_error", id: "lp0", code: "invalid_params" })]);
  });

  // The breaker's case: -100 on every token but the end ones, which ignore_eos (for good) or min_tokens (until then)
  // bans too, sampled banned tokens with a 200; the engine refuses the add instead. One token left open is served.
  it("refuses bans that leave no token once ignore_eos or min_tokens bans the end tokens too; one token left open is served", async () => {
    const t = setup({ maxModelLen: 64 });
    const allBut = (...open: number[]): [number, number][] => Array.from({ length: 512 }, (_, i) => i).filter((i) => !open.includes(i)).map((i) => [i, -100]);
    t.loop.submit(add("eos", "a", { maxTokens: 3, ignoreEos: true, logitBias: allBut(EOG, EOT) }));
    t.loop.submit(add("min", "a", { maxTokens: 3, minTokens: 2, stopTokenIds: [0x78], logitBias: allBut(EOG, EOT, 0x78) }));
    t.loop.submit(add("resumed", "a", { maxTokens: 4, minTokens: 2, logitBias: allBut(EOG, EOT, 0x61) }, { generated: [0x61, 0x61] }));
    t.loop.submit(add("open", "a", { maxTokens: 2, ignoreEos: true, logitBias: allBut(EOG, EOT, 0x62) }));
    await t.drain();
    const errs = t.messages.filter((m): m is RequestErrorMessage => m.type === "request_error");
    expect(errs.map((e) => [e.id, e.code])).toEqual([["eos", "invalid_params"], ["min", "invalid_params"]]);
    expect(errs.every((e) => e.message.startsWith("Invalid value for 'logit_bias'"))).toBe(true);
    expect(tokensOf(t, "open")).toHaveLength(2);
    expect(t.outputsOf("resumed").at(-1)!.finish?.reason).toBeDefined();
    expect(errs[0]!.message).toContain("with ignore_eos");
  });

  it("names ignore_eos only when its bans completed the ban: logit_bias alone on the whole vocabulary says so", async () => {
    const t = setup({ maxModelLen: 64 });
    const all: [number, number][] = Array.from({ length: 512 }, (_, i) => [i, -100]);
    t.loop.submit(add("all", "a", { maxTokens: 2, logitBias: all }));
    t.loop.submit(add("all-eos", "a", { maxTokens: 2, ignoreEos: true, logitBias: all }));
    await t.drain();
    const errs = t.messages.filter((m): m is RequestErrorMessage => m.type === "request_error");
    expect(errs.map((e) => [e.id, e.message])).toEqual([
      ["all", "Invalid value for 'logit_bias': logit_bias bans every token of the vocabulary, so nothing could be generated."],
      ["all-eos", "Invalid value for 'logit_bias': logit_bias bans every token of the vocabulary, so nothing could be generated."],
    ]);
  });
});

describe("StepLoop: one native call samples the step (backend.sampleMany)", () => {
  /** The fake backend with a batched sampler: the same per-sampler rule as `sample`, one call per step, recorded. */
  class BatchingBackend extends FakeBackend {
    /** Sequences per sampleMany call, in call order. */
    readonly calls: number[] = [];
    /** Calls of the one-sequence `sample`. */
    singles = 0;
    /** Sampler index whose item fails inside the batch (an Error in its place). */
    failSampler: number | null = null;
    /** The next sampleMany call throws as a whole. */
    throwNext = false;
    override async sample(batchLogitIndex: number, sampler: SamplerHandle): Promise<number> {
      this.singles += 1;
      return super.sample(batchLogitIndex, sampler);
    }
    sampleMany(batch: readonly { batchLogitIndex: number; sampler: SamplerHandle }[]): (number | Error)[] {
      this.calls.push(batch.length);
      if (this.throwNext) {
        this.throwNext = false;
        throw new Error("native batch call failed");
      }
      return batch.map(({ batchLogitIndex, sampler }) => ((sampler as FakeSampler).index === this.failSampler ? new Error("sampler failed") : this.pick(batchLogitIndex, sampler)));
    }
  }
  // Position-dependent logits with penalties and bias on, so every sampler's own history matters.
  const logitsAt = (pos: number, salt: number): number[] => {
    const l = new Array<number>(512).fill(-50);
    for (let k = 0; k < 6; k++) l[0x61 + ((pos * 5 + k * 3 + salt) % 7)] = 6 - k * 0.7;
    return l;
  };
  const p = { maxTokens: 8, presencePenalty: 0.4, frequencyPenalty: 0.3, repetitionPenalty: 1.2, logitBias: [[0x62, 0.5]] as [number, number][] };
  const tokensOf = (t: ReturnType<typeof setup>, id: string): number[] => t.outputsOf(id).flatMap((o) => o.tokens);

  async function run(backend: FakeBackend, ids: string[]) {
    const messages: EngineMessage[] = [];
    const loop = new StepLoop(backend, { maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 64 }, (m) => messages.push(structuredClone(m)));
    backend.logits = (s, item) => logitsAt(item.pos + item.tokens.length, s.index);
    for (const id of ids) loop.submit(add(id, `prompt ${id}`, p));
    let i = 0;
    do {
      if (i++ > 100) throw new Error("loop does not drain");
      await loop.step();
    } while (loop.scheduler.hasWork);
    const steps = messages.filter((m): m is StepMessage => m.type === "step");
    const outs = (id: string) => steps.flatMap((m) => m.outputs.filter((o) => o.id === id));
    return { steps, tokens: (id: string) => outs(id).flatMap((o) => o.tokens), finish: (id: string) => outs(id).at(-1)?.finish };
  }

  it("samples every sequence of a step in one call and yields exactly the tokens of one call per sequence", async () => {
    const ids = ["a", "b", "c", "d"];
    const plain = await run(new FakeBackend(), ids);
    const batching = new BatchingBackend();
    const batched = await run(batching, ids);
    for (const id of ids) {
      expect(plain.tokens(id)).toHaveLength(8);
      expect(batched.tokens(id), id).toEqual(plain.tokens(id));
    }
    // The four requests differ (the salt), so a mixed-up assignment would show.
    expect(new Set(ids.map((id) => plain.tokens(id).join())).size).toBe(4);
    expect(batching.singles).toBe(0);
    expect(batching.calls).toEqual(new Array(8).fill(4));
  });

  it("an item that fails in the batch fails only its request; a batch call that throws fails only its items", async () => {
    const plain = await run(new FakeBackend(), ["a", "b", "c"]);
    const itemFails = new BatchingBackend();
    itemFails.failSampler = 1;
    const r = await run(itemFails, ["a", "b", "c"]);
    expect(r.finish("b")).toMatchObject({ reason: "error" });
    expect(r.tokens("a")).toEqual(plain.tokens("a"));
    expect(r.tokens("c")).toEqual(plain.tokens("c"));
    const callFails = new BatchingBackend();
    callFails.throwNext = true;
    const r2 = await run(callFails, ["a", "b"]);
    expect(r2.finish("a")).toMatchObject({ reason: "error" });
    expect(r2.finish("b")).toMatchObject({ reason: "error" });
    // The loop goes on: a later request is served by the same loop and backend.
    const after = await run(callFails, ["c"]);
    expect(after.tokens("c")).toEqual(plain.tokens("c"));
  });

  it("log probabilities are still read for a request sampled in the batch", async () => {
    const t = setup({ maxNumSeqs: 2 });
    const b = new BatchingBackend();
    const loop = new StepLoop(b, { maxNumSeqs: 2, maxNumBatchedTokens: 16, maxModelLen: 32 }, (m) => t.messages.push(structuredClone(m)));
    loop.submit(add("lp", "abc", { maxTokens: 3, logprobs: 2 }));
    loop.submit(add("no", "xy", { maxTokens: 3 }));
    do await loop.step();
    while (loop.scheduler.hasWork);
    expect(b.singles).toBe(0);
    const outs = t.outputsOf("lp").filter((o) => o.tokens.length > 0);
    expect(outs).toHaveLength(3);
    expect(b.logprobCalls.map(([, tok]) => tok)).toEqual(outs.map((o) => o.tokens[0]));
    expect(tokensOf(t, "no")).toHaveLength(3);
  });

  it("every step message says where its time went: decode + sample <= step", async () => {
    const r = await run(new BatchingBackend(), ["a", "b"]);
    const decoding = r.steps.filter((s) => s.batchTokens > 0);
    expect(decoding.length).toBeGreaterThan(0);
    for (const s of decoding) {
      const ph = s.stats.phaseUs!;
      expect(ph.decode).toBeGreaterThanOrEqual(0);
      expect(ph.sample).toBeGreaterThanOrEqual(0);
      expect(ph.decode + ph.sample).toBeLessThanOrEqual(ph.step + 2); // each is rounded on its own
    }
  });
});

describe("StepLoop.run: the event loop gets a turn between steps", () => {
  it("a busy loop whose backend never leaves the microtask queue still receives commands from I/O callbacks", async () => {
    // FakeBackend's decode and sample settle without any real I/O (like Keel's synchronous native calls).
    const t = setup({ maxNumSeqs: 1, maxModelLen: 4096, maxNumBatchedTokens: 64 });
    t.loop.submit(add("long", "p", { maxTokens: 4000, ignoreEos: true }));
    const running = t.loop.run();
    // An abort that arrives the way the channel delivers commands: from an I/O-phase callback.
    await new Promise<void>((resolve) => setImmediate(resolve));
    setImmediate(() => t.loop.submit({ type: "abort", ids: ["long"] }));
    await new Promise<void>((resolve) => {
      const check = (): void => (t.outputsOf("long").some((o) => o.finish) ? resolve() : void setImmediate(check));
      setImmediate(check);
    });
    t.loop.stop();
    await running;
    const finish = t.outputsOf("long").find((o) => o.finish)!.finish!;
    expect(finish.reason).toBe("abort");
    expect(finish.completionTokens).toBeLessThan(4000);
  });
});
