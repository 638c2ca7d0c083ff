/**
 * GGUF v3 writer (its header reader is gguf-reader.ts; binary16 conversion is half-float.ts).
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

import {constants as bufferConstants} from "node:buffer";
import {randomBytes} from "node:crypto";
import {closeSync, openSync, renameSync, rmSync, writeSync} from "node:fs";
import path from "node:path";
import {floatToHalfBits} from "./half-float.js";

export {floatToHalfBits, halfBitsToFloat} from "./half-float.js";

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

/** One tensor as stored in the writer: its shape, and how to get its bytes (already encoded in `type`). */
export interface GgufTensor {
    /** Tensor name (at most 63 UTF-8 bytes). */
    name: string;
    /** Dimensions, innermost first (ggml `ne`). */
    ne: number[];
    /** Element type of the encoded bytes. */
    type: GgmlTensorType;
    /** Encoded byte length (element count x type size): known up front so the layout needs no data. */
    size: number;
    /**
     * Produces the encoded bytes when the file is written. Eager tensors return a stored copy; lazy ones
     * ({@link GgufWriter.lazyTensor}) generate them on demand, so a multi-GiB model never sits in memory whole.
     */
    bytes: () => Buffer;
}

/**
 * Default size of one write when streaming a file ({@link GgufWriter.chunks}): far below the 2 GiB that a single
 * `fs.writeSync` / `Buffer` accepts, large enough that the syscall count is negligible.
 */
export const GGUF_WRITE_CHUNK_BYTES = 64 * 1024 * 1024;

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
 * Builds a GGUF v3 file.
 *
 * Usage: add metadata with {@link kv} / {@link kvArray} (insertion order is kept), tensors with {@link tensor} or
 * {@link lazyTensor}, then call {@link toBuffer} (small files) or stream it with {@link chunks} /
 * {@link writeGgufFile} (any size). Errors (thrown as `Error`): duplicate keys or tensor names, names longer than
 * 63 bytes, integer values out of range for their type, data length not matching the dimensions.
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
        const count = this.checkTensor(name, ne);
        if (data.length !== count) throw new Error(`tensor ${name}: ${data.length} values for dims [${ne.join(", ")}]`);
        const bytes = encodeTensorData(data, type, name);
        this.tensors.push({name, ne: [...ne], type, size: bytes.length, bytes: () => bytes});
        return this;
    }

    /**
     * Adds a tensor whose bytes are produced only when the file is serialized (once per {@link chunks} pass), so
     * that a model far larger than memory allows as one Buffer can be written tensor by tensor.
     * @param produce returns the tensor's values already encoded in `type` (checked against the dims on write);
     *   use {@link encodeTensorData} to encode numbers
     */
    lazyTensor(name: string, ne: readonly number[], type: GgmlTensorType, produce: () => Buffer): this {
        const count = this.checkTensor(name, ne);
        const size = count * ggmlTypeSize(type);
        const bytes = (): Buffer => {
            const b = produce();
            if (b.length !== size) throw new Error(`tensor ${name}: produced ${b.length} bytes, dims [${ne.join(", ")}] need ${size}`);
            return b;
        };
        this.tensors.push({name, ne: [...ne], type, size, bytes});
        return this;
    }

    /** Validates a new tensor's name and dims. @returns its element count */
    private checkTensor(name: string, ne: readonly number[]): number {
        if (Buffer.byteLength(name, "utf8") > MAX_TENSOR_NAME_BYTES) throw new Error(`tensor name too long: ${name}`);
        if (this.tensors.some((t) => t.name === name)) throw new Error(`duplicate tensor "${name}"`);
        if (ne.length === 0 || ne.length > 4 || ne.some((d) => !Number.isInteger(d) || d <= 0)) {
            throw new Error(`tensor ${name}: bad dims [${ne.join(", ")}]`);
        }
        return ne.reduce((a, b) => a * b, 1);
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
            tensors.push({name: t.name, offset, size: t.size});
            offset += alignUp(t.size, this.alignment);
        }
        const dataStart = alignUp(header, this.alignment);
        return {headerBytes: header, dataStart, tensors, totalBytes: dataStart + offset};
    }

    /**
     * Serializes the header: magic, counts, KVs and tensor infos, zero padded up to the data section.
     * @throws Error if a value does not fit its declared type
     */
    headerBuffer(lay: GgufLayout = this.layout()): Buffer {
        const c = new Cursor(Buffer.alloc(lay.dataStart)); // zero filled: the padding is implicit
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
        return c.buf;
    }

    /**
     * The file as a sequence of buffers, none longer than `maxChunkBytes`: the padded header (split if needed), then
     * each tensor's bytes in slices, then its zero padding. Lazy tensors are produced one at a time, as the
     * iteration reaches them, so memory holds at most one tensor.
     * @param maxChunkBytes upper bound of one yielded buffer (default {@link GGUF_WRITE_CHUNK_BYTES})
     */
    *chunks(maxChunkBytes: number = GGUF_WRITE_CHUNK_BYTES): Generator<Buffer> {
        if (!Number.isInteger(maxChunkBytes) || maxChunkBytes <= 0) throw new Error(`maxChunkBytes must be a positive integer, got ${maxChunkBytes}`);
        const lay = this.layout();
        const slices = function* (b: Buffer): Generator<Buffer> {
            for (let at = 0; at < b.length; at += maxChunkBytes) yield b.subarray(at, Math.min(b.length, at + maxChunkBytes));
        };
        yield* slices(this.headerBuffer(lay));
        for (const t of this.tensors) {
            yield* slices(t.bytes());
            const pad = alignUp(t.size, this.alignment) - t.size;
            if (pad > 0) yield Buffer.alloc(pad);
        }
    }

    /**
     * Serializes the whole file into one Buffer (small models, tests). Large models go through {@link chunks} /
     * {@link writeGgufFile}: one Buffer cannot hold more than `buffer.constants.MAX_LENGTH` bytes.
     * @throws Error if a value does not fit its declared type, or the file is larger than one Buffer can be
     */
    toBuffer(): Buffer {
        const total = this.layout().totalBytes;
        if (total > bufferConstants.MAX_LENGTH) throw new Error(`gguf file of ${total} bytes does not fit one Buffer; write it with writeGgufFile()`);
        const out = Buffer.allocUnsafe(total);
        let at = 0;
        for (const c of this.chunks()) at += c.copy(out, at);
        if (at !== total) throw new Error(`gguf size mismatch: wrote ${at} of ${total} bytes`);
        return out;
    }
}

