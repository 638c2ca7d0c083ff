/**
 * GGUF v3 writer (and a small header reader used by tests and by the default-model cache check).
 *
 * On-disk layout (all integers little endian; reference: llama.cpp `ggml/include/gguf.h`, `ggml/src/gguf.cpp`):
 *
 * ```
 *   offset 0   magic        4 bytes  "GGUF"
 *              version      u32      3
 *              tensorCount  i64
 *              kvCount      i64
 *   kvCount times:
 *              key          string
 *              valueType    i32      (GgufValueType)
 *              value        scalar, string, or for ARRAY:  elemType i32 | count u64 | count elements
 *   tensorCount times (tensor infos):
 *              name         string   (< 64 bytes, GGML_MAX_NAME)
 *              nDims        u32
 *              ne           i64 x nDims   ne[0] is the innermost, contiguous dimension
 *              ggmlType     i32      (GgmlTensorType)
 *              offset       u64      relative to the start of the data section
 *   zero padding up to a multiple of `general.alignment` (default 32) -> start of the data section
 *   data section: tensor i starts at its `offset`; every tensor is zero padded to the alignment.
 * ```
 *
 * `string` = u64 byte length followed by that many UTF-8 bytes (no terminator). `bool` = 1 byte (0/1).
 * gguf.cpp rejects a file unless each tensor's offset equals exactly the running sum of the padded sizes of the
 * tensors before it, so offsets are never chosen freely here: they are always computed from that sum.
 * A PyTorch-style weight `W[out][in]` of a Linear(in -> out) layer is therefore written with `ne = [in, out]`.
 */

/** GGUF metadata value types (`enum gguf_type`). */
export enum GgufValueType {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12
}

/** Tensor element types supported by this writer (subset of `enum ggml_type`). */
export enum GgmlTensorType {
    F32 = 0,
    F16 = 1
}

/** A scalar GGUF type, i.e. every {@link GgufValueType} except ARRAY. */
export type GgufScalarType = Exclude<GgufValueType, GgufValueType.ARRAY>;

/** JS value for a scalar type: 64-bit integers accept `bigint` (or a safe-integer `number`), STRING a string. */
export type GgufScalarValue = number | bigint | boolean | string;

/** One metadata entry as stored in the writer. */
export type GgufKv =
    | {key: string; type: GgufScalarType; value: GgufScalarValue}
    | {key: string; type: GgufValueType.ARRAY; elemType: GgufScalarType; values: readonly GgufScalarValue[]};

/** One tensor as stored in the writer (`bytes` already encoded in `type`). */
export interface GgufTensor {
    name: string;
    /** Dimensions, innermost first (ggml `ne`). */
    ne: number[];
    type: GgmlTensorType;
    bytes: Buffer;
}

/** Default data alignment of GGUF files (`GGUF_DEFAULT_ALIGNMENT`). */
export const GGUF_DEFAULT_ALIGNMENT = 32;
const GGUF_MAGIC = "GGUF";
const GGUF_VERSION = 3;
const MAX_TENSOR_NAME_BYTES = 63;

const FIXED_SIZE: Partial<Record<GgufValueType, number>> = {
    [GgufValueType.UINT8]: 1, [GgufValueType.INT8]: 1, [GgufValueType.BOOL]: 1,
    [GgufValueType.UINT16]: 2, [GgufValueType.INT16]: 2,
    [GgufValueType.UINT32]: 4, [GgufValueType.INT32]: 4, [GgufValueType.FLOAT32]: 4,
    [GgufValueType.UINT64]: 8, [GgufValueType.INT64]: 8, [GgufValueType.FLOAT64]: 8
};

/** Bytes per element of a tensor type. */
export function ggmlTypeSize(type: GgmlTensorType): number {
    switch (type) {
        case GgmlTensorType.F32: return 4;
        case GgmlTensorType.F16: return 2;
        default: throw new Error(`unsupported ggml tensor type ${String(type)}`);
    }
}

/** Rounds `n` up to a multiple of `alignment`. */
export function alignUp(n: number, alignment: number): number {
    return Math.ceil(n / alignment) * alignment;
}

