/**
 * One llama.cpp batch per step: the step's items added in slot order, decoded on this thread (Keel's addon: decode
 * steps, and batches with prefill chunks that the measured pace says finish quickly) or on a libuv worker (longer
 * prefills, or node-llama-cpp's own addon), never overlapping another native call.
 */
import type { DecodeItem } from "../backend.js";
import type { Internals, NativeCallGuard } from "./internals.js";

/**
 * The order to add a batch's items to llama.cpp's batch: by slot (sequence id), stable. With one KV stream per
 * sequence, llama.cpp splits a batch into micro-batches of consecutive increasing sequence ids only
 * (`split_equal(..., sequential = true)`), one graph run each: a batch in admission order — slots permuted by reuse —
 * ran as many micro-batches as it had descents, doubling the step time at 64 streams on the H200.
 */
export function slotOrder(items: readonly { slot: number }[]): number[] {
  return items.map((_, i) => i).sort((a, b) => items[a]!.slot - items[b]!.slot || a - b);
}

/**
 * Longest a batch with prefill chunks may be expected to take on the engine's main thread (ms). Below it the worker
 * hop and the event-loop wake-up that ends it are saved (they delay a short prompt's first token); above it the batch
 * goes to a worker, so the engine keeps answering pings through a long prefill.
 */
export const SYNC_PREFILL_MAX_MS = 25;

/**
 * The measured decode pace of batches with prefill chunks: milliseconds per batch token of the last such batch (an
 * upper bound for a larger batch, whose fixed cost is shared by more tokens). Null until one ran: the first goes to
 * a worker.
 */
export class DecodePace {
  /** Milliseconds per token of the last batch with prefill chunks, or null before the first. */
  msPerToken: number | null = null;

  /** Whether a batch of `tokens` tokens is expected to finish within {@link SYNC_PREFILL_MAX_MS}. */
  quick(tokens: number): boolean {
    return this.msPerToken !== null && tokens * this.msPerToken <= SYNC_PREFILL_MAX_MS;
  }

  /** Record a batch of `tokens` tokens (with prefill chunks) that took `ms`. */
  record(tokens: number, ms: number): void {
    this.msPerToken = ms / tokens;
  }
}

/** The positions of an item whose logits are wanted: none, its last, or its last drafts + 1 (a drafted decode item). */
function logitPositions(it: LlamaBatchItem): Uint32Array {
  if (!it.wantsLogits) return new Uint32Array(0);
  const n = 1 + (it.drafts ?? 0);
  return Uint32Array.from({ length: n }, (_, j) => it.tokens.length - n + j);
}

/**
 * Host work to run while a decode computes (the loop's previous step message and its event-loop turn): it must not
 * call into the model or context (the guard stays `decoding` throughout).
 */
export type Alongside = () => Promise<void> | void;

/** What llama.cpp needs of a batch item (the port's DecodeItem without the request id). */
export type LlamaBatchItem = Omit<DecodeItem, "id">;

/**
 * Decode one batch. Returns, per item, the batch logit index of its last token (or -1 without logits); for a drafted
 * item the index of its first logits position, its other positions' indices following consecutively.
 * @throws Error when llama.cpp refuses the batch (the batch is rolled back; the context stays usable).
 */
export async function decodeBatch(native: Internals, guard: NativeCallGuard, batchSize: number, items: readonly LlamaBatchItem[], pace?: DecodePace, alongside?: Alongside): Promise<number[]> {
  guard.assertIdle("decode()");
  const total = items.reduce((a, it) => a + it.tokens.length, 0);
  if (total === 0) return [];
  if (total > batchSize) throw new RangeError(`batch of ${total} tokens exceeds batchSize ${batchSize}`);
  guard.decoding = true;
  const disposal = native.disposeGuard.createPreventDisposalHandle();
  try {
    native.ctx.initBatch(total);
    // Added in slot order (docs/upstream.md, "ubatch split by sequence id"); each item keeps its own logit index.
    const logitIdx = new Array<number>(items.length).fill(-1);
    for (const i of slotOrder(items)) {
      const it = items[i]!;
      const idx = logitPositions(it);
      const r = native.ctx.addToBatch(it.slot, it.pos, Uint32Array.from(it.tokens), idx);
      if (it.wantsLogits) logitIdx[i] = r[0] ?? -1;
      // The addon numbers outputs by batch position, so one item's run is consecutive; checked, not assumed.
      if (r.length > 1 && r[r.length - 1]! - r[0]! !== r.length - 1) throw new Error("llama.cpp returned non-consecutive logit indices for a drafted item");
    }
    // A decode step (one token per sequence) runs on this thread with Keel's addon: the worker hop and the
    // event-loop wake-up of decodeBatch cost as much as a small model's decode. A batch with prefill chunks does too
    // when the pace says it is quick (a short prompt's first token); a long one goes to a worker (the engine keeps
    // answering pings). Either way no other native call overlaps (guard.decoding).
    // A drafted decode item ([pending, d1..dk]) is a decode, not a prefill chunk.
    const prefill = items.some((it) => it.tokens.length > 1 + (it.drafts ?? 0));
    const t0 = performance.now();
    let besideMs = 0;
    const beside = async (): Promise<void> => {
      const b0 = performance.now();
      await alongside?.();
      besideMs = performance.now() - b0;
    };
    if (native.decodeSync && (!prefill || pace?.quick(total))) {
      // With a device backend the decode is queued and computes while `alongside` runs on this thread.
      if (alongside && native.synchronize) {
        native.decodeSync(native.ctx, false);
        try {
          await beside();
        } finally {
          native.synchronize(native.ctx);
        }
      } else native.decodeSync(native.ctx);
    } else {
      const decoding = native.ctx.decodeBatch();
      decoding.catch(() => undefined); // observed below, after `alongside`: never an unhandled rejection meanwhile
      let besideFailed: { error: unknown } | null = null;
      try {
        await beside();
      } catch (error) {
        besideFailed = { error };
      }
      await decoding; // settled before anything else touches the context, even when `alongside` threw
      if (besideFailed) throw besideFailed.error;
    }
    if (prefill) pace?.record(total, performance.now() - t0 - besideMs);
    return logitIdx;
  } finally {
    disposal.dispose();
    guard.decoding = false;
  }
}
