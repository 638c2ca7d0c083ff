/**
 * The generation session driven with plain inputs (what the registry's sinks deliver): stop strings (the engine
 * abort decision, splits across deltas, include_stop_str_in_output), UTF-8 in logprob tokens, n children finishing
 * in any order, a child failing (with or without an HTTP error, an abort not asked for), the client leaving, late
 * events for unknown or ended children and after the end, held-back text flushed at the finish, usage.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { engineFault } from "../../http/errors.js";
import { sanitizeForJson } from "../utf8-stream.js";
import { GenerationSession, tokenView } from "./session.js";
import type { SessionEvent } from "./events.js";

const open = (over: Partial<ConstructorParameters<typeof GenerationSession>[0]> = {}) =>
  new GenerationSession({ childIds: ["r"], stop: [], includeStopStr: false, logprobs: false, ...over });

const text = (events: SessionEvent[], index = 0): string =>
  events.map((e) => (e.type === "delta" && e.index === index ? e.content : "")).join("");

describe("GenerationSession: stop strings", () => {
  it("min_tokens: stop strings are not matched before the choice generated that many tokens (vLLM)", () => {
    const s = open({ stop: ["e"], minTokens: 3 });
    s.admitted("r", 5);
    // Tokens 1 and 2 contain the stop string: passed through as they are.
    const a = s.output("r", [1], "he");
    const b = s.output("r", [2], "re");
    expect([...a.abort, ...b.abort]).toEqual([]);
    expect(text([...a.events, ...b.events])).toBe("here");
    // From the third token on, the stop string ends the choice.
    const c = s.output("r", [3], "xe!");
    expect(c.abort).toEqual(["r"]);
    expect(text(c.events)).toBe("x");
  });


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

  it("a multi-token output with per-token text ends (a speculative step) counts the tokens up to the one that completed the stop string", () => {
    const run = (textEnds?: number[]) => {
      const s = open({ stop: ["de"] });
      s.admitted("r", 5);
      // Four tokens "ab" "cd" "ef" "gh": "de" completes in the third.
      const step = s.output("r", [1, 2, 3, 4], "abcdefgh", undefined, textEnds);
      return { abort: step.abort, text: text(step.events), finished: step.events.at(-1) };
    };
    const split = run([2, 4, 6, 8]);
    expect(split.abort).toEqual(["r"]);
    expect(split.text).toBe("abc");
    expect(split.finished).toMatchObject({ type: "finished", usage: { promptTokens: 5, completionTokens: 3 } });
    // Without the ends the tokens are counted all at once (what a one-token step gives anyway).
    expect(run().finished).toMatchObject({ type: "finished", usage: { completionTokens: 4 } });
    expect(run().text).toBe("abc");
    // With min_tokens too, one multi-token step gives what four one-token steps give (text, end, usage).
    for (const [stop, minTokens] of [["de", 3], ["fg", 3], ["cd", 1], ["zz", 2]] as const) {
      const multi = open({ stop: [stop], minTokens });
      multi.admitted("r", 5);
      const m = multi.output("r", [1, 2, 3, 4], "abcdefgh", undefined, [2, 4, 6, 8]);
      const single = open({ stop: [stop], minTokens });
      single.admitted("r", 5);
      const steps = ["ab", "cd", "ef", "gh"].map((piece, k) => single.output("r", [k + 1], piece));
      const singleEvents = steps.flatMap((x) => x.events);
      expect(text(m.events), `${stop} ${minTokens}`).toBe(text(singleEvents));
      expect(m.abort).toEqual(steps.flatMap((x) => x.abort));
      expect(m.events.find((e) => e.type === "finished")).toEqual(singleEvents.find((e) => e.type === "finished"));
    }
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

describe("GenerationSession: inputs it must ignore", () => {
  it("a session needs at least one child", () => {
    expect(() => open({ childIds: [] })).toThrow(/at least one child/);
  });

  it("events for an unknown child id change nothing", () => {
    const s = open();
    expect(s.admitted("other", 3)).toEqual({ events: [], abort: [] });
    expect(s.output("other", [1], "x")).toEqual({ events: [], abort: [] });
    expect(s.finish("other", "error", { promptTokens: 1, completionTokens: 1 })).toEqual({ events: [], abort: [] });
    expect(s.ended).toBe(false);
    // The real child still starts the request.
    expect(s.admitted("r", 3).events).toEqual([{ type: "started" }]);
  });

  it("after the client left, late admissions, output and finishes produce nothing", () => {
    const s = open({ childIds: ["r-0", "r-1"] });
    s.clientGone();
    expect(s.ended).toBe(true);
    expect(s.admitted("r-0", 3)).toEqual({ events: [], abort: [] });
    expect(s.output("r-1", [1], "x")).toEqual({ events: [], abort: [] });
    expect(s.finish("r-1", "error", { promptTokens: 1, completionTokens: 1 })).toEqual({ events: [], abort: [] });
    expect(s.fail(engineFault("late"))).toEqual({ events: [], abort: [] });
  });

  it("after the request finished, a late admission and a failure produce nothing", () => {
    const s = open();
    s.admitted("r", 1);
    expect(s.finish("r", "stop", { promptTokens: 1, completionTokens: 1 }).events.at(-1)).toMatchObject({ type: "finished" });
    expect(s.ended).toBe(true);
    expect(s.admitted("r", 1)).toEqual({ events: [], abort: [] });
    expect(s.fail(engineFault("late"))).toEqual({ events: [], abort: [] });
  });

  it("a child ended by a stop string ignores its late admission, output and the engine's abort confirmation; the siblings go on", () => {
    const s = open({ childIds: ["r-0", "r-1"], stop: ["!"] });
    s.admitted("r-1", 2);
    expect(s.output("r-0", [1], "a!").abort).toEqual(["r-0"]);
    // The engine reports the admission of the aborted child late: it stays ended.
    expect(s.admitted("r-0", 2)).toEqual({ events: [], abort: [] });
    expect(s.output("r-0", [2], "more")).toEqual({ events: [], abort: [] });
    expect(s.finish("r-0", "abort", { promptTokens: 2, completionTokens: 2 })).toEqual({ events: [], abort: [] });
    expect(s.ended).toBe(false);
    const end = s.finish("r-1", "stop", { promptTokens: 2, completionTokens: 1 });
    expect(end.events.at(-1)).toMatchObject({ type: "finished", choices: [{ text: "a", reason: "stop" }, { text: "", reason: "stop" }] });
  });
});

describe("GenerationSession: output and finish", () => {
  it("output before any admission starts the request first; a choice still waiting can produce output", () => {
    const s = open({ childIds: ["r-0", "r-1"] });
    expect(s.output("r-1", [1], "x").events).toEqual([{ type: "started" }, { type: "delta", index: 1, content: "x", logprobs: [] }]);
    expect(s.output("r-0", [1], "y").events).toEqual([{ type: "delta", index: 0, content: "y", logprobs: [] }]);
  });

  it("a finish before any admission starts the request, and a finish of one of several children ends nothing else", () => {
    const s = open({ childIds: ["r-0", "r-1"] });
    expect(s.finish("r-0", "length", { promptTokens: 4, completionTokens: 2 })).toEqual({
      events: [{ type: "started" }, { type: "choice_finished", index: 0, reason: "length" }],
      abort: [],
    });
    expect(s.ended).toBe(false);
    expect(s.finish("r-1", "stop", { promptTokens: 4, completionTokens: 1 })).toEqual({
      events: [
        { type: "choice_finished", index: 1, reason: "stop" },
        { type: "finished", usage: { promptTokens: 4, completionTokens: 3 }, choices: expect.any(Array) },
      ],
      abort: [],
    });
    expect(s.ended).toBe(true);
  });

  it("text held back as a possible stop-string prefix emits no empty delta, and is flushed when the choice finishes", () => {
    const s = open({ stop: ["END"] });
    s.admitted("r", 1);
    expect(s.output("r", [1], "ab").events).toEqual([{ type: "delta", index: 0, content: "ab", logprobs: [] }]);
    expect(s.output("r", [2], "EN")).toEqual({ events: [], abort: [] });
    const end = s.finish("r", "length", { promptTokens: 1, completionTokens: 2 });
    expect(end.events.slice(0, 2)).toEqual([
      { type: "delta", index: 0, content: "EN", logprobs: [] },
      { type: "choice_finished", index: 0, reason: "length" },
    ]);
    expect(end.events.at(-1)).toMatchObject({ type: "finished", choices: [{ text: "abEN", reason: "length" }] });
  });

  it("a finish with nothing held back emits no delta", () => {
    const s = open({ stop: ["END"] });
    s.admitted("r", 1);
    s.output("r", [1], "ab");
    expect(s.finish("r", "stop", { promptTokens: 1, completionTokens: 1 }).events.map((e) => e.type)).toEqual(["choice_finished", "finished"]);
  });

  it("usage: the admission's prompt length stands when the finish reports none; the finish's count wins when it reports one", () => {
    const a = open();
    a.admitted("r", 6);
    expect(a.finish("r", "stop", { promptTokens: 0, completionTokens: 1 }).events.at(-1)).toMatchObject({ usage: { promptTokens: 6, completionTokens: 1 } });
    const b = open();
    b.admitted("r", 6);
    expect(b.finish("r", "stop", { promptTokens: 9, completionTokens: 1 }).events.at(-1)).toMatchObject({ usage: { promptTokens: 9, completionTokens: 1 } });
  });

  it("usage: completion tokens are the larger of the tokens seen and the registry's count", () => {
    const s = open({ childIds: ["r-0", "r-1"] });
    s.output("r-0", [1, 2, 3], "abc");
    s.finish("r-0", "stop", { promptTokens: 1, completionTokens: 1 });
    s.output("r-1", [1], "a");
    const fin = s.finish("r-1", "stop", { promptTokens: 1, completionTokens: 4 }).events.at(-1) as Extract<SessionEvent, { type: "finished" }>;
    expect(fin.usage).toEqual({ promptTokens: 1, completionTokens: 7 });
    expect(fin.choices.map((c) => c.completionTokens)).toEqual([3, 4]);
  });
});

describe("GenerationSession: failures", () => {
  it("an engine error without an HTTP error is a 500 engine_error carrying the engine's message", () => {
    const s = open({ childIds: ["r-0", "r-1"] });
    s.admitted("r-0", 1);
    const step = s.finish("r-0", "error", { promptTokens: 1, completionTokens: 0 }, { message: "kv cache exploded" });
    expect(step.abort).toEqual(["r-1"]);
    expect(step.events).toHaveLength(1);
    const ev = step.events[0] as Extract<SessionEvent, { type: "failed" }>;
    expect(ev.type).toBe("failed");
    expect([ev.error.status, ev.error.code]).toEqual([500, "engine_error"]);
    expect(ev.error.message).toContain("kv cache exploded");
    expect(s.ended).toBe(true);
  });

  it("an abort the session did not ask for fails the request, with a message saying so", () => {
    const s = open();
    s.admitted("r", 1);
    const step = s.finish("r", "abort", { promptTokens: 1, completionTokens: 0 });
    expect(step.abort).toEqual([]);
    const ev = step.events[0] as Extract<SessionEvent, { type: "failed" }>;
    expect(ev.type).toBe("failed");
    expect(ev.error.message).toContain("the request was aborted by the engine");
  });

  it("fail() from outside aborts every child that has not ended and ends the session", () => {
    const s = open({ childIds: ["r-0", "r-1", "r-2"] });
    s.finish("r-1", "stop", { promptTokens: 1, completionTokens: 1 });
    const err = engineFault("shutdown");
    expect(s.fail(err)).toEqual({ events: [{ type: "failed", error: err }], abort: ["r-0", "r-2"] });
    expect(s.ended).toBe(true);
    expect(s.clientGone()).toEqual({ events: [], abort: [] });
  });
});
