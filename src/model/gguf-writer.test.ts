import {existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, writeSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {afterAll, describe, expect, it} from "vitest";
import {alignUp, encodeTensorData, floatToHalfBits, GgmlTensorType, GgufValueType, GgufWriter, halfBitsToFloat, writeGgufFile} from "./gguf-writer.js";
import {readGgufHeader} from "./gguf-reader.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-gguf-writer-"));
afterAll(() => rmSync(tmp, {recursive: true, force: true}));

function sampleWriter(alignment?: number): GgufWriter {
    const w = new GgufWriter(alignment === undefined ? {} : {alignment});
    w.kv("a.u8", GgufValueType.UINT8, 255)
        .kv("a.i8", GgufValueType.INT8, -128)
        .kv("a.u16", GgufValueType.UINT16, 65535)
        .kv("a.i16", GgufValueType.INT16, -32768)
        .kv("a.u32", GgufValueType.UINT32, 4294967295)
        .kv("a.i32", GgufValueType.INT32, -2147483648)
        .kv("a.f32", GgufValueType.FLOAT32, 1.5)
        .kv("a.bool", GgufValueType.BOOL, true)
        .kv("a.str", GgufValueType.STRING, "héllo 🙂")
        .kv("a.u64", GgufValueType.UINT64, 2n ** 64n - 1n)
        .kv("a.i64", GgufValueType.INT64, -(2n ** 63n))
        .kv("a.f64", GgufValueType.FLOAT64, Math.PI)
        .kvArray("a.arr_str", GgufValueType.STRING, ["x", "", "yz"])
        .kvArray("a.arr_i32", GgufValueType.INT32, [1, -2, 3])
        .kvArray("a.arr_bool", GgufValueType.BOOL, [true, false])
        .kvArray("a.arr_empty", GgufValueType.FLOAT32, []);
    // odd sizes so that padding is needed between tensors
    w.tensor("t.a", [3], Float32Array.of(1, 2, 3))
        .tensor("t.b", [5, 3], Float32Array.from({length: 15}, (_, i) => i / 7), GgmlTensorType.F16)
        .tensor("t.c", [1], Float32Array.of(-0.25))
        .tensor("t.d", [16, 2], Float32Array.from({length: 32}, (_, i) => -i));
    return w;
}