const convF32 = new Float32Array(1);
const convU32 = new Uint32Array(convF32.buffer);

/**
 * Converts a number to IEEE-754 binary16 bits, rounding to nearest-even (via the float32 value).
 * Overflow gives +-Infinity, NaN stays NaN, tiny values become subnormals or signed zero.
 * @returns the 16-bit pattern as an unsigned integer
 */
export function floatToHalfBits(value: number): number {
    convF32[0] = value;
    const bits = convU32[0]!;
    const sign = (bits >>> 16) & 0x8000;
    const exp32 = (bits >>> 23) & 0xff;
    const frac32 = bits & 0x7fffff;
    if (exp32 === 0xff) return sign | 0x7c00 | (frac32 !== 0 ? 0x0200 : 0);
    const exp16 = exp32 - 112; // rebias 127 -> 15
    if (exp16 >= 0x1f) return sign | 0x7c00;
    if (exp16 <= 0) {
        // subnormal half (or zero): value = m * 2^-24 with the implicit leading 1 made explicit
        if (exp16 < -10) return sign;
        const m = frac32 | 0x800000;
        const shift = 14 - exp16; // 14..24
        let h = m >>> shift;
        const rest = m & ((1 << shift) - 1);
        const half = 1 << (shift - 1);
        if (rest > half || (rest === half && (h & 1) === 1)) h += 1;
        return sign | h;
    }
    let h = (exp16 << 10) | (frac32 >>> 13);
    const rest = frac32 & 0x1fff;
    if (rest > 0x1000 || (rest === 0x1000 && (h & 1) === 1)) h += 1; // may carry into the exponent: correct
    return sign | h;
}

/** Converts binary16 bits back to a number (exact). */
export function halfBitsToFloat(bits: number): number {
    const sign = bits & 0x8000 ? -1 : 1;
    const exp = (bits >>> 10) & 0x1f;
    const frac = bits & 0x3ff;
    if (exp === 0) return sign * frac * 2 ** -24;
    if (exp === 0x1f) return frac ? NaN : sign * Infinity;
    return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

function toBigInt(v: GgufScalarValue, key: string): bigint {
    if (typeof v === "bigint") return v;
    if (typeof v === "number" && Number.isSafeInteger(v)) return BigInt(v);
    throw new Error(`gguf kv "${key}": expected an integer, got ${String(v)}`);
}

function checkInt(v: GgufScalarValue, min: number, max: number, key: string): number {
    if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
        throw new Error(`gguf kv "${key}": ${String(v)} is not an integer in [${min}, ${max}]`);
    }
    return v;
}

/** Sequential little-endian writer over a preallocated buffer. */
class Cursor {
    pos = 0;
    constructor(readonly buf: Buffer) {}
    u32(v: number): void { this.buf.writeUInt32LE(v, this.pos); this.pos += 4; }
    i32(v: number): void { this.buf.writeInt32LE(v, this.pos); this.pos += 4; }
    u64(v: bigint): void { this.buf.writeBigUInt64LE(v, this.pos); this.pos += 8; }
    i64(v: bigint): void { this.buf.writeBigInt64LE(v, this.pos); this.pos += 8; }
    bytes(b: Buffer): void { b.copy(this.buf, this.pos); this.pos += b.length; }
    str(s: string): void { const b = Buffer.from(s, "utf8"); this.u64(BigInt(b.length)); this.bytes(b); }
    scalar(type: GgufScalarType, v: GgufScalarValue, key: string): void {
        const b = this.buf;
        switch (type) {
            case GgufValueType.UINT8: b.writeUInt8(checkInt(v, 0, 0xff, key), this.pos); break;
            case GgufValueType.INT8: b.writeInt8(checkInt(v, -0x80, 0x7f, key), this.pos); break;
            case GgufValueType.UINT16: b.writeUInt16LE(checkInt(v, 0, 0xffff, key), this.pos); break;
            case GgufValueType.INT16: b.writeInt16LE(checkInt(v, -0x8000, 0x7fff, key), this.pos); break;
            case GgufValueType.UINT32: b.writeUInt32LE(checkInt(v, 0, 0xffffffff, key), this.pos); break;
            case GgufValueType.INT32: b.writeInt32LE(checkInt(v, -0x80000000, 0x7fffffff, key), this.pos); break;
            case GgufValueType.FLOAT32: b.writeFloatLE(Number(v), this.pos); break;
            case GgufValueType.FLOAT64: b.writeDoubleLE(Number(v), this.pos); break;
            case GgufValueType.BOOL: b.writeUInt8(v ? 1 : 0, this.pos); break;
            case GgufValueType.UINT64: b.writeBigUInt64LE(toBigInt(v, key), this.pos); break;
            case GgufValueType.INT64: b.writeBigInt64LE(toBigInt(v, key), this.pos); break;
            case GgufValueType.STRING: this.str(String(v)); return;
            default: throw new Error(`gguf kv "${key}": bad scalar type ${String(type)}`);
        }
        this.pos += FIXED_SIZE[type]!;
    }
}

