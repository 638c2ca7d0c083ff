/**
 * The scheduler's invariants, checked after every step (tests fail on any violation; production contains it:
 * only the implicated requests fail). Each violation names the requests and slots it implicates.
 */
import { processedOf, slotOf, slotOfId, type SlotState } from "./slots.js";
import type { SchedulerConfig, Sequence } from "./types.js";

/** One violated invariant. */
export interface Violation {
  message: string;
  ids: string[];
  slots: number[];
}

/** The scheduler state the invariants are about. */
export interface SchedulerView {
  readonly config: SchedulerConfig;
  readonly queued: readonly Sequence[];
  readonly running: readonly Sequence[];
  readonly slots: readonly SlotState[];
  readonly live: ReadonlyMap<string, Sequence>;
}

/** Every violated invariant of `v`. */
export function findViolations(v: SchedulerView): Violation[] {
  const out: Violation[] = [];
  const seen = new Set<string>();
  for (const s of v.queued) {
    if (seen.has(s.id)) out.push({ message: `${s.id} is queued twice`, ids: [s.id], slots: [] });
    seen.add(s.id);
    if (s.status.phase !== "queued") out.push({ message: `queued ${s.id} holds slot ${s.status.slot}`, ids: [s.id], slots: [s.status.slot] });
  }
  for (const s of v.running) {
    if (seen.has(s.id)) out.push({ message: `${s.id} is both queued and running, or running twice`, ids: [s.id], slots: [] });
    seen.add(s.id);
    const slot = slotOf(s);
    const st = slot === null ? null : v.slots[slot];
    if (!st || st.kind !== "owned" || st.id !== s.id) out.push({ message: `running ${s.id} does not own its slot`, ids: [s.id], slots: slot === null ? [] : [slot] });
    if (processedOf(s) > s.tokens.length || s.tokens.length > v.config.maxModelLen) out.push({ message: `${s.id} exceeds its capacity`, ids: [s.id], slots: [] });
  }
  if (seen.size !== v.live.size) {
    const orphans = [...v.live.keys()].filter((id) => !seen.has(id));
    out.push({ message: `live map has ${v.live.size} entries, queues hold ${seen.size}`, ids: orphans, slots: [] });
  }
  v.slots.forEach((st, slot) => {
    if (st.kind === "owned" && slotOfId(v.live, st.id) !== slot) out.push({ message: `slot ${slot} owned by non-live ${st.id}`, ids: [], slots: [slot] });
    if (st.kind === "cached" && (!v.config.prefixCaching || st.tokens.length > v.config.maxModelLen)) out.push({ message: `slot ${slot} caches KV it should not`, ids: [], slots: [slot] });
  });
  return out;
}
