import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { JsonScanner } from "./json-scanner.js";

/** Feeds `text`; the position where the scanner said "done" or "error", and which. */
function scan(text: string): { at: number; step: "more" | "done" | "error" } {
  const s = new JsonScanner();
  for (let i = 0; i < text.length; i++) {
    const step = s.push(text[i]!);
    if (step !== "more") return { at: i, step };
  }
  return { at: text.length, step: "more" };
}

describe("JsonScanner", () => {
  it("any JSON object or array (any spacing) is a valid prefix until its last character, where it is done", () => {
    const container = fc.oneof(fc.dictionary(fc.string(), fc.jsonValue()), fc.array(fc.jsonValue()));
    fc.assert(
      fc.property(container, fc.constantFrom(undefined, 1, 2, "\t"), (value, space) => {
        const text = JSON.stringify(value, null, space);
        expect(scan(text)).toEqual({ at: text.length - 1, step: "done" });
      }),
      { numRuns: 2000 },
    );
  });

  it.each([
    ['{"a" 1}', 5, "error"],
    ["{a: 1}", 1, "error"],
    ['{"a": tru}', 9, "error"],
    ['{"a": 1,]', 8, "error"],
    ["[1, 2}", 5, "error"],
    ["Hello", 0, "error"],
    ['{"a": [1, {"b": null}]}', 22, "done"],
    ['{"a": "}\\"]"', 12, "more"],
  ] as const)("%j → %s at %i", (text, at, step) => {
    expect(scan(text)).toEqual({ at, step });
  });

  it("refuses input after the value ended", () => {
    const s = new JsonScanner();
    for (const ch of "{}") s.push(ch);
    expect(s.push(" ")).toBe("error");
  });
});
