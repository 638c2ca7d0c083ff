/** Emitted rule bodies never nest groups deeply (llama.cpp's recursive parser crashed on 20000 nested groups). */
import { describe, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import { bodyProblem, groupDepth, loneSurrogate, MAX_GROUP_DEPTH } from "./gbnf-limits.js";
import { schemaToGbnf } from "./json-schema-gbnf.js";
import { MAX_PREFIX_ITEMS } from "./schema-limits.js";

/** The deepest group nesting over all rules of a grammar text. */
function deepest(grammar: string): number {
  return Math.max(...grammar.trim().split("\n").map((line) => groupDepth(line.slice(line.indexOf("::=") + 3))));
}

describe("group nesting of emitted grammars", () => {
  it("groupDepth skips literals and classes", () => {
    expect(groupDepth('("(" [()] (a)?)*')).toBe(2);
    expect(groupDepth('"\\"(" x')).toBe(0);
  });

  it("a long tuple is a chain of rules, not nested groups", () => {
    const tuple = { type: "array", prefixItems: Array.from({ length: MAX_PREFIX_ITEMS }, () => ({ type: "integer" })), items: false };
    const { grammar } = schemaToGbnf(tuple, { param: "p" });
    expect(deepest(grammar)).toBeLessThanOrEqual(4);
  });

  it("a pattern nesting groups beyond the cap is a 400 naming the limit", () => {
    const pattern = `^${"(a".repeat(MAX_GROUP_DEPTH + 5)}${")?".repeat(MAX_GROUP_DEPTH + 5)}$`;
    let err: unknown;
    try {
      schemaToGbnf({ type: "string", pattern }, { param: "p" });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(KeelHttpError);
    expect((err as KeelHttpError).message).toMatch(new RegExp(`limit ${MAX_GROUP_DEPTH}`));
  });
});

describe("loneSurrogate: a code point no UTF-8 text holds", () => {
  it("finds escaped and raw lone surrogates; a well-formed pair, other escapes and escaped backslashes are fine", () => {
    expect(loneSurrogate('"\\uD83D"')).toBe(0xd83d);
    expect(loneSurrogate("[\\U0000DC00-\\U0000DFFF]")).toBe(0xdc00);
    expect(loneSurrogate('"a\ud800b"')).toBe(0xd800);
    expect(loneSurrogate('"\ude00"')).toBe(0xde00);
    expect(loneSurrogate('"😀" [\\u00e0-\\uFFFF] "\\U0001F600" "\\\\uD83D" "\\x41"')).toBeNull();
    expect(bodyProblem('"\\uD83D\\uDE00"')).toMatch(/lone surrogate U\+D83D/);
  });
});
