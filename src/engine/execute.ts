/**
 * The execute step of the loop: decode one planned batch and sample every sequence that wants logits, never two
 * native calls at once (parallel sampling races in llama.cpp's output_reorder, docs/upstream.md). Pure with respect
 * to the scheduler: it returns what was sampled, decoded and failed; the loop's update step commits that.
 */
import type { PositionLogprobs } from "../protocol/messages.js";
import type { ModelBackend, RawLogprobs } from "./backend.js";
import { grammarSupport } from "./backend.js";
import { configureGuided, prepareGuide } from "./guides/guided-sampler.js";
import type { GuideSampling } from "./guides/guide-state.js";
import { configureUnguided, tokenSeed, type RequestState } from "./request-state.js";
import type { BatchItem } from "./scheduler.js";
import { acceptsDraft, firstSampledPosition, verifyDrafts } from "./speculation/verify.js";

/** A token sampled for a request, with its log probabilities when the request asked for them. */
export interface SampledToken {
  id: string;
  token: number;
  logprobs?: PositionLogprobs;
  /** The guide allowed only EOG (it ends the request even under ignore_eos / min_tokens). */
  guideEnd?: boolean;
}

/** What executing a batch produced. */
export interface Executed {
  /**
   * One token per sampled item, in batch order, then the further tokens of drafted items (in order per request);
   * each is already recorded in its request's sampling state.
   */
  sampled: SampledToken[];
  /** Items whose tokens are now in the KV (their requests advance). */
  decoded: BatchItem[];
  /** Items that could not be decoded or sampled (only their requests fail). */
  failed: { item: BatchItem; message: string }[];
}

/**
 * Microseconds one step spends in each timed part of execute (the step message's `stats.phaseUs`: `decode` is the
 * native forward pass — prefill chunks and decode tokens alike —, `sample` the sampling; `step` is the whole step).
 */
export interface StepTimes {
  decodeUs: number;
  sampleUs: number;
}

export class BatchExecutor {
  /** This step's times (reset by the loop at each step's start). */
  times: StepTimes = { decodeUs: 0, sampleUs: 0 };

  constructor(
    private readonly backend: ModelBackend,
    /** Engine-side state of the live requests (the loop owns it; read here). */
    private readonly requests: ReadonlyMap<string, RequestState>,
  ) {}

  /**
   * Decode `items` of step `step` and sample those that want logits. Policy on a failed decode (documented in
   * docs/fault-injection.md): retry once; if it fails again, split the batch in halves and handle each the same
   * way, so a batch that fails because of one request costs only that request. A backend that cannot roll a failed
   * decode back (recurrent state) rethrows instead: the engine process exits and the gateway restarts it and
   * resumes every request.
   */
  async run(items: BatchItem[], step: number, alongside?: () => Promise<void>): Promise<Executed> {
    let logitIdx: number[] | null = null;
    let lastError: unknown = null;
    for (let attempt = 0; attempt < 2 && logitIdx === null; attempt++) {
      const t0 = performance.now();
      // The decode phase is the device's time, not the host work done alongside it.
      let besideMs = 0;
      const beside = alongside && (async () => {
        const b0 = performance.now();
        try {
          await alongside();
        } finally {
          besideMs += performance.now() - b0;
        }
      });
      try {
        logitIdx = await this.backend.decode(items, step, beside);
      } catch (err) {
        lastError = err;
        if (this.backend.canRollBack === false) throw err;
      } finally {
        this.times.decodeUs += (performance.now() - t0 - besideMs) * 1000;
      }
    }
    if (logitIdx === null) {
      const message = `decode failed: ${(lastError as Error)?.message ?? String(lastError)}`;
      if (items.length === 1) return { sampled: [], decoded: [], failed: [{ item: items[0]!, message }] };
      const half = Math.ceil(items.length / 2);
      const a = await this.run(items.slice(0, half), step, alongside);
      const b = await this.run(items.slice(half), step, alongside);
      return { sampled: [...a.sampled, ...b.sampled], decoded: [...a.decoded, ...b.decoded], failed: [...a.failed, ...b.failed] };
    }
    const t0 = performance.now();
    try {
      return await this.sampleBatch(items, logitIdx);
    } finally {
      this.times.sampleUs += (performance.now() - t0) * 1000;
    }
  }

  /**
   * Sample every decoded item that wants logits. With a backend that samples many sequences per native call, the
   * unguided ones are sampled together first (one call for the step); guided ones (their probes read the logits
   * between calls) and backends without it go one sequence per call.
   */
  private async sampleBatch(items: BatchItem[], logitIdx: number[]): Promise<Executed> {
    const sampled: SampledToken[] = [];
    const decoded: BatchItem[] = [];
    const failed: { item: BatchItem; message: string }[] = [];
    const batched = this.sampleUnguidedTogether(items, logitIdx);
    const verifying: { item: BatchItem; st: RequestState; firstLogit: number }[] = [];
    // 1. In batch order: finish the batched ones, sample the rest one call each.
    for (let i = 0; i < items.length; i++) {
      const it = items[i]!;
      const st = this.requests.get(it.id);
      if (!it.wantsLogits || !st) {
        decoded.push(it);
        continue;
      }
      try {
        const s = await this.sampleOne(it, st, logitIdx[i]!, batched.get(i));
        st.sampling.accept(s.token);
        sampled.push(s);
        decoded.push(it);
        if (acceptsDraft(this.backend, st, it, 1, s.token)) verifying.push({ item: it, st, firstLogit: logitIdx[i]! });
      } catch (err) {
        failed.push({ item: it, message: (err as Error).message });
      }
    }
    // 2. Drafted items whose first sample matched their draft sample their next positions (speculation/verify.ts).
    await verifyDrafts(this.backend, verifying, (item, token) => sampled.push({ id: item.id, token }));
    return { sampled, decoded, failed };
  }

