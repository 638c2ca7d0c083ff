/**
 * The fault-injecting wrapper: each switch fires where docs/fault-injection.md says (step-keyed ones once, on the
 * first process only; prompt-keyed ones on every matching batch), and everything else reaches the wrapped backend.
 */
import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION, type AddMessage } from "../protocol/messages.js";
import { grammarSupport, type DecodeItem, type ModelBackend, type SamplerHandle } from "./backend.js";
import { FaultyBackend, faultSwitchesFrom, type FaultSwitches } from "./faulty-backend.js";

class Inner implements ModelBackend {
  readonly eogTokens = [0];
  readonly vocabSize = 256;
  readonly decoded: number[] = [];
  tokenize(text: string): number[] {
    return [...Buffer.from(text)];
  }
  bytesOf(token: number): Uint8Array {
    return Uint8Array.of(token);
  }
  isEndOfGeneration(token: number): boolean {
    return token === 0;
  }
  createSampler(): SamplerHandle {
    return { configure: () => undefined, dispose: () => undefined };
  }
  async decode(items: DecodeItem[], step: number): Promise<number[]> {
    this.decoded.push(step);
    return items.map((_, i) => i);
  }
  async sample(): Promise<number> {
    return 1;
  }
  clearSequence(): void {}
}

const item = (id: string): DecodeItem => ({ id, slot: 0, pos: 0, tokens: [1], wantsLogits: true });
const add = (id: string, prompt: AddMessage["prompt"]): AddMessage => ({ v: PROTOCOL_VERSION, type: "add", id, prompt, params: {} as AddMessage["params"] });

function wrap(switches: FaultSwitches, firstProcess = true) {
  const inner = new Inner();
  const fired: string[] = [];
  const faulty = new FaultyBackend(inner, switches, firstProcess, {
    injected: (fault, step) => fired.push(`${fault}@${step}`),
    abort: () => {
      throw new Error("aborted");
    },
  });
  return { inner, faulty, fired };
}

describe("FaultyBackend", () => {
  it("throwAtStep throws once at that step (the retry decodes); crashAtStep aborts once", async () => {
    const t = wrap({ throwAtStep: 2, crashAtStep: 3 });
    await t.faulty.decode([item("a")], 1);
    await expect(t.faulty.decode([item("a")], 2)).rejects.toThrow("injected failure at step 2");
    await t.faulty.decode([item("a")], 2);
    await expect(t.faulty.decode([item("a")], 3)).rejects.toThrow("aborted");
    await t.faulty.decode([item("a")], 3);
    expect(t.fired).toEqual(["throw@2", "crash@3"]);
    expect(t.inner.decoded).toEqual([1, 2, 3]);
  });

  it("step-keyed switches do nothing on a restarted engine", async () => {
    const t = wrap({ throwAtStep: 1, crashAtStep: 1, hangAtStep: 1 }, false);
    await expect(t.faulty.decode([item("a")], 1)).resolves.toEqual([0]);
    expect(t.fired).toEqual([]);
  });

  it("hangAtStep never resolves that decode", async () => {
    const t = wrap({ hangAtStep: 1 });
    const hung = t.faulty.decode([item("a")], 1);
    const outcome = await Promise.race([hung.then(() => "resolved"), t.faulty.decode([item("a")], 2).then(() => "other step decoded")]);
    expect(outcome).toBe("other step decoded");
    expect(t.fired).toEqual(["hang@1"]);
    expect(t.inner.decoded).toEqual([2]);
  });

  it("failOnPrompt fails every batch holding the marked prompt, on every process; crashOnPrompt aborts", async () => {
    const t = wrap({ failOnPrompt: "POISON" }, false);
    t.faulty.noteAdd(add("bad", { text: "a POISON prompt" }));
    t.faulty.noteAdd(add("ok", { text: "fine" }));
    for (const step of [1, 2]) await expect(t.faulty.decode([item("ok"), item("bad")], step)).rejects.toThrow("poisoned request");
    await expect(t.faulty.decode([item("ok")], 3)).resolves.toEqual([0]);
    const c = wrap({ crashOnPrompt: "POISON" }, false);
    c.faulty.noteAdd(add("bad", { tokens: [...Buffer.from("xPOISONx")] })); // a token prompt: its bytes' text
    await expect(c.faulty.decode([item("bad")], 1)).rejects.toThrow("aborted");
    expect(c.fired).toEqual(["crash@1"]);
  });

  it("forwards the port: optional parts exist exactly when the wrapped backend has them", () => {
    const t = wrap({});
    expect(t.faulty.vocabSize).toBe(256);
    expect(t.faulty.tokenize("hi")).toEqual([104, 105]);
    expect(t.faulty.sampleMany).toBeUndefined();
    expect(t.faulty.logprobs).toBeUndefined();
    expect(grammarSupport(t.faulty)).toBeNull();
  });

  it("reads KEEL_FAULT_INJECTION", () => {
    expect(faultSwitchesFrom({})).toBeNull();
    expect(faultSwitchesFrom({ KEEL_FAULT_INJECTION: '{"crashOnPrompt":"POISON"}' })).toEqual({ crashOnPrompt: "POISON" });
  });
});
