/**
 * The generation session driven with plain inputs (what the registry's sinks deliver): stop strings (the engine
 * abort decision, splits across deltas, include_stop_str_in_output), UTF-8 in logprob tokens, n children finishing
 * in any order, a child failing, the client leaving, late events.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { engineFault } from "../errors.js";
import { sanitizeForJson } from "../utf8-stream.js";
import { GenerationSession, tokenView } from "./session.js";
import type { SessionEvent } from "./events.js";

const open = (over: Partial<ConstructorParameters<typeof GenerationSession>[0]> = {}) =>
  new GenerationSession({ childIds: ["r"], stop: [], includeStopStr: false, logprobs: false, ...over });

const text = (events: SessionEvent[], index = 0): string =>
  events.map((e) => (e.type === "delta" && e.index === index ? e.content : "")).join("");

describe("GenerationSession: stop strings", () => {
  it("a matched stop string ends the choice with 'stop' and returns the engine abort of that child", () => {
    const s = open({ stop: ["END"] });
    expect(s.admitted("r", 5)).toEqual({ events: [{ type: "started" }], abort: [] });
    const a = s.output("r", [1], "hello E");
    expect(a.abort).toEqual([]);
    const b = s.output("r", [2], "ND and more");
    expect(b.abort).toEqual(["r"]);
    const all = [...a.events, ...b.events];
    expect(text(all)).toBe("hello ");
    expect(b.events.at(-2)).toEqual({ type: "choice_finished", index: 0, reason: "stop" });
    expect(b.events.at(-1)).toMatchObject({ type: "finished", usage: { promptTokens: 5, completionTokens: 2 }, choices: [{ index: 0, text: "hello ", reason: "stop" }] });
    // The engine's late output for the aborted child is ignored.
    expect(s.output("r", [3], "zzz")).toEqual({ events: [], abort: [] });
    expect(s.finish("r", "abort", { promptTokens: 5, completionTokens: 3 })).toEqual({ events: [], abort: [] });
  });

  it("include_stop_str_in_output keeps the matched stop string", () => {
    const s = open({ stop: ["xy", "END"], includeStopStr: true });
    s.admitted("r", 1);
    const events = [...s.output("r", [1], "abE").events, ...s.output("r", [2], "NDtail").events];
    expect(text(events)).toBe("abEND");
  });

  it("for any split of the text into deltas the output is the text cut before the first stop string", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 40 }), fc.array(fc.nat(40), { maxLength: 6 }), fc.constantFrom("ab", "b", "abc", "ca"), (t, cuts, stop) => {
        const s = open({ stop: [stop] });
        s.admitted("r", 1);
        const points = [...new Set(cuts.map((c) => Math.min(c, t.length)))].sort((x, y) => x - y);
        const pieces: string[] = [];
        let prev = 0;
        for (const p of [...points, t.length]) {
          pieces.push(t.slice(prev, p));
          prev = p;
        }
        const events: SessionEvent[] = [];
        let aborted = false;
        for (const piece of pieces) {
          const step = s.output("r", [0], piece);
          events.push(...step.events);
          if (step.abort.length > 0) aborted = true;
        }
        events.push(...s.finish("r", "stop", { promptTokens: 1, completionTokens: pieces.length }).events);
        const at = t.indexOf(stop);
        expect(text(events)).toBe(at >= 0 ? t.slice(0, at) : t);
        expect(aborted).toBe(at >= 0);
        expect(events.filter((e) => e.type === "finished")).toHaveLength(1);
      }),
    );
  });
});

describe("GenerationSession: UTF-8 text", () => {
  it("a stop string made of multibyte characters is matched across deltas, never splitting a character", () => {
    const s = open({ stop: ["🦊é"] });
    s.admitted("r", 1);
    const a = s.output("r", [1], "日本🦊");
    // "🦊" could begin the stop string: held back whole (both UTF-16 units), not half of it.
    expect(text(a.events)).toBe("日本");
    const b = s.output("r", [2], "x🦊");
    expect(text(b.events)).toBe("🦊x");
    const c = s.output("r", [3], "é tail");
    expect(c.abort).toEqual(["r"]);
    expect(text([...a.events, ...b.events, ...c.events])).toBe("日本🦊x");
    for (const e of [...a.events, ...b.events, ...c.events]) {
      if (e.type === "delta") expect(e.content).toBe(sanitizeForJson(e.content)); // no lone surrogate
    }
  });
});

describe("GenerationSession: n children", () => {
  it("children finish in any order; usage counts the prompt once and sums completions; the result is in index order", () => {
    for (const order of [
      [0, 1, 2],
      [2, 0, 1],
      [1, 2, 0],
    ]) {
      const s = open({ childIds: ["r-0", "r-1", "r-2"] });
      const events: SessionEvent[] = [];
      for (const i of [2, 0, 1]) events.push(...s.admitted(`r-${i}`, 7).events);
      for (const i of [0, 1, 2]) events.push(...s.output(`r-${i}`, Array(i + 1).fill(1), `c${i}`).events);
      for (const i of order) {
        expect(s.ended).toBe(false);
        events.push(...s.finish(`r-${i}`, i === 1 ? "length" : "stop", { promptTokens: 7, completionTokens: i + 1 }).events);
      }
      expect(events.filter((e) => e.type === "started")).toHaveLength(1);
      expect(events.filter((e) => e.type === "choice_finished").map((e) => (e as { index: number }).index)).toEqual(order);
      const fin = events.at(-1)!;
      expect(fin).toMatchObject({ type: "finished", usage: { promptTokens: 7, completionTokens: 6 } });
      expect((fin as Extract<SessionEvent, { type: "finished" }>).choices.map((c) => [c.index, c.text, c.reason])).toEqual([
        [0, "c0", "stop"],
        [1, "c1", "length"],
        [2, "c2", "stop"],
      ]);
    }
  });

  it("prompts of a prompt list are each counted once", () => {
    const s = open({ childIds: ["a", "b", "c", "d"], promptOf: [0, 0, 1, 1] });
    const events: SessionEvent[] = [];
    for (const [id, p] of [["a", 3], ["b", 3], ["c", 10], ["d", 10]] as const) {
      s.admitted(id, p);
      events.push(...s.finish(id, "stop", { promptTokens: p, completionTokens: 1 }).events);
    }
    expect(events.at(-1)).toMatchObject({ type: "finished", usage: { promptTokens: 13, completionTokens: 4 } });
  });

  it("a stop string in one child aborts only that child; the others go on", () => {
    const s = open({ childIds: ["r-0", "r-1"], stop: ["!"] });
    s.admitted("r-0", 2);
    s.admitted("r-1", 2);
    expect(s.output("r-0", [1], "hi!").abort).toEqual(["r-0"]);
    const other = s.output("r-1", [1], "yo");
    expect(other.abort).toEqual([]);
    expect(text(other.events, 1)).toBe("yo");
    const end = s.finish("r-1", "length", { promptTokens: 2, completionTokens: 1 });
    expect(end.events.at(-1)).toMatchObject({ type: "finished", choices: [{ text: "hi", reason: "stop" }, { text: "yo", reason: "length" }] });
  });

  it("a child failing fails the request and aborts every sibling still running", () => {
    const s = open({ childIds: ["r-0", "r-1", "r-2"] });
    for (const id of ["r-0", "r-1", "r-2"]) s.admitted(id, 2);
    s.finish("r-0", "stop", { promptTokens: 2, completionTokens: 1 });
    const err = engineFault("boom");
    const step = s.finish("r-1", "error", { promptTokens: 2, completionTokens: 0 }, { message: "boom", httpError: err });
    expect(step).toEqual({ events: [{ type: "failed", error: err }], abort: ["r-2"] });
    expect(s.ended).toBe(true);
    expect(s.finish("r-2", "stop", { promptTokens: 2, completionTokens: 1 })).toEqual({ events: [], abort: [] });
  });

  it("the client leaving releases every child that has not ended", () => {
    const s = open({ childIds: ["r-0", "r-1", "r-2"], stop: ["x"] });
    s.admitted("r-0", 2);
    s.output("r-0", [1], "x");
    expect(s.clientGone()).toEqual({ events: [], abort: ["r-1", "r-2"] });
    expect(s.clientGone()).toEqual({ events: [], abort: [] });
  });
});

describe("GenerationSession: logprobs and UTF-8", () => {
  it("a token that is part of a multibyte character keeps its exact bytes and shows U+FFFD as text", () => {
    const fox = [...Buffer.from("🦊")];
    expect(tokenView({ token: 9, logprob: -0.5, bytes: fox.slice(0, 2) })).toEqual({ token: "\uFFFD", logprob: -0.5, bytes: fox.slice(0, 2) });
    expect(tokenView({ token: 9, logprob: -0.5, bytes: fox })).toEqual({ token: "🦊", logprob: -0.5, bytes: fox });
    expect(tokenView({ token: 42, logprob: -1 })).toEqual({ token: "token_id:42", logprob: -1, bytes: null });
  });

  it("logprobs travel with the delta of their step, also when the text is held back, and are kept for unary", () => {
    const s = open({ logprobs: true, stop: ["zz"] });
    s.admitted("r", 1);
    const lp = (t: number, b: string) => ({ token: t, logprob: -t, bytes: [...Buffer.from(b)], top: [{ token: t, logprob: -t, bytes: [...Buffer.from(b)] }] });
    const a = s.output("r", [1], "z", [lp(1, "z")]);
    expect(a.events).toEqual([{ type: "delta", index: 0, content: "", logprobs: [{ token: "z", logprob: -1, bytes: [122], top: [{ token: "z", logprob: -1, bytes: [122] }] }] }]);
    s.output("r", [2], "a", [lp(2, "a")]);
    const end = s.finish("r", "length", { promptTokens: 1, completionTokens: 2 });
    expect(end.events.at(-1)).toMatchObject({ type: "finished", choices: [{ text: "za", logprobs: [{ token: "z" }, { token: "a" }] }] });
  });

  it("ignores logprobs when they were not requested", () => {
    const s = open();
    s.admitted("r", 1);
    const step = s.output("r", [1], "a", [{ token: 1, logprob: -1, top: [] }]);
    expect(step.events).toEqual([{ type: "delta", index: 0, content: "a", logprobs: [] }]);
  });
});
