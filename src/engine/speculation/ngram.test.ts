import { describe, expect, it } from "vitest";
import { proposeNgramDrafts } from "./ngram.js";

describe("proposeNgramDrafts", () => {
  it("proposes what followed the most recent earlier occurrence of the last n tokens", () => {
    // history ends with [7, 8]; [7, 8] occurred at 1 (followed by 9 10 11) and at 5 (followed by 12 13).
    const h = [1, 7, 8, 9, 10, 7, 8, 12, 13, 4, 7, 8];
    expect(proposeNgramDrafts(h, 2, 5)).toEqual([12, 13, 4, 7, 8]);
    expect(proposeNgramDrafts(h, 2, 2)).toEqual([12, 13]);
  });

  it("prefers the longest n-gram over a more recent shorter match", () => {
    // trigram [5, 6, 7] occurs at 0 (→ 100); the bigram [6, 7] also occurs later at 5 (→ 200).
    const h = [5, 6, 7, 100, 0, 6, 7, 200, 5, 6, 7];
    expect(proposeNgramDrafts(h, 3, 1)).toEqual([100]);
    expect(proposeNgramDrafts(h, 2, 1)).toEqual([200]);
  });

  it("falls back to shorter n-grams down to 1", () => {
    const h = [3, 42, 9, 1, 2, 42];
    expect(proposeNgramDrafts(h, 3, 3)).toEqual([9, 1, 2]);
  });

  it("proposes nothing without a match, with no room, or with too short a history", () => {
    expect(proposeNgramDrafts([1, 2, 3, 4], 3, 5)).toEqual([]);
    expect(proposeNgramDrafts([1, 2, 1, 2], 2, 0)).toEqual([]);
    expect(proposeNgramDrafts([1], 3, 5)).toEqual([]);
  });

  it("may propose tokens of the tail itself (a repeating pattern continues)", () => {
    expect(proposeNgramDrafts([4, 4, 4, 4], 2, 5)).toEqual([4]);
    expect(proposeNgramDrafts([1, 2, 1, 2, 1, 2], 2, 3)).toEqual([1, 2]);
  });
});
