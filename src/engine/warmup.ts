/**
 * Warm-up at load: decode, before the engine says `ready`, one batch of every shape the scheduler will produce, so
 * that the first requests do not pay the GPU backend's one-time work. llama.cpp's Vulkan backend compiles a compute
 * pipeline the first time a shape needs it (the matrix-vector kernels per batch width 1..8, the small / medium /
 * large matrix-multiply tiles, the prefill's kernels): on the H200 the first requests at 8 streams waited seconds for
 * it (docs/gpu-h200.md). CUDA's first use is cheaper (module load, cuBLAS handles, graph capture) but not free.
 *
 * The batches run on the context's slots 0..n-1 from position 0 and every slot used is cleared afterwards, so the
 * first real request finds the same empty KV as without a warm-up (e2e: test/e2e/warmup.test.ts).
 * Like llama-server's own warm-up (on unless `--no-warmup`), it can be turned off: `--warmup false`.
 */
import type { DecodeItem, ModelBackend } from "./backend.js";

/** `--warmup`: auto = on a GPU backend only (a CPU backend compiles nothing: its first step costs what later ones do). */
export type WarmupMode = "auto" | "on" | "off";

/** The scheduler's limits the shapes follow (EngineConfig's names). */
export interface WarmupLimits {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  maxModelLen: number;
}

/** One warm-up batch: `sequences` slots (0..n-1) decoding `tokensPerSequence` tokens each. */
export interface WarmupShape {
  kind: "prefill" | "decode";
  sequences: number;
  tokensPerSequence: number;
}

/**
 * Time after which no further warm-up batch starts (ms). The gateway kills an engine that is not ready within
 * max(10 × stall timeout, 60 s) of its start (5 min by default), model load included; a device that compiles slowly
 * (Mesa's lavapipe on a small CPU took minutes) must still come up, warm or half warm.
 */
export const WARMUP_BUDGET_MS = 60_000;

/** What a warm-up did, for the log line and `ready`. */
export interface WarmupReport {
  ms: number;
  /** The batches decoded, in order (all of {@link warmupShapes} unless the budget ran out). */
  shapes: WarmupShape[];
  /** Batches left out because the time budget ran out (0: the warm-up is complete). */
  skipped: number;
  /** Slots that held warm-up KV and were cleared. */
  slotsCleared: number;
}

/**
 * Whether to warm up: `on` always, `off` never, `auto` when the backend is a GPU one (`gpu` is its name, false on CPU).
 */
export function shouldWarmUp(mode: WarmupMode, gpu: string | false): boolean {
  return mode === "on" || (mode === "auto" && gpu !== false);
}

/**
 * The batch widths a decode step can have that need different kernels: every width 1..8 (ggml's matrix-vector
 * kernels are specialised per number of columns up to 8), then the powers of two up to `maxNumSeqs` and
 * `maxNumSeqs` itself (the small / medium / large matrix-multiply tiles switch at 32 and 64 columns).
 */
export function decodeWidths(maxNumSeqs: number): number[] {
  const widths = new Set<number>();
  for (let n = 1; n <= Math.min(8, maxNumSeqs); n++) widths.add(n);
  for (let n = 16; n < maxNumSeqs; n *= 2) widths.add(n);
  widths.add(maxNumSeqs);
  return [...widths].sort((a, b) => a - b);
}

/**
 * The warm-up batches, in order: one prefill chunk of the step budget on slot 0 (as long as slot 0 still has room
 * for the decodes after it), then one decode step per width of {@link decodeWidths}.
 */
export function warmupShapes(limits: WarmupLimits): WarmupShape[] {
  const widths = decodeWidths(Math.max(1, Math.min(limits.maxNumSeqs, limits.maxNumBatchedTokens)));
  // Slot 0 takes part in every decode step, one position each, after the prefill chunk.
  const chunk = Math.min(limits.maxNumBatchedTokens, limits.maxModelLen - widths.length);
  const shapes: WarmupShape[] = chunk > 1 ? [{ kind: "prefill", sequences: 1, tokensPerSequence: chunk }] : [];
  const decodeRoom = limits.maxModelLen - (chunk > 1 ? chunk : 0);
  for (const n of widths.slice(0, Math.max(0, decodeRoom))) shapes.push({ kind: "decode", sequences: n, tokensPerSequence: 1 });
  return shapes;
}

/**
 * Decode the warm-up batches with `token` (any id of the vocabulary), in order, until `budgetMs` has passed, and
 * clear every slot they used.
 * @throws Error when a warm-up decode fails (the slots are cleared first): the engine cannot serve that shape either.
 */
export async function warmUp(
  backend: Pick<ModelBackend, "decode" | "clearSequence">,
  limits: WarmupLimits,
  token: number,
  budgetMs = WARMUP_BUDGET_MS,
  now: () => number = () => performance.now(),
): Promise<WarmupReport> {
  const started = now();
  const shapes = warmupShapes(limits);
  const done: WarmupShape[] = [];
  /** Next position per slot (a sequence's positions must follow on from what its KV holds). */
  const next: number[] = [];
  try {
    for (const shape of shapes) {
      // 0. Past the budget no new batch starts (the one in flight finishes).
      if (now() - started >= budgetMs) break;
      // 1. One item per slot 0..n-1, continuing each slot's positions; logits on the last token, as a step asks.
      const items: DecodeItem[] = [];
      for (let slot = 0; slot < shape.sequences; slot++) {
        const pos = next[slot] ?? 0;
        items.push({ id: "warmup", slot, pos, tokens: new Array<number>(shape.tokensPerSequence).fill(token), wantsLogits: true });
        next[slot] = pos + shape.tokensPerSequence;
      }
      // 2. Decode; the step number 0 is never a loop step (the loop counts from 1).
      await backend.decode(items, 0);
      done.push(shape);
    }
  } finally {
    // 3. Leave no KV behind: the first real request must see the slots as a fresh engine has them.
    for (let slot = 0; slot < next.length; slot++) backend.clearSequence(slot);
  }
  return { ms: now() - started, shapes: done, skipped: shapes.length - done.length, slotsCleared: next.length };
}
