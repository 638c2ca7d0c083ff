import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { Utf8StreamDecoder, sanitizeForJson } from "./utf8-stream.js";

const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);
const oneShot = (bytes: Uint8Array): string =>
  new TextDecoder("utf-8", { ignoreBOM: true }).decode(bytes);

/** Splits `bytes` at the given (unsorted, possibly out-of-range) cut points. */
function splitAt(bytes: Uint8Array, cuts: number[]): Uint8Array[] {
  const points = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  const chunks: Uint8Array[] = [];
  let start = 0;
  for (const p of points) {
    chunks.push(bytes.subarray(start, p));
    start = p;
  }
  chunks.push(bytes.subarray(start));
  return chunks;
}

function decodeChunks(chunks: Uint8Array[]): { pieces: string[]; tail: string } {
  const d = new Utf8StreamDecoder();
  const pieces = chunks.map((c) => d.push(c));
  return { pieces, tail: d.flush() };
}

/** Bytes biased towards the interesting parts of the UTF-8 space. */
const byteArb = fc.oneof(
  fc.integer({ min: 0, max: 255 }),
  fc.constantFrom(0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xed, 0xef, 0xf0, 0xf4, 0xf5, 0xff),
);
const bytesArb = fc.oneof(
  fc.array(byteArb, { maxLength: 64 }).map((a) => Uint8Array.from(a)),
  fc.string({ unit: "grapheme", maxLength: 24 }).map(utf8),
  // valid text with random bytes spliced in
  fc
    .tuple(fc.string({ unit: "grapheme", maxLength: 12 }), fc.array(byteArb, { maxLength: 6 }), fc.string({ unit: "grapheme", maxLength: 12 }))
    .map(([a, mid, b]) => Uint8Array.from([...utf8(a), ...mid, ...utf8(b)])),
);

describe("Utf8StreamDecoder", () => {
  it("holds back a 4-byte character split over three tokens until it is complete", () => {
    const bytes = utf8("😀"); // F0 9F 98 80
    const d = new Utf8StreamDecoder();
    expect(d.push(bytes.subarray(0, 1))).toBe("");
    expect(d.push(bytes.subarray(1, 3))).toBe("");
    expect(d.push(bytes.subarray(3))).toBe("😀");
    expect(d.flush()).toBe("");
  });

  it("emits text before a split character immediately", () => {
    const d = new Utf8StreamDecoder();
    const bytes = utf8("ab€"); // 61 62 E2 82 AC
    expect(d.push(bytes.subarray(0, 3))).toBe("ab");
    expect(d.push(bytes.subarray(3))).toBe("€");
  });

  it("replaces bytes that can never start a character with U+FFFD at once", () => {
    const d = new Utf8StreamDecoder();
    expect(d.push(Uint8Array.of(0xff))).toBe("\uFFFD");
    expect(d.push(Uint8Array.of(0x80, 0x41))).toBe("\uFFFDA");
  });

  it("ends a sequence cut short by a non-continuation byte with one U+FFFD", () => {
    const d = new Utf8StreamDecoder();
    expect(d.push(Uint8Array.of(0xe2, 0x82))).toBe("");
    expect(d.push(Uint8Array.of(0x41))).toBe("\uFFFDA");
  });

  it("rejects overlong and surrogate encodings byte by byte (WHATWG)", () => {
    const d = new Utf8StreamDecoder();
    // E0 80 80 is an overlong NUL, ED A0 80 encodes U+D800: never valid.
    expect(d.push(Uint8Array.of(0xe0, 0x80, 0x80))).toBe("\uFFFD\uFFFD\uFFFD");
    expect(d.push(Uint8Array.of(0xed, 0xa0, 0x80))).toBe("\uFFFD\uFFFD\uFFFD");
  });

  it("flush() turns an incomplete tail into exactly one U+FFFD and resets", () => {
    const d = new Utf8StreamDecoder();
    expect(d.push(Uint8Array.of(0x68, 0xf0, 0x9f, 0x98))).toBe("h");
    expect(d.flush()).toBe("\uFFFD");
    expect(d.flush()).toBe("");
    // reusable after flush: the held-back bytes are gone
    expect(d.push(utf8("ok"))).toBe("ok");
  });

  it("keeps a leading byte-order mark (generated U+FEFF is content)", () => {
    const d = new Utf8StreamDecoder();
    expect(d.push(Uint8Array.of(0xef, 0xbb))).toBe("");
    expect(d.push(Uint8Array.of(0xbf, 0x61))).toBe("\uFEFFa");
  });

  it("accepts empty chunks", () => {
    const d = new Utf8StreamDecoder();
    expect(d.push(new Uint8Array(0))).toBe("");
    expect(d.flush()).toBe("");
  });

  it("property: any split of any bytes decodes exactly like one-shot TextDecoder", () => {
    fc.assert(
      fc.property(bytesArb, fc.array(fc.nat(), { maxLength: 12 }), (bytes, cuts) => {
        const { pieces, tail } = decodeChunks(splitAt(bytes, cuts));
        const streamed = pieces.join("") + tail;
        expect(streamed).toBe(oneShot(bytes));
        // every piece is well-formed on its own (never half a surrogate pair)
        for (const p of [...pieces, tail]) expect(sanitizeForJson(p)).toBe(p);
      }),
      { numRuns: 3000 },
    );
  });

  it("property: matches the default TextDecoder except for BOM stripping", () => {
    fc.assert(
      fc.property(bytesArb, fc.array(fc.nat(), { maxLength: 8 }), (bytes, cuts) => {
        const { pieces, tail } = decodeChunks(splitAt(bytes, cuts));
        const streamed = pieces.join("") + tail;
        const reference = new TextDecoder().decode(bytes);
        const bom = bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
        expect(streamed).toBe(bom ? "\uFEFF" + reference : reference);
      }),
      { numRuns: 1000 },
    );
  });
});

describe("sanitizeForJson", () => {
  it("replaces lone high and low surrogates, keeps valid pairs", () => {
    expect(sanitizeForJson("a\uD800b")).toBe("a\uFFFDb");
    expect(sanitizeForJson("\uDC00x")).toBe("\uFFFDx");
    expect(sanitizeForJson("end\uD83D")).toBe("end\uFFFD");
    expect(sanitizeForJson("\uDE00\uD83D")).toBe("\uFFFD\uFFFD"); // reversed pair
    expect(sanitizeForJson("😀")).toBe("😀");
    expect(sanitizeForJson("\uD83D\uD83D\uDE00")).toBe("\uFFFD😀");
  });

  it("produces strings that survive a UTF-8 round trip", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (s) => {
        const clean = sanitizeForJson(s);
        expect(clean.length).toBe(s.length);
        expect(new TextDecoder().decode(utf8(clean))).toBe(clean);
        expect(JSON.stringify(clean)).not.toMatch(/\\ud[89a-f]/i);
      }),
      { numRuns: 1000 },
    );
  });
});