function scalarSize(type: GgufScalarType, v: GgufScalarValue): number {
    if (type === GgufValueType.STRING) return 8 + Buffer.byteLength(String(v), "utf8");
    const n = FIXED_SIZE[type];
    if (n == null) throw new Error(`bad gguf scalar type ${String(type)}`);
    return n;
}

/** Layout of a serialized file, as computed by {@link GgufWriter.layout}. */
export interface GgufLayout {
    /** Bytes of magic + counts + KVs + tensor infos (before padding). */
    headerBytes: number;
    /** Absolute file offset of the data section (headerBytes padded to the alignment). */
    dataStart: number;
    /** Per tensor: offset relative to dataStart, and its unpadded byte size. */
    tensors: {name: string; offset: number; size: number}[];
    /** Total file size in bytes. */
    totalBytes: number;
}

/**
 * Builds a GGUF v3 file in memory.
 *
 * Usage: add metadata with {@link kv} / {@link kvArray} (insertion order is kept), tensors with {@link tensor},
 * then call {@link toBuffer}. Errors (thrown as `Error`): duplicate keys or tensor names, names longer than 63
 * bytes, integer values out of range for their type, data length not matching the dimensions.
 */
export class GgufWriter {
    readonly alignment: number;
    private readonly kvs: GgufKv[] = [];
    private readonly tensors: GgufTensor[] = [];

    /**
     * @param options.alignment data alignment in bytes (power of two, default 32); a non-default value is
     *   recorded as the `general.alignment` u32 KV, as llama.cpp expects.
     */
    constructor(options: {alignment?: number} = {}) {
        const alignment = options.alignment ?? GGUF_DEFAULT_ALIGNMENT;
        if (!Number.isInteger(alignment) || alignment <= 0 || (alignment & (alignment - 1)) !== 0) {
            throw new Error(`alignment must be a power of two, got ${alignment}`);
        }
        this.alignment = alignment;
        if (alignment !== GGUF_DEFAULT_ALIGNMENT) this.kv("general.alignment", GgufValueType.UINT32, alignment);
    }

    private checkKey(key: string): void {
        if (this.kvs.some((k) => k.key === key)) throw new Error(`duplicate gguf key "${key}"`);
    }

    /** Adds a scalar KV. @throws Error on a duplicate key. */
    kv(key: string, type: GgufScalarType, value: GgufScalarValue): this {
        if ((type as GgufValueType) === GgufValueType.ARRAY) throw new Error("use kvArray() for arrays");
        this.checkKey(key);
        this.kvs.push({key, type, value});
        return this;
    }

    /** Adds an array KV whose elements all have `elemType` (nested arrays are not supported). */
    kvArray(key: string, elemType: GgufScalarType, values: readonly GgufScalarValue[]): this {
        if ((elemType as GgufValueType) === GgufValueType.ARRAY) throw new Error("nested arrays are not supported");
        this.checkKey(key);
        this.kvs.push({key, type: GgufValueType.ARRAY, elemType, values});
        return this;
    }

