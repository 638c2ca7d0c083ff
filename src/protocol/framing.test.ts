import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { encodeFrame, FrameDecoder, MAX_FRAME_BYTES, type Frame } from "./framing.js";

const msgs = [
  { v: 1, type: "ping", nonce: 7 },
  { v: 1, type: "add", id: "r-1", prompt: { text: "héllo 😀 \u0000 \"quoted\"" }, params: { maxTokens: null, temperature: 0.5 } },
  { v: 1, type: "abort", ids: [] },
];

/** A raw frame with an arbitrary payload. */
function rawFrame(payload: string | Buffer, declaredLength?: number): Buffer {
  const body = typeof payload === "string" ? Buffer.from(payload, "utf8") : payload;
  const head = Buffer.alloc(4);
  head.writeUInt32BE(declaredLength ?? body.length, 0);
  return Buffer.concat([head, body]);
}

const isError = (f: Frame): f is { error: string } => "error" in f;

describe("encodeFrame", () => {
  it("writes a 4-byte big-endian length then the UTF-8 JSON payload", () => {
    const frame = encodeFrame({ a: "é" });
    const json = '{"a":"é"}';
    expect(frame.readUInt32BE(0)).toBe(Buffer.byteLength(json));
    expect(frame.subarray(0, 4)).toEqual(Buffer.from([0, 0, 0, 10]));
    expect(frame.subarray(4).toString("utf8")).toBe(json);
  });

  it("throws TypeError for a value JSON cannot serialise", () => {
    expect(() => encodeFrame({ n: 1n })).toThrow(TypeError);
  });

  it("MAX_FRAME_BYTES is 64 MiB", () => {
    expect(MAX_FRAME_BYTES).toBe(64 * 1024 * 1024);
  });
});

describe("FrameDecoder", () => {
  it("round-trips messages", () => {
    const d = new FrameDecoder();
    for (const m of msgs) expect(d.push(encodeFrame(m))).toEqual([{ message: m }]);
    expect(d.bufferedBytes).toBe(0);
  });

  it("decodes a frame split at every byte boundary", () => {
    const frame = encodeFrame(msgs[1]);
    for (let cut = 0; cut <= frame.length; cut++) {
      const d = new FrameDecoder();
      const a = d.push(frame.subarray(0, cut));
      const b = d.push(frame.subarray(cut));
      expect([...a, ...b], `cut at ${cut}`).toEqual([{ message: msgs[1] }]);
      expect(d.bufferedBytes).toBe(0);
    }
  });

  it("decodes a frame fed one byte at a time", () => {
    const d = new FrameDecoder();
    const frame = encodeFrame(msgs[1]);
    const out: Frame[] = [];
    for (let i = 0; i < frame.length; i++) {
      out.push(...d.push(frame.subarray(i, i + 1)));
      if (i < frame.length - 1) expect(out).toEqual([]);
    }
    expect(out).toEqual([{ message: msgs[1] }]);
  });

  it("decodes several frames in one chunk, and a trailing partial frame later", () => {
    const d = new FrameDecoder();
    const all = Buffer.concat(msgs.map((m) => encodeFrame(m)));
    const extra = encodeFrame({ v: 1, type: "shutdown" });
    const out = d.push(Buffer.concat([all, extra.subarray(0, 5)]));
    expect(out).toEqual(msgs.map((m) => ({ message: m })));
    expect(d.bufferedBytes).toBe(5);
    expect(d.push(extra.subarray(5))).toEqual([{ message: { v: 1, type: "shutdown" } }]);
  });

  it("round-trips any sequence of objects under any chunking (property)", () => {
    fc.assert(
      fc.property(
        fc.array(fc.dictionary(fc.string(), fc.jsonValue()), { minLength: 1, maxLength: 5 }),
        fc.array(fc.nat(), { maxLength: 8 }),
        (objects, cuts) => {
          const stream = Buffer.concat(objects.map((o) => encodeFrame(o)));
          const points = [...new Set(cuts.map((c) => c % (stream.length + 1)))].sort((a, b) => a - b);
          const d = new FrameDecoder();
          const out: Frame[] = [];
          let start = 0;
          for (const p of [...points, stream.length]) {
            out.push(...d.push(stream.subarray(start, p)));
            start = p;
          }
          expect(out).toEqual(objects.map((o) => ({ message: JSON.parse(JSON.stringify(o)) })));
        },
      ),
      { numRuns: 200 },
    );
  });

  it.each([
    ["malformed JSON", "{not json", /not valid JSON/],
    ["an empty payload", "", /not valid JSON/],
    ["a JSON array", "[1,2]", /not a JSON object/],
    ["JSON null", "null", /not a JSON object/],
    ["a JSON string", '"hi"', /not a JSON object/],
    ["a JSON number", "42", /not a JSON object/],
    ["invalid UTF-8 that is not JSON", Buffer.from([0xff, 0xfe, 0x7b]), /not valid JSON/],
  ])("reports %s as a FrameError and still decodes the next frame", (_name, payload, re) => {
    const d = new FrameDecoder();
    const out = d.push(Buffer.concat([rawFrame(payload), encodeFrame(msgs[0])]));
    expect(out).toHaveLength(2);
    expect(isError(out[0]!)).toBe(true);
    expect((out[0] as { error: string }).error).toMatch(re);
    expect(out[1]).toEqual({ message: msgs[0] });
  });

  it("accepts a frame of exactly the limit", () => {
    const payload = JSON.stringify({ s: "x".repeat(10) });
    const d = new FrameDecoder(payload.length);
    expect(d.push(rawFrame(payload))).toEqual([{ message: { s: "xxxxxxxxxx" } }]);
  });

  it("reports an oversized frame once, skips it and decodes the next frame", () => {
    const d = new FrameDecoder(32);
    const big = rawFrame(JSON.stringify({ s: "y".repeat(100) }));
    const out = d.push(Buffer.concat([big, encodeFrame(msgs[0])]));
    expect(out).toHaveLength(2);
    expect((out[0] as { error: string }).error).toMatch(/exceeds the limit of 32 bytes/);
    expect(out[1]).toEqual({ message: msgs[0] });
  });

  it("skips an oversized frame arriving in many chunks without buffering it", () => {
    const limit = 64;
    const d = new FrameDecoder(limit);
    // The payload is not even JSON: it must never be parsed.
    const big = rawFrame(Buffer.alloc(10_000, 0x7b));
    const stream = Buffer.concat([big, encodeFrame(msgs[2]), encodeFrame(msgs[0])]);
    const out: Frame[] = [];
    for (let i = 0; i < stream.length; i += 37) {
      out.push(...d.push(stream.subarray(i, i + 37)));
      expect(d.bufferedBytes).toBeLessThanOrEqual(limit + 4 + 37);
    }
    expect(out).toHaveLength(3);
    expect((out[0] as { error: string }).error).toMatch(/frame of 10000 bytes exceeds the limit of 64 bytes/);
    expect(out.slice(1)).toEqual([{ message: msgs[2] }, { message: msgs[0] }]);
    expect(d.bufferedBytes).toBe(0);
  });

  it("reports an oversized frame as soon as its length prefix arrives", () => {
    const d = new FrameDecoder(8);
    const head = rawFrame("", 1_000_000);
    expect(d.push(head.subarray(0, 3))).toEqual([]);
    const out = d.push(head.subarray(3, 4));
    expect(out).toHaveLength(1);
    expect(isError(out[0]!)).toBe(true);
  });
});