/**
 * Encodes numbers as tensor bytes of `type`: F32 as-is (an own copy, so later edits of `data` do not change the
 * file), F16 rounded to nearest-even.
 */
export function encodeTensorData(data: ArrayLike<number>, type: GgmlTensorType, name = "tensor"): Buffer {
    if (type === GgmlTensorType.F32) {
        const f = data instanceof Float32Array ? data : Float32Array.from(data);
        return Buffer.from(Buffer.from(f.buffer, f.byteOffset, f.byteLength));
    }
    if (type === GgmlTensorType.F16) {
        const h = new Uint16Array(data.length);
        for (let i = 0; i < data.length; i++) h[i] = floatToHalfBits(data[i]!);
        return Buffer.from(h.buffer);
    }
    throw new Error(`tensor ${name}: unsupported type ${String(type)}`);
}

/** How {@link writeGgufFile} writes: the chunk bound, and the write call (injectable so tests can count and fail writes). */
export interface GgufFileWriteOptions {
    /** Upper bound of one write (default {@link GGUF_WRITE_CHUNK_BYTES}). */
    maxChunkBytes?: number;
    /** Writes `chunk` at the current end of `fd`; default `fs.writeSync` until the whole chunk is written. */
    write?: (fd: number, chunk: Buffer) => void;
}

/**
 * Writes a GGUF file (a writer's streamed {@link GgufWriter.chunks}, or a ready Buffer) to `file` atomically: into a
 * temporary file next to it, in writes of at most `maxChunkBytes` (never one call over 2 GiB, the limit of a
 * single `fs.writeSync`), then renamed over `file`. On any failure the temporary file is removed and `file` is left
 * as it was, so a partial model never appears under the final name.
 * @returns the number of bytes written
 * @throws the write / rename error (after cleaning up)
 */
export function writeGgufFile(file: string, source: GgufWriter | Buffer, options: GgufFileWriteOptions = {}): number {
    const maxChunk = options.maxChunkBytes ?? GGUF_WRITE_CHUNK_BYTES;
    const write = options.write ?? writeFully;
    const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
    const fd = openSync(tmp, "wx");
    let bytes = 0;
    try {
        try {
            const chunks = Buffer.isBuffer(source) ? bufferSlices(source, maxChunk) : source.chunks(maxChunk);
            for (const chunk of chunks) {
                write(fd, chunk);
                bytes += chunk.length;
            }
        } finally {
            closeSync(fd);
        }
        renameSync(tmp, file);
    } catch (err) {
        rmSync(tmp, {force: true});
        throw err;
    }
    return bytes;
}

/** `fs.writeSync` until all of `chunk` is written (a write may be short). */
function writeFully(fd: number, chunk: Buffer): void {
    for (let at = 0; at < chunk.length;) at += writeSync(fd, chunk, at, chunk.length - at);
}

function* bufferSlices(b: Buffer, max: number): Generator<Buffer> {
    if (!Number.isInteger(max) || max <= 0) throw new Error(`maxChunkBytes must be a positive integer, got ${max}`);
    for (let at = 0; at < b.length; at += max) yield b.subarray(at, Math.min(b.length, at + max));
}