    /**
     * Adds a tensor.
     * @param name tensor name, at most 63 UTF-8 bytes
     * @param ne dimensions, innermost first (`[in, out]` for a Linear weight)
     * @param data values in memory order (ne[0] varies fastest); length must equal the product of `ne`
     * @param type F32 (default) or F16 (values rounded to nearest-even)
     */
    tensor(name: string, ne: readonly number[], data: ArrayLike<number>, type: GgmlTensorType = GgmlTensorType.F32): this {
        if (Buffer.byteLength(name, "utf8") > MAX_TENSOR_NAME_BYTES) throw new Error(`tensor name too long: ${name}`);
        if (this.tensors.some((t) => t.name === name)) throw new Error(`duplicate tensor "${name}"`);
        if (ne.length === 0 || ne.length > 4 || ne.some((d) => !Number.isInteger(d) || d <= 0)) {
            throw new Error(`tensor ${name}: bad dims [${ne.join(", ")}]`);
        }
        const count = ne.reduce((a, b) => a * b, 1);
        if (data.length !== count) throw new Error(`tensor ${name}: ${data.length} values for dims [${ne.join(", ")}]`);
        let bytes: Buffer;
        if (type === GgmlTensorType.F32) {
            const f = data instanceof Float32Array ? data : Float32Array.from(data);
            bytes = Buffer.from(f.buffer, f.byteOffset, f.byteLength);
            bytes = Buffer.from(bytes); // own copy: later edits of `data` must not change the file
        } else if (type === GgmlTensorType.F16) {
            const h = new Uint16Array(count);
            for (let i = 0; i < count; i++) h[i] = floatToHalfBits(data[i]!);
            bytes = Buffer.from(h.buffer);
        } else {
            throw new Error(`tensor ${name}: unsupported type ${String(type)}`);
        }
        this.tensors.push({name, ne: [...ne], type, bytes});
        return this;
    }

    /** Computes the file layout (offsets and sizes) without serializing. */
    layout(): GgufLayout {
        let header = 4 + 4 + 8 + 8;
        for (const kv of this.kvs) {
            header += 8 + Buffer.byteLength(kv.key, "utf8") + 4;
            if (kv.type === GgufValueType.ARRAY) {
                header += 4 + 8;
                for (const v of kv.values) header += scalarSize(kv.elemType, v);
            } else header += scalarSize(kv.type, kv.value);
        }
        const tensors: GgufLayout["tensors"] = [];
        let offset = 0;
        for (const t of this.tensors) {
            header += 8 + Buffer.byteLength(t.name, "utf8") + 4 + 8 * t.ne.length + 4 + 8;
            tensors.push({name: t.name, offset, size: t.bytes.length});
            offset += alignUp(t.bytes.length, this.alignment);
        }
        const dataStart = alignUp(header, this.alignment);
        return {headerBytes: header, dataStart, tensors, totalBytes: dataStart + offset};
    }

    /** Serializes the file. @throws Error if a value does not fit its declared type. */
    toBuffer(): Buffer {
        const lay = this.layout();
        const c = new Cursor(Buffer.alloc(lay.totalBytes)); // zero filled: padding is implicit
        c.bytes(Buffer.from(GGUF_MAGIC, "ascii"));
        c.u32(GGUF_VERSION);
        c.i64(BigInt(this.tensors.length));
        c.i64(BigInt(this.kvs.length));
        for (const kv of this.kvs) {
            c.str(kv.key);
            c.i32(kv.type);
            if (kv.type === GgufValueType.ARRAY) {
                c.i32(kv.elemType);
                c.u64(BigInt(kv.values.length));
                for (const v of kv.values) c.scalar(kv.elemType, v, kv.key);
            } else c.scalar(kv.type, kv.value, kv.key);
        }
        this.tensors.forEach((t, i) => {
            c.str(t.name);
            c.u32(t.ne.length);
            for (const d of t.ne) c.i64(BigInt(d));
            c.i32(t.type);
            c.u64(BigInt(lay.tensors[i]!.offset));
        });
        if (c.pos !== lay.headerBytes) throw new Error(`gguf header size mismatch: ${c.pos} != ${lay.headerBytes}`);
        this.tensors.forEach((t, i) => t.bytes.copy(c.buf, lay.dataStart + lay.tensors[i]!.offset));
        return c.buf;
    }
}

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