  /**
   * One native call for every unguided sequence (their samplers configured first, as the single path does): by batch
   * position, a token or the Error it failed with. Empty without `sampleMany`.
   */
  private sampleUnguidedTogether(items: BatchItem[], logitIdx: number[]): Map<number, number | Error> {
    const batched = new Map<number, number | Error>();
    if (!this.backend.sampleMany) return batched;
    const picks: number[] = [];
    for (let i = 0; i < items.length; i++) {
      const it = items[i]!;
      const st = this.requests.get(it.id);
      if (!it.wantsLogits || !st || st.guide) continue;
      try {
        configureUnguided(st, tokenSeed(st.params.seed, firstSampledPosition(it)));
        picks.push(i);
      } catch (err) {
        batched.set(i, err as Error);
      }
    }
    if (picks.length === 0) return batched;
    let results: (number | Error)[];
    try {
      results = this.backend.sampleMany(picks.map((i) => ({ batchLogitIndex: logitIdx[i]!, sampler: this.requests.get(items[i]!.id)!.sampler })));
    } catch (err) {
      results = picks.map(() => err as Error); // the call itself failed: every item it held fails, nothing else
    }
    picks.forEach((i, k) => batched.set(i, results[k] ?? new Error("no sample returned")));
    return batched;
  }

  /**
   * A guided item's token: through Keel's addon when loaded, whose one-item call also drops the tokens that would make
   * the output invalid UTF-8 (llama.cpp's grammar lets some through: keel-grammar-utf8.cpp), else node-llama-cpp's.
   */
  private async sampleGuided(logitIndex: number, st: RequestState): Promise<number> {
    if (!this.backend.sampleMany) return this.backend.sample(logitIndex, st.sampler);
    const [result] = this.backend.sampleMany([{ batchLogitIndex: logitIndex, sampler: st.sampler }]);
    if (result instanceof Error) throw result;
    if (result === undefined) throw new Error("no sample returned");
    return result;
  }

  /** The token of one item: sampled together already (`pre`), or sampled now (guided: the guide decides first). */
  private async sampleOne(it: BatchItem, st: RequestState, logitIndex: number, pre: number | Error | undefined): Promise<SampledToken> {
    if (pre instanceof Error) throw pre;
    const seed = tokenSeed(st.params.seed, firstSampledPosition(it));
    let guided: GuideSampling | null = null;
    if (pre === undefined) {
      if (st.guide) {
        // 1. The guide decides, before this sample, what constrains it (a rule that is complete and cannot
        //    continue ends here: the probe reads this step's logits).
        guided = await prepareGuide(this.backend, grammarSupport(this.backend)!, st, logitIndex);
        configureGuided(this.backend, st, seed, guided);
      } else configureUnguided(st, seed);
    }
    let token: number;
    try {
      token = pre ?? (await this.sampleGuided(logitIndex, st));
    } catch (err) {
      if (!guided?.grammar || !st.guide) throw err;
      // 2. A sampler error under a grammar (everything masked, a rejected pick): that grammar state is never
      //    touched again; the request goes on unconstrained (sampling never changes the logits: sample again).
      st.guide.drop(`sampling under the grammar failed: ${(err as Error).message}`);
      guided = { grammar: null, bans: new Set(), ending: false };
      configureGuided(this.backend, st, seed, guided);
      token = await this.backend.sample(logitIndex, st.sampler);
    }
    if (!Number.isInteger(token) || token < 0 || token >= this.backend.vocabSize) throw new Error(`sampled invalid token ${token}`);
    const guideEnd = guided?.ending === true && this.backend.isEndOfGeneration(token) ? { guideEnd: true } : {};
    const top = st.params.logprobs;
    if (top == null) return { id: it.id, token, ...guideEnd };
    if (!this.backend.logprobs) throw new Error("this backend serves no log probabilities");
    return { id: it.id, token, logprobs: this.withBytes(await this.backend.logprobs(logitIndex, token, top)), ...guideEnd };
  }

  /**
   * Each token's raw bytes in its logprob entry (protocol TokenLogprob.bytes), so the gateway can show the token
   * text and OpenAI's `bytes`. A token without bytes (a control token) gets none.
   */
  private withBytes(lp: RawLogprobs): PositionLogprobs {
    const one = (t: { token: number; logprob: number }) => {
      const bytes = this.backend.bytesOf(t.token);
      return bytes.length > 0 ? { ...t, bytes: [...bytes] } : { ...t };
    };
    return { ...one(lp), top: lp.top.map(one) };
  }
}
