import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { StopMatcher } from "./stop-strings.js";

/**
 * Reference: cut `text` where the first stop string completes (longest wins
 * on ties), by brute force over every end position.
 */
function oneShot(text: string, stops: string[]): { text: string; stopped: boolean } {
  const byLength = stops.filter((s) => s.length > 0).sort((a, b) => b.length - a.length);
  for (let end = 1; end <= text.length; end++) {
    const prefix = text.slice(0, end);
    const hit = byLength.find((s) => prefix.endsWith(s));
    if (hit !== undefined) return { text: text.slice(0, end - hit.length), stopped: true };
  }
  return { text, stopped: false };
}

function streamed(pieces: string[], stops: string[]) {
  const m = new StopMatcher(stops);
  const emits: string[] = [];
  let stopped = false;
  for (const p of pieces) {
    const r = m.push(p);
    emits.push(r.emit);
    if (r.stopped) {
      stopped = true;
      break;
    }
  }
  const tail = m.flush();
  return { text: emits.join("") + tail, stopped, emits, tail };
}

function splitAt(text: string, cuts: number[]): string[] {
  const points = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
  const out: string[] = [];
  let start = 0;
  for (const p of points) {
    out.push(text.slice(start, p));
    start = p;
  }
  out.push(text.slice(start));
  return out;
}

describe("StopMatcher", () => {
  it("passes text through unchanged when there are no stop strings", () => {
    const m = new StopMatcher([]);
    expect(m.push("Hello, ")).toEqual({ emit: "Hello, ", stopped: false });
    expect(m.push("world")).toEqual({ emit: "world", stopped: false });
    expect(m.flush()).toBe("");
  });

  it("ignores empty stop strings instead of stopping immediately", () => {
    const m = new StopMatcher([""]);
    expect(m.push("abc")).toEqual({ emit: "abc", stopped: false });
  });

  it("excludes the stop string and everything after it", () => {
    const m = new StopMatcher(["\n\n"]);
    expect(m.push("one\n\ntwo")).toEqual({ emit: "one", stopped: true });
  });

  it("holds back a possible stop-string prefix across pieces", () => {
    const m = new StopMatcher(["</end>"]);
    expect(m.push("answer </e")).toEqual({ emit: "answer ", stopped: false });
    expect(m.push("nd> trailing")).toEqual({ emit: "", stopped: true });
  });

  it("releases held-back text once it can no longer match", () => {
    const m = new StopMatcher(["STOP"]);
    expect(m.push("ST")).toEqual({ emit: "", stopped: false });
    expect(m.push("AR")).toEqual({ emit: "STAR", stopped: false });
  });

  it("returns the held-back text from flush() when generation ends otherwise", () => {
    const m = new StopMatcher(["STOP"]);
    expect(m.push("the end ST").emit).toBe("the end ");
    expect(m.flush()).toBe("ST");
    expect(m.stopped).toBe(false);
  });

  it("emits nothing more after a match", () => {
    const m = new StopMatcher(["x"]);
    expect(m.push("ax")).toEqual({ emit: "a", stopped: true });
    expect(m.push("more")).toEqual({ emit: "", stopped: true });
    expect(m.flush()).toBe("");
    expect(m.stopped).toBe(true);
  });

  it("stops at the first stop string to complete, not the first to start", () => {
    expect(streamed(["abcd"], ["abcd", "bc"]).text).toBe("a");
    expect(streamed(["a", "b", "c", "d"], ["abcd", "bc"]).text).toBe("a");
  });

  it("prefers the longest stop string when two complete at the same character", () => {
    expect(streamed(["xabc"], ["bc", "abc"]).text).toBe("x");
  });

  it("finds a match whose prefix overlaps a failed partial match (KMP fallback)", () => {
    // "aab" after "aa" partial of "aaab": the automaton must fall back, not reset
    expect(streamed(["a", "a", "a", "a", "b", "z"], ["aaab"]).text).toBe("a");
  });

  it("never ends an emitted piece with half a surrogate pair", () => {
    const m = new StopMatcher(["😀!"]);
    const r = m.push("hi😀");
    expect(r.emit).toBe("hi");
    expect(m.push("?").emit).toBe("😀?");
  });

  const alphabet = fc.constantFrom("a", "b", "c", "😀", "\n");
  const textArb = fc.array(alphabet, { maxLength: 40 }).map((a) => a.join(""));
  const stopArb = fc.array(alphabet, { minLength: 1, maxLength: 5 }).map((a) => a.join(""));

  it("property: streaming with random split points equals the one-shot result", () => {
    fc.assert(
      fc.property(textArb, fc.array(stopArb, { maxLength: 4 }), fc.array(fc.nat(), { maxLength: 15 }), (text, stops, cuts) => {
        // arbitrary UTF-16 split points, even inside surrogate pairs
        const s = streamed(splitAt(text, cuts), stops);
        const ref = oneShot(text, stops);
        expect(s.text).toBe(ref.text);
        expect(s.stopped).toBe(ref.stopped);
      }),
      { numRuns: 5000 },
    );
  });

  it("property: well-formed pieces in, well-formed pieces out", () => {
    fc.assert(
      fc.property(fc.array(fc.array(alphabet, { maxLength: 4 }), { maxLength: 12 }), fc.array(stopArb, { maxLength: 3 }), (chunks, stops) => {
        const s = streamed(
          chunks.map((c) => c.join("")),
          stops,
        );
        for (const e of [...s.emits, s.tail]) {
          expect(e).not.toMatch(/[\uD800-\uDBFF]$/);
          expect(e).not.toMatch(/^[\uDC00-\uDFFF]/);
        }
      }),
      { numRuns: 3000 },
    );
  });

  it("property: held-back text never exceeds the longest stop string", () => {
    fc.assert(
      fc.property(textArb, fc.array(stopArb, { minLength: 1, maxLength: 3 }), (text, stops) => {
        const m = new StopMatcher(stops);
        let emitted = 0;
        let seen = 0;
        for (const ch of text) {
          const r = m.push(ch);
          seen += ch.length;
          emitted += r.emit.length;
          if (r.stopped) return;
          const longest = Math.max(...stops.map((s) => s.length));
          expect(seen - emitted).toBeLessThanOrEqual(longest);
        }
      }),
      { numRuns: 2000 },
    );
  });
});