describe("GgufWriter", () => {
    for (const alignment of [undefined, 64]) {
        it(`round-trips KVs and tensor layout (alignment ${alignment ?? "default"})`, () => {
            const w = sampleWriter(alignment);
            const buf = w.toBuffer();
            const h = readGgufHeader(buf);
            const align = alignment ?? 32;
            expect(buf.toString("ascii", 0, 4)).toBe("GGUF");
            expect(h.version).toBe(3);
            expect(h.alignment).toBe(align);
            expect(h.kv.get("a.u8")?.value).toBe(255);
            expect(h.kv.get("a.i8")?.value).toBe(-128);
            expect(h.kv.get("a.u16")?.value).toBe(65535);
            expect(h.kv.get("a.i16")?.value).toBe(-32768);
            expect(h.kv.get("a.u32")?.value).toBe(4294967295);
            expect(h.kv.get("a.i32")?.value).toBe(-2147483648);
            expect(h.kv.get("a.f32")?.value).toBe(1.5);
            expect(h.kv.get("a.bool")?.value).toBe(true);
            expect(h.kv.get("a.str")?.value).toBe("héllo 🙂");
            expect(h.kv.get("a.u64")?.value).toBe(2n ** 64n - 1n);
            expect(h.kv.get("a.i64")?.value).toBe(-(2n ** 63n));
            expect(h.kv.get("a.f64")?.value).toBe(Math.PI);
            expect(h.kv.get("a.arr_str")).toEqual({type: GgufValueType.ARRAY, elemType: GgufValueType.STRING, value: ["x", "", "yz"]});
            expect(h.kv.get("a.arr_i32")?.value).toEqual([1, -2, 3]);
            expect(h.kv.get("a.arr_bool")?.value).toEqual([true, false]);
            expect(h.kv.get("a.arr_empty")?.value).toEqual([]);
            if (alignment) expect(h.kv.get("general.alignment")?.value).toBe(alignment);
            else expect(h.kv.has("general.alignment")).toBe(false);

            // offsets are exactly the running sum of padded sizes
            const sizes = [3 * 4, 15 * 2, 4, 32 * 4];
            let expected = 0;
            h.tensors.forEach((t, i) => {
                expect(t.offset).toBe(expected);
                expect(t.offset % align).toBe(0);
                expected += alignUp(sizes[i]!, align);
            });
            expect(h.tensors.map((t) => [t.name, t.ne, t.type])).toEqual([
                ["t.a", [3], 0], ["t.b", [5, 3], 1], ["t.c", [1], 0], ["t.d", [16, 2], 0]
            ]);
            expect(h.dataStart % align).toBe(0);
            expect(buf.length).toBe(h.dataStart + expected);
            expect(h.impliedSize).toBe(buf.length);
            expect(w.layout().totalBytes).toBe(buf.length);

            // data lands at dataStart + offset
            const at = (i: number): number => h.dataStart + h.tensors[i]!.offset;
            expect([0, 1, 2].map((k) => buf.readFloatLE(at(0) + 4 * k))).toEqual([1, 2, 3]);
            expect(halfBitsToFloat(buf.readUInt16LE(at(1) + 2 * 14))).toBeCloseTo(2, 3);
            expect(buf.readFloatLE(at(2))).toBe(-0.25);
            expect(buf.readFloatLE(at(3) + 4 * 31)).toBe(-31);
            // padding bytes are zero
            expect(buf.subarray(at(0) + 12, at(1)).every((b) => b === 0)).toBe(true);
        });
    }

    it("rejects bad input", () => {
        const w = new GgufWriter();
        w.kv("k", GgufValueType.UINT8, 1);
        expect(() => w.kv("k", GgufValueType.UINT8, 2)).toThrow(/duplicate/);
        expect(() => new GgufWriter().kv("x", GgufValueType.UINT8, 256).toBuffer()).toThrow(/not an integer/);
        expect(() => new GgufWriter().kv("x", GgufValueType.INT32, 1.5).toBuffer()).toThrow();
        expect(() => new GgufWriter().tensor("t", [2, 2], [1, 2, 3])).toThrow(/3 values/);
        expect(() => new GgufWriter().tensor("x".repeat(64), [1], [0])).toThrow(/too long/);
        expect(() => new GgufWriter({alignment: 24})).toThrow(/power of two/);
        expect(() => readGgufHeader(Buffer.from("GGUX0000"))).toThrow(/magic/);
        expect(() => readGgufHeader(sampleWriter().toBuffer().subarray(0, 100))).toThrow(/truncated/);
    });

    it("converts to F16 with round-to-nearest-even", () => {
        const cases: [number, number][] = [
            [0, 0x0000], [-0, 0x8000], [1, 0x3c00], [-2, 0xc000], [65504, 0x7bff], [65520, 0x7c00], [1e6, 0x7c00],
            [Infinity, 0x7c00], [2 ** -24, 0x0001], [2 ** -14, 0x0400], [2 ** -26, 0x0000], [0.1, 0x2e66],
            [1 + 2 ** -11, 0x3c00], [1 + 3 * 2 ** -11, 0x3c02], [3 * 2 ** -25, 0x0002]
        ];
        for (const [v, bits] of cases) expect(floatToHalfBits(v), String(v)).toBe(bits);
        expect(floatToHalfBits(NaN) & 0x7c00).toBe(0x7c00);
        expect(floatToHalfBits(NaN) & 0x3ff).not.toBe(0);
        for (let b = 0; b < 0x7c00; b += 37) expect(floatToHalfBits(halfBitsToFloat(b))).toBe(b);
    });

    /** A writer with a lazy tensor whose producer counts its calls, and an eager one after it (padding in between). */
    function lazyWriter(): {w: GgufWriter; values: Float32Array; calls: () => number} {
        const values = Float32Array.from({length: 1000}, (_, i) => Math.sin(i));
        let calls = 0;
        const w = new GgufWriter();
        w.kv("k", GgufValueType.STRING, "v".repeat(300)) // a header longer than the chunk bound below
            .lazyTensor("lazy", [250, 4], GgmlTensorType.F16, () => { calls++; return encodeTensorData(values, GgmlTensorType.F16); })
            .tensor("eager", [3], Float32Array.of(7, 8, 9));
        return {w, values, calls: () => calls};
    }

    it("streams a file in chunks no larger than the bound; lazy tensors are produced only while writing", () => {
        const {w, values, calls} = lazyWriter();
        expect(calls()).toBe(0); // adding a lazy tensor and computing the layout need no data
        expect(w.layout().tensors[0]!.size).toBe(2000);
        const whole = w.toBuffer();
        expect(calls()).toBe(1);

        const file = path.join(tmp, "streamed.gguf");
        const writes: number[] = [];
        const bytes = writeGgufFile(file, w, {maxChunkBytes: 128, write: (fd, chunk) => { writes.push(chunk.length); writeSync(fd, chunk); }});
        expect(calls()).toBe(2);
        expect(Math.max(...writes)).toBeLessThanOrEqual(128);
        expect(writes.length).toBeGreaterThanOrEqual(Math.ceil(whole.length / 128));
        expect(bytes).toBe(whole.length);
        const back = readFileSync(file);
        expect(back.equals(whole)).toBe(true);
        const h = readGgufHeader(back);
        const lazyAt = h.dataStart + h.tensors[0]!.offset;
        expect(halfBitsToFloat(back.readUInt16LE(lazyAt + 2 * 999))).toBeCloseTo(values[999]!, 3);
        expect(back.readFloatLE(h.dataStart + h.tensors[1]!.offset + 8)).toBe(9);
        expect(readdirSync(tmp).filter((f) => f.endsWith(".tmp"))).toEqual([]);
    });

    it("a failed write leaves neither a partial file under the final name nor a temporary file", () => {
        const {w} = lazyWriter();
        const file = path.join(tmp, "failed.gguf");
        let n = 0;
        const failThird = (fd: number, chunk: Buffer): void => {
            if (++n === 3) throw new Error("disk full (injected)");
            writeSync(fd, chunk);
        };
        expect(() => writeGgufFile(file, w, {maxChunkBytes: 128, write: failThird})).toThrow(/disk full/);
        expect(existsSync(file)).toBe(false);
        // an existing file is replaced only by a complete one
        writeFileSync(file, "previous");
        n = 0;
        expect(() => writeGgufFile(file, w, {maxChunkBytes: 128, write: failThird})).toThrow(/disk full/);
        expect(readFileSync(file, "utf8")).toBe("previous");
        expect(readdirSync(tmp).filter((f) => f.endsWith(".tmp"))).toEqual([]);
        writeGgufFile(file, w, {maxChunkBytes: 128});
        expect(readFileSync(file).equals(w.toBuffer())).toBe(true);
    });

    it("checks a lazy tensor's produced size, and refuses toBuffer() beyond one Buffer without producing data", () => {
        const bad = new GgufWriter().lazyTensor("t", [4], GgmlTensorType.F32, () => Buffer.alloc(12));
        expect(() => bad.toBuffer()).toThrow(/produced 12 bytes.*need 16/);
        let produced = false;
        // 2^31 F32 values = 8 GiB: larger than any Buffer; only the layout is computed
        const huge = new GgufWriter().lazyTensor("t", [1 << 16, 1 << 15], GgmlTensorType.F32, () => { produced = true; return Buffer.alloc(0); });
        expect(huge.layout().totalBytes).toBeGreaterThan(2 ** 33);
        expect(() => huge.toBuffer()).toThrow(/writeGgufFile/);
        expect(produced).toBe(false);
    });
});
