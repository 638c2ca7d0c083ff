/**
 * KV slots: what each holds (nothing, a live request, or a finished request's KV kept as a prefix cache entry), and
 * which free slot a new input goes to.
 */
import type { Sequence } from "./types.js";

/** What a slot holds. */
export type SlotState =
  /** No KV. */
  | { kind: "empty" }
  /** Owned by a live request. */
  | { kind: "owned"; id: string }
  /** Idle, holding the KV of `tokens` from a finished request (the prefix cache). */
  | { kind: "cached"; tokens: number[]; releasedAt: number };

/** The slot a sequence owns, or null while it is queued. */
export function slotOf(s: Sequence): number | null {
  return s.status.phase === "queued" ? null : s.status.slot;
}

/** The slot of a live request by id, or null (unknown or queued). */
export function slotOfId(live: ReadonlyMap<string, Sequence>, id: string): number | null {
  const s = live.get(id);
  return s ? slotOf(s) : null;
}

/** Tokens of a sequence whose KV is in its slot (0 while queued). */
export function processedOf(s: Sequence): number {
  return s.status.phase === "queued" ? 0 : s.status.processed;
}

/** Length of the common prefix of two token arrays. */
function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/**
 * The free slot for an input, and how many of its cached tokens to keep. Prefers the longest reusable prefix;
 * on a tie an empty slot (keeps the cache), then the least recently released cached slot. Null if none is free.
 * Without partial trims (recurrent state), a cached slot is reused only when all its tokens prefix the input.
 */
export function chooseSlot(slots: readonly SlotState[], input: readonly number[], partialTrim: boolean): { slot: number; keep: number } | null {
  let best: { slot: number; keep: number; rank: number } | null = null;
  slots.forEach((st, slot) => {
    if (st.kind === "owned") return;
    let keep = 0;
    if (st.kind === "cached") {
      const common = commonPrefix(st.tokens, input);
      // At least one input token must be prefilled to get logits for the first new token.
      const usable = Math.min(common, input.length - 1);
      if (!partialTrim) keep = common === st.tokens.length && st.tokens.length < input.length ? common : 0;
      else keep = usable;
    }
    // rank: longer reuse first; then empty before cached; then older cached first.
    const rank = keep * 1e9 + (st.kind === "empty" ? 5e8 : 5e8 - Math.min(st.releasedAt, 5e8 - 1));
    if (!best || rank > best.rank) best = { slot, keep, rank };
  });
  return best === null ? null : { slot: (best as { slot: number }).slot, keep: (best as { keep: number }).keep };
}
