import { describe, expect, it } from "vitest";
import { jsonNesting, MAX_JSON_NESTING, withinNesting } from "./json-depth.js";

describe("jsonNesting", () => {
  it("counts brackets outside strings, escapes included", () => {
    expect(jsonNesting('{"a": [1, {"b": "[[[{{{"}]}')).toBe(3);
    expect(jsonNesting('"\\"[[["')).toBe(0);
    expect(jsonNesting("[]")).toBe(1);
    expect(jsonNesting("42")).toBe(0);
  });

  it("the limit: as deep as allowed passes, one more does not", () => {
    const deep = (n: number) => "[".repeat(n) + "]".repeat(n);
    expect(withinNesting(deep(MAX_JSON_NESTING))).toBe(true);
    expect(withinNesting(deep(MAX_JSON_NESTING + 1))).toBe(false);
    expect(jsonNesting(deep(100_000))).toBe(MAX_JSON_NESTING + 1);
  });
});
