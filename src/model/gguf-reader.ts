/**
 * A small GGUF v2/v3 header reader (KVs and tensor infos) for the tests and the default-model cache check; the
 * layout is described in gguf-writer.ts.
 */
import {alignUp, GGUF_DEFAULT_ALIGNMENT, GgmlTensorType, ggmlTypeSize, GgufValueType} from "./gguf-writer.js";

const GGUF_MAGIC = "GGUF";

/** Parsed header of a GGUF file (see {@link readGgufHeader}). */
export interface GgufHeader {
    version: number;
    alignment: number;
    /** KV values: scalars as number/bigint(64-bit ints)/boolean/string, arrays as JS arrays. */
    kv: Map<string, {type: GgufValueType; elemType?: GgufValueType; value: unknown}>;
    tensors: {name: string; ne: number[]; type: number; offset: number}[];
    /** Absolute offset of the data section. */
    dataStart: number;
    /** File size implied by the header: dataStart + padded sizes of all tensors (F32/F16 only). */
    impliedSize: number;
}

/**
 * Parses the header (KVs and tensor infos) of a GGUF v2/v3 buffer. Checks nothing about tensor data.
 * @throws Error on a bad magic, an unsupported version, a truncated buffer, or a tensor type other than F32/F16
 *   (needed to compute {@link GgufHeader.impliedSize}).
 */
export function readGgufHeader(buf: Buffer): GgufHeader {
    let p = 0;
    const need = (n: number): void => { if (p + n > buf.length) throw new Error("truncated gguf header"); };
    const u32 = (): number => { need(4); const v = buf.readUInt32LE(p); p += 4; return v; };
    const u64 = (): bigint => { need(8); const v = buf.readBigUInt64LE(p); p += 8; return v; };
    const num64 = (): number => Number(u64());
    const str = (): string => { const n = num64(); need(n); const s = buf.toString("utf8", p, p + n); p += n; return s; };
    const scalar = (type: GgufValueType): unknown => {
        switch (type) {
            case GgufValueType.UINT8: need(1); return buf.readUInt8(p++);
            case GgufValueType.INT8: need(1); return buf.readInt8(p++);
            case GgufValueType.BOOL: need(1); return buf.readUInt8(p++) !== 0;
            case GgufValueType.UINT16: { need(2); const v = buf.readUInt16LE(p); p += 2; return v; }
            case GgufValueType.INT16: { need(2); const v = buf.readInt16LE(p); p += 2; return v; }
            case GgufValueType.UINT32: return u32();
            case GgufValueType.INT32: { need(4); const v = buf.readInt32LE(p); p += 4; return v; }
            case GgufValueType.FLOAT32: { need(4); const v = buf.readFloatLE(p); p += 4; return v; }
            case GgufValueType.FLOAT64: { need(8); const v = buf.readDoubleLE(p); p += 8; return v; }
            case GgufValueType.UINT64: return u64();
            case GgufValueType.INT64: { need(8); const v = buf.readBigInt64LE(p); p += 8; return v; }
            case GgufValueType.STRING: return str();
            default: throw new Error(`bad gguf value type ${type}`);
        }
    };
    need(4);
    if (buf.toString("ascii", 0, 4) !== GGUF_MAGIC) throw new Error("not a GGUF file (bad magic)");
    p = 4;
    const version = u32();
    if (version !== 2 && version !== 3) throw new Error(`unsupported GGUF version ${version}`);
    const nTensors = num64();
    const nKv = num64();
    const kv: GgufHeader["kv"] = new Map();
    for (let i = 0; i < nKv; i++) {
        const key = str();
        const type = u32() as GgufValueType;
        if (type === GgufValueType.ARRAY) {
            const elemType = u32() as GgufValueType;
            const n = num64();
            const arr: unknown[] = [];
            for (let j = 0; j < n; j++) arr.push(scalar(elemType));
            kv.set(key, {type, elemType, value: arr});
        } else kv.set(key, {type, value: scalar(type)});
    }
    const alignEntry = kv.get("general.alignment");
    const alignment = typeof alignEntry?.value === "number" ? alignEntry.value : GGUF_DEFAULT_ALIGNMENT;
    const tensors: GgufHeader["tensors"] = [];
    let end = 0;
    for (let i = 0; i < nTensors; i++) {
        const name = str();
        const nd = u32();
        const ne: number[] = [];
        for (let d = 0; d < nd; d++) ne.push(num64());
        const type = u32();
        const offset = num64();
        if (type !== GgmlTensorType.F32 && type !== GgmlTensorType.F16) throw new Error(`tensor ${name}: type ${type} not supported`);
        const size = ne.reduce((a, b) => a * b, 1) * ggmlTypeSize(type);
        end = Math.max(end, offset + alignUp(size, alignment));
        tensors.push({name, ne, type, offset});
    }
    const dataStart = alignUp(p, alignment);
    return {version, alignment, kv, tensors, dataStart, impliedSize: dataStart + end};
}
