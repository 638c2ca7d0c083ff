import { describe, expect, it } from "vitest";
import type { GuideSpec } from "../../protocol/messages.js";
import { IsolatedPrompts, isolationKey } from "./isolated-prompts.js";

describe("IsolatedPrompts: a refusal is earned and does not last forever", () => {
  it("refuses an isolated prompt until its time is up, then forgets it", () => {
    const m = new IsolatedPrompts(1000);
    m.add("kill me", 5000);
    expect(m.has("kill me", 5000)).toBe(true);
    expect(m.has("kill me", 5999)).toBe(true);
    expect(m.has("other", 5500)).toBe(false);
    expect(m.has("kill me", 6000)).toBe(false);
    expect(m.size).toBe(0);
  });

  it("isolating a prompt again restarts its time", () => {
    const m = new IsolatedPrompts(1000);
    m.add("p", 0);
    m.add("p", 900);
    expect(m.has("p", 1500)).toBe(true);
    expect(m.has("p", 1900)).toBe(false);
  });

  it("is bounded: the oldest prompt goes first", () => {
    const m = new IsolatedPrompts(60_000, 2);
    m.add("a", 1);
    m.add("b", 2);
    m.add("c", 3);
    expect([m.has("a", 4), m.has("b", 4), m.has("c", 4)]).toEqual([false, true, true]);
  });

  it("a request isolated with a guide refuses only that prompt with that guide, not the same messages unguided", () => {
    const m = new IsolatedPrompts(60_000);
    const killer: GuideSpec = { grammar: 'root ::= "a"', start: { kind: "rule", rule: "root", then: "end" } };
    const other: GuideSpec = { ...killer, grammar: 'root ::= "b"' };
    m.add(isolationKey("What is 2+2?", killer), 0);
    expect(m.has(isolationKey("What is 2+2?", killer), 1)).toBe(true);
    expect(m.has(isolationKey("What is 2+2?"), 1)).toBe(false);
    expect(m.has(isolationKey("What is 2+2?", other), 1)).toBe(false);
    expect(m.has(isolationKey("What is 3+3?", killer), 1)).toBe(false);
    // Unguided keys stay the prompt itself (existing behaviour).
    expect(isolationKey("p")).toBe("p");
  });
});
