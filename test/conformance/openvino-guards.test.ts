/**
 * The OpenVINO engine's guards (issue #11), driven over the protocol like the conformance suite: a KV pool far
 * smaller than the load makes OpenVINO preempt, and every greedy stream still equals its solo run; a request that
 * could outgrow the whole pool is refused at add while its neighbours finish; a step() exception is fatal (the
 * worker exits non-zero after a `fatal`, so the gateway's restart-and-resume takes over).
 */
import { afterEach, describe, expect, it } from "vitest";
import { ensureTinyModel } from "../../src/model/default-model.js";
import { OPENVINO_WORKER } from "../../src/engine-openvino/venv.js";
import { PROTOCOL_VERSION, type RequestOutput, type SamplingParams, type StepMessage } from "../../src/protocol/messages.js";
import type { EngineConfig } from "../../src/protocol/engine-config.js";
import { openvinoPython } from "../support/openvino.js";
import { isReady, launch, type EngineProcess } from "./engine-conformance.js";

const BLOCK = 32;
let engine: EngineProcess | null = null;

afterEach(async () => {
  if (engine && engine.child.exitCode === null && engine.child.signalCode === null) engine.child.kill("SIGKILL");
  await engine?.exited;
  engine = null;
});

async function start(config: Partial<EngineConfig>, env: Record<string, string> = {}): Promise<EngineProcess> {
  const modelPath = await ensureTinyModel("keel-tiny-f16");
  engine = launch({
    command: await openvinoPython(),
    args: [OPENVINO_WORKER],
    config: { mode: "serve", modelPath, maxNumSeqs: 4, maxNumBatchedTokens: 16, maxModelLen: 512, prefixCaching: false, threads: 1, flashAttention: false, kvCacheType: "f16", device: "cpu", ...config },
    env,
  });
  await engine.waitFor(isReady);
  return engine;
}

const params = (p: Partial<SamplingParams> = {}): SamplingParams => ({ maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: true, ...p });
const add = (e: EngineProcess, id: string, text: string, p: Partial<SamplingParams> = {}): void =>
  e.send({ v: PROTOCOL_VERSION, type: "add", id, prompt: { text }, params: params(p) });
const tokensOf = (outs: RequestOutput[]): number[] => outs.flatMap((o) => o.tokens);
const PROMPTS = ["the mill by the river", "queues and servers", "a long walk at dawn", "four streams at once"];

