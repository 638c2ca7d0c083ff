/**
 * keel-tiny-f16: keel-tiny's weights with F16 matrices (the tiny model OpenVINO GenAI loads too): same tokenizer,
 * template, tensors and shapes; every matrix value is the F32 value rounded to half precision; norms stay F32.
 */
import {mkdtempSync, readFileSync, rmSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {afterAll, describe, expect, it} from "vitest";
import {ensureTinyModel, isDefaultModelPath, isTinyModelName} from "./default-model.js";
import {GgmlTensorType} from "./gguf-writer.js";
import {readGgufHeader} from "./gguf-reader.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-tiny-f16-test-"));
afterAll(() => rmSync(tmp, {recursive: true, force: true}));

/** IEEE 754 half (binary16) bits to a number. */
function halfToNumber(bits: number): number {
    const sign = bits & 0x8000 ? -1 : 1;
    const exp = (bits >> 10) & 0x1f;
    const frac = bits & 0x3ff;
    if (exp === 0) return sign * frac * 2 ** -24;
    if (exp === 0x1f) return frac ? NaN : sign * Infinity;
    return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

describe("keel-tiny-f16", () => {
    it("is keel-tiny with its matrices rounded to F16: same keys (but the file type), tensors, shapes; norms F32", async () => {
        expect(isTinyModelName("keel-tiny-f16")).toBe(true);
        const f16File = await ensureTinyModel("keel-tiny-f16", {dir: tmp});
        const f32File = await ensureTinyModel("keel-tiny", {dir: tmp});
        expect(path.basename(f16File)).toMatch(/^keel-tiny-f16-[0-9a-f]{16}\.gguf$/);
        expect(isDefaultModelPath(f16File)).toBe(true);
        const f16 = readFileSync(f16File);
        const f32 = readFileSync(f32File);
        const h16 = readGgufHeader(f16);
        const h32 = readGgufHeader(f32);
        expect(h16.kv.get("general.file_type")!.value).toBe(1); // MOSTLY_F16: OpenVINO GenAI reads it
        expect(h32.kv.get("general.file_type")!.value).toBe(0);
        const keys = (h: typeof h16): [string, unknown][] => [...h.kv].filter(([k]) => k !== "general.file_type").map(([k, v]) => [k, v.value]);
        expect(keys(h16)).toEqual(keys(h32));
        expect(h16.tensors.map((t) => [t.name, t.ne])).toEqual(h32.tensors.map((t) => [t.name, t.ne]));
        for (const t of h16.tensors) {
            expect(t.type, t.name).toBe(t.ne.filter((d) => d > 1).length > 1 ? GgmlTensorType.F16 : GgmlTensorType.F32);
        }
        // Every matrix value is its F32 twin within half precision's rounding (relative 2^-11, or a subnormal step).
        for (const t16 of h16.tensors.filter((t) => t.type === GgmlTensorType.F16)) {
            const t32 = h32.tensors.find((t) => t.name === t16.name)!;
            const count = t16.ne.reduce((a, b) => a * b, 1);
            for (let i = 0; i < count; i += 97) {
                const a = f32.readFloatLE(h32.dataStart + t32.offset + 4 * i);
                const b = halfToNumber(f16.readUInt16LE(h16.dataStart + t16.offset + 2 * i));
                expect(Math.abs(a - b), `${t16.name}[${i}]`).toBeLessThanOrEqual(Math.max(Math.abs(a) * 2 ** -11, 2 ** -25));
            }
        }
    });
});
