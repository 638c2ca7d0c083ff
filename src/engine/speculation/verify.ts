/**
 * Verification of prompt-lookup drafts (sample-and-accept), after the step's first sample of every item: a drafted
 * item's batch entry [pending, d1..dk] has logits at each position, so while the token sampled at position j equals
 * draft d(j+1), position j+1 is sampled too, with the request's own sampler and the seed of that position. Every
 * emitted token is thus the one plain decoding would have sampled there (greedy and seeded alike): speculation
 * changes how many positions one decode covers, never which tokens come out.
 */
import type { ModelBackend, SampleRequest } from "../backend.js";
import { configureUnguided, tokenSeed, type RequestState } from "../request-state.js";
import type { BatchItem } from "../scheduler.js";

/** A drafted item whose last sample matched its draft: it samples its next position. */
interface Verifying {
  item: BatchItem;
  st: RequestState;
  /** Batch logit index of the item's first position (the pending token's). */
  firstLogit: number;
  /** Draft index whose position is sampled next (1 = the position after d1). */
  round: number;
}

/** Position of the token an item's first logits predict: after its last token, or after its pending token when drafted. */
export function firstSampledPosition(it: BatchItem): number {
  return it.pos + it.tokens.length - (it.drafts ?? 0);
}

/** True when `token` ends its request here (end-of-generation or a stop token): nothing after it is sampled. */
function ends(backend: ModelBackend, st: RequestState, token: number): boolean {
  return backend.isEndOfGeneration(token) || st.sampling.isStopToken(token);
}

/**
 * Whether the item's sample at draft index `round - 1` (its first sample for round 1) accepted that draft: the
 * token equals the draft and does not end the request.
 */
export function acceptsDraft(backend: ModelBackend, st: RequestState, item: BatchItem, round: number, token: number): boolean {
  const drafts = item.drafts ?? 0;
  return round <= drafts && token === item.tokens[round] && !ends(backend, st, token);
}

/**
 * Sample the further positions of the drafted items whose first sample matched (`first`: item, its state, its first
 * logit index), round by round, all items of a round in one native call when the backend has `sampleMany`. Each
 * emitted token goes to `emit` in order (it is already recorded in the request's sampling state). A sampler error
 * ends that item's verification: what it emitted so far stands.
 */
export async function verifyDrafts(
  backend: ModelBackend,
  first: readonly { item: BatchItem; st: RequestState; firstLogit: number }[],
  emit: (item: BatchItem, token: number) => void,
): Promise<void> {
  let active: Verifying[] = first.map((f) => ({ ...f, round: 1 }));
  while (active.length > 0) {
    // 1. Configure each sampler for its position (seed of that position; the bias after the accepted tokens).
    const ready: Verifying[] = [];
    for (const v of active) {
      try {
        configureUnguided(v.st, tokenSeed(v.st.params.seed, firstSampledPosition(v.item) + v.round));
        ready.push(v);
      } catch {
        // the item stops here
      }
    }
    // 2. Sample the round: one native call when the backend can, else one call per item.
    const requests: SampleRequest[] = ready.map((v) => ({ batchLogitIndex: v.firstLogit + v.round, sampler: v.st.sampler }));
    const results = await sampleRound(backend, requests);
    // 3. Emit each sample; an item goes on while its sample accepted the next draft.
    const next: Verifying[] = [];
    ready.forEach((v, k) => {
      const token = results[k];
      if (typeof token !== "number" || !Number.isInteger(token) || token < 0 || token >= backend.vocabSize) return;
      v.st.sampling.accept(token);
      emit(v.item, token);
      if (acceptsDraft(backend, v.st, v.item, v.round + 1, token)) next.push({ ...v, round: v.round + 1 });
    });
    active = next;
  }
}

/** One round's samples, by request: a token or the Error it failed with. */
async function sampleRound(backend: ModelBackend, requests: readonly SampleRequest[]): Promise<(number | Error)[]> {
  if (requests.length === 0) return [];
  if (backend.sampleMany) {
    try {
      return backend.sampleMany(requests);
    } catch (err) {
      return requests.map(() => err as Error);
    }
  }
  const out: (number | Error)[] = [];
  for (const r of requests) out.push(await backend.sample(r.batchLogitIndex, r.sampler).catch((err: unknown) => err as Error));
  return out;
}
