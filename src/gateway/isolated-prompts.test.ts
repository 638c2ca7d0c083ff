import { describe, expect, it } from "vitest";
import { IsolatedPrompts } from "./isolated-prompts.js";

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
});
