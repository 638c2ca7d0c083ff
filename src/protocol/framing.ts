/**
 * Length-prefixed JSON framing for the engine channel.
 *
 * Frame = 4-byte unsigned big-endian payload length, then that many bytes of UTF-8 JSON (one message object).
 * A frame longer than {@link MAX_FRAME_BYTES} or whose payload is not a JSON object is reported as a
 * {@link FrameError} and skipped; the stream stays usable (the length prefix tells where the next frame starts).
 */

/** Largest accepted payload (bytes). A 10 MB chat message plus its tokens fits well within it. */
export const MAX_FRAME_BYTES = 64 * 1024 * 1024;

/** Encode one message as a frame. @throws TypeError if the value cannot be serialised (e.g. a BigInt). */
export function encodeFrame(message: unknown): Buffer {
  const payload = Buffer.from(JSON.stringify(message), "utf8");
  const frame = Buffer.allocUnsafe(4 + payload.length);
  frame.writeUInt32BE(payload.length, 0);
  payload.copy(frame, 4);
  return frame;
}

/** A frame that could not be decoded; `reason` says why. */
export interface FrameError {
  error: string;
}

/** Result of decoding one frame: the parsed object or an error. */
export type Frame = { message: Record<string, unknown> } | FrameError;

/**
 * Incremental frame decoder: feed it chunks as they arrive; it returns every frame completed by the chunk.
 * An oversized frame's payload is skipped without being buffered.
 */
export class FrameDecoder {
  /** Received chunks not yet consumed, in order (kept as a list: no re-copy of a large frame per chunk). */
  private chunks: Buffer[] = [];
  /** Total bytes in `chunks`. */
  private length = 0;
  /** Bytes of an oversized frame still to skip. */
  private skipping = 0;

  constructor(private readonly maxFrameBytes: number = MAX_FRAME_BYTES) {}

  push(chunk: Buffer): Frame[] {
    const frames: Frame[] = [];
    this.chunks.push(chunk);
    this.length += chunk.length;
    for (;;) {
      // 1. Drop the rest of an oversized frame.
      if (this.skipping > 0) {
        const n = Math.min(this.skipping, this.length);
        this.drop(n);
        this.skipping -= n;
        if (this.skipping > 0) break;
      }
      // 2. Read the length prefix.
      if (this.length < 4) break;
      const len = this.peek(4).readUInt32BE(0);
      if (len > this.maxFrameBytes) {
        frames.push({ error: `frame of ${len} bytes exceeds the limit of ${this.maxFrameBytes} bytes` });
        this.drop(4);
        this.skipping = len;
        continue;
      }
      // 3. Wait for the whole payload, then parse it.
      if (this.length < 4 + len) break;
      this.drop(4);
      frames.push(parsePayload(this.take(len)));
    }
    return frames;
  }

  /** Bytes buffered towards an incomplete frame. */
  get bufferedBytes(): number {
    return this.length;
  }

  /** The first n buffered bytes, without consuming them (n ≤ length). */
  private peek(n: number): Buffer {
    const first = this.chunks[0]!;
    if (first.length >= n) return first.subarray(0, n);
    return Buffer.concat(this.chunks, this.length).subarray(0, n);
  }

  /** Consume and return the first n buffered bytes (n ≤ length). */
  private take(n: number): Buffer {
    const first = this.chunks[0]!;
    let out: Buffer;
    if (first.length >= n) out = first.subarray(0, n);
    else {
      const parts: Buffer[] = [];
      let need = n;
      for (const c of this.chunks) {
        if (need <= 0) break;
        parts.push(c.length <= need ? c : c.subarray(0, need));
        need -= Math.min(need, c.length);
      }
      out = Buffer.concat(parts, n);
    }
    this.drop(n);
    return out;
  }

  /** Discard the first n buffered bytes (n ≤ length). */
  private drop(n: number): void {
    this.length -= n;
    while (n > 0) {
      const first = this.chunks[0]!;
      if (first.length <= n) {
        n -= first.length;
        this.chunks.shift();
      } else {
        this.chunks[0] = first.subarray(n);
        n = 0;
      }
    }
  }
}

function parsePayload(payload: Buffer): Frame {
  let value: unknown;
  try {
    value = JSON.parse(payload.toString("utf8"));
  } catch (err) {
    return { error: `frame is not valid JSON: ${(err as Error).message}` };
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    return { error: "frame is not a JSON object" };
  }
  return { message: value as Record<string, unknown> };
}