describe("OpenVINO engine guards", () => {
  it("a pool of 8 blocks under 4 streams of 200 tokens: OpenVINO preempts (stats.preemptions > 0) and every stream equals its solo run", { timeout: 120_000 }, async () => {
    const e = await start({ kvBlocks: 8 });
    const solo: number[][] = [];
    for (const [i, p] of PROMPTS.entries()) {
      add(e, `solo-${i}`, p, { maxTokens: 180 });
      solo.push(tokensOf(await e.finished(`solo-${i}`)));
    }
    const before = e.steps().at(-1)!.stats.preemptions ?? 0;
    PROMPTS.forEach((p, i) => add(e, `together-${i}`, p, { maxTokens: 180 }));
    for (const [i] of PROMPTS.entries()) {
      const outs = await e.finished(`together-${i}`);
      expect(outs.at(-1)!.finish!.reason).toBe("length");
      expect(tokensOf(outs), `stream ${i}`).toEqual(solo[i]);
    }
    const after = e.steps().at(-1)!.stats.preemptions ?? 0;
    expect(after).toBeGreaterThan(before);
    // The pool was full at some point while they ran together.
    const peak = Math.max(...e.steps().map((s: StepMessage) => s.stats.kvTokensInUse ?? 0));
    expect(peak).toBeGreaterThan(0.75 * 8 * BLOCK);
  });

  it("a request whose prompt + max_tokens exceeds the whole pool is refused at add; its neighbours finish", async () => {
    const e = await start({ kvBlocks: 8 });
    add(e, "neighbour", PROMPTS[0]!, { maxTokens: 40 });
    add(e, "too-big", PROMPTS[1]!, { maxTokens: 8 * BLOCK });
    const err = await e.refused("too-big");
    expect(err.code).toBe("context_length_exceeded");
    expect(err.message).toMatch(/pool/);
    expect((await e.finished("neighbour")).at(-1)!.finish!.reason).toBe("length");
    // Without max_tokens the request runs until the pool's capacity instead of being refused.
    add(e, "open-ended", PROMPTS[2]!, { maxTokens: null });
    const outs = await e.finished("open-ended");
    expect(outs.at(-1)!.finish!.reason).toBe("length");
    expect(outs.at(-1)!.finish!.promptTokens + outs.at(-1)!.finish!.completionTokens).toBeLessThanOrEqual(8 * BLOCK);
  });

  it("40 prompts of ~13 blocks through a 16-block pool all finish: admission keeps OpenVINO from half-prefilling them into an IGNORED deadlock", { timeout: 120_000 }, async () => {
    // Prompts sharing a long prefix with prefix caching on (OVMS's default) are one way into the deadlock (aborts are
    // another; the storm e2e covers them). Without the admission rule OpenVINO turns requests IGNORED and the worker exits.
    const e = await start({ kvBlocks: 16, maxNumBatchedTokens: 32, prefixCaching: true });
    const long = (i: number): string => "the river carries queues and servers past the old mill; ".repeat(21 + (i % 3)) + `question ${i}`;
    const ids = Array.from({ length: 40 }, (_, i) => `long-${i}`);
    ids.forEach((id, i) => add(e, id, long(i), { maxTokens: [1, 2, 8, 24][i % 4]! }));
    for (const id of ids) {
      const outs = await e.finished(id);
      expect(outs.at(-1)!.finish!.reason, id).toBe("length");
      expect(outs.find((o) => o.admitted)!.admitted!.promptTokens.length).toBeGreaterThan(11 * BLOCK);
    }
    // OpenVINO never dropped one (a dropped request would be re-added, so this is what shows the admission rule).
    expect(e.stderr.some((l) => l.includes('"event":"ignored_requeued"'))).toBe(false);
    expect(e.messages.some((m) => m.type === "fatal")).toBe(false);
    expect(e.child.exitCode).toBeNull();
  });

  it("aborting the requests that fill the pool while others wait: the waiting ones finish, and with nothing in flight no KV is reported held", { timeout: 120_000 }, async () => {
    const e = await start({ kvBlocks: 8 });
    const prompt = (i: number): string => `${i} ` + "queues and servers by the river; ".repeat(8);
    for (let round = 0; round < 5; round++) {
      const [a, b, c, d] = ["a", "b", "c", "d"].map((x) => `r${round}-${x}`);
      add(e, a!, prompt(0), { maxTokens: 100 });
      add(e, b!, prompt(1), { maxTokens: 100 });
      for (const id of [a!, b!]) await e.waitFor((m) => m.type === "step" && m.outputs.some((o) => o.id === id && o.tokens.length > 0));
      add(e, c!, prompt(2), { maxTokens: 100 });
      add(e, d!, prompt(3), { maxTokens: 100 });
      await e.waitFor((m) => m.type === "step" && m.stats.waiting >= 1);
      e.send({ v: PROTOCOL_VERSION, type: "abort", ids: [a, b] });
      for (const id of [c!, d!]) expect((await e.finished(id)).at(-1)!.finish!.reason, id).toBe("length");
    }
    expect(e.messages.some((m) => m.type === "fatal")).toBe(false);
    expect(e.stderr.some((l) => l.includes('"event":"ignored_requeued"'))).toBe(false);
    expect(e.child.exitCode).toBeNull();
    // Nothing in flight: nothing held (the gauge does not keep the aborted requests' blocks).
    const idle = e.steps().at(-1)!;
    expect(idle.stats.running).toBe(0);
    expect(idle.stats.kvTokensInUse).toBe(0);
  });

  it("a request OpenVINO drops (IGNORED) is re-added with what it generated: one stream, token-identical to its solo run, no exit", { timeout: 60_000 }, async () => {
    const solo = await start({});
    add(solo, "solo", PROMPTS[3]!, { maxTokens: 60 });
    const expected = tokensOf(await solo.finished("solo"));
    solo.send({ v: PROTOCOL_VERSION, type: "shutdown" });
    await solo.exited;
    const e = await start({}, { KEEL_FAULT_INJECTION: JSON.stringify({ ignoreAtStep: 20 }) });
    add(e, "dropped", PROMPTS[3]!, { maxTokens: 60 });
    const outs = await e.finished("dropped");
    expect(tokensOf(outs)).toEqual(expected);
    expect(outs.filter((o) => o.admitted)).toHaveLength(1);
    expect(outs.at(-1)!.finish).toMatchObject({ reason: "length", completionTokens: 60 });
    expect(e.stderr.some((l) => l.includes('"event":"ignored_requeued"'))).toBe(true);
    expect(e.steps().at(-1)!.stats.preemptions).toBeGreaterThanOrEqual(1);
    expect(e.child.exitCode).toBeNull();
  });

  it("a step() exception is fatal: `fatal`, then exit 1 (the gateway restarts and resumes)", async () => {
    const e = await start({}, { KEEL_FAULT_INJECTION: JSON.stringify({ throwAtStep: 3 }) });
    add(e, "victim", PROMPTS[0]!, { maxTokens: 20 });
    const fatal = await e.waitFor((m) => m.type === "fatal");
    expect(fatal.type === "fatal" && fatal.message).toMatch(/step\(\) failed/);
    expect(await e.exited).toEqual({ code: 1, signal: null });
    expect(e.outputsOf("victim").some((o) => o.finish)).toBe(false);
  });
});
