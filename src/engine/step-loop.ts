/**
 * The engine step loop: the single owner of engine state (docs/design-rules.md, rule 1).
 *
 * Commands (add / abort) are only queued by `submit()`; the loop takes ONE snapshot of them per step and applies
 * them at the step boundary (rule 2), plans one batch with the {@link Scheduler}, decodes it with the backend,
 * samples sequentially, and emits exactly one `step` message for each step that did work. No native call ever overlaps a decode:
 * slots are cleared and samplers disposed only between decodes.
 */
import type { AddMessage, EngineErrorCode, EngineMessage, GuidePhase, GuideSpec, TokenizeMessage, TokenizedMessage, PositionLogprobs, RequestOutput, SamplingParams } from "../protocol/messages.js";
import { PROTOCOL_VERSION } from "../protocol/messages.js";
import { checkSamplingParams } from "../protocol/validate.js";
import type { CompiledGrammar, DecodeItem, GrammarState, RawLogprobs, SampleRequest, SamplerConfig, SamplerHandle } from "./llama-adapter.js";
import { GuideState, type GuideSampling } from "./guide-state.js";
import { SamplingState } from "./sampling-state.js";
import { Scheduler, type BatchItem, type Outcome, type SchedulerConfig } from "./scheduler.js";

/**
 * Grammar support of a backend (guided generation, `SamplingParams.guide`). All of it or none: without it the
 * engine announces `capabilities.grammars: false` and refuses a guide. See llama-adapter.ts for the hazards these
 * methods guard (never an EOG or an unchecked token into llama.cpp; a failed state is never touched again).
 */
export interface GrammarBackend {
  /** Compile GBNF with root `rule`, preceded by the literal `prefix` when non-empty (cached). @throws on a bad grammar. */
  compileGrammar(grammar: string, rule: string, prefix?: string): CompiledGrammar;
  createGrammarState(grammar: CompiledGrammar): GrammarState;
  grammarCanBeNext(state: GrammarState, token: number): boolean;
  /** Feed a replayed token (never EOG; checked first). @throws when refused; the state is then dead. */
  grammarAccept(state: GrammarState, token: number): void;
  grammarIsComplete(state: GrammarState): boolean;
  /** Whether a non-EOG token not banned by `bias` may continue the grammar, at a logit index of this step. */
  grammarCanContinue(batchLogitIndex: number, state: GrammarState, bias: ReadonlyMap<number, number>): Promise<boolean>;
  /** Control / user-defined tokens that are not end-of-generation, with their text (banned in rule phases). */
  specialTokens(): readonly { token: number; text: string }[];
}

const GRAMMAR_METHODS = ["compileGrammar", "createGrammarState", "grammarCanBeNext", "grammarAccept", "grammarIsComplete", "grammarCanContinue", "specialTokens"] as const;

/** The backend's grammar support, or null when it lacks any of the methods. */
export function grammarSupport(backend: ModelBackend): GrammarBackend | null {
  return GRAMMAR_METHODS.every((m) => typeof backend[m] === "function") ? (backend as GrammarBackend) : null;
}

/** What the loop needs from a model backend (the llama.cpp adapter, or a fake in tests). */
export interface ModelBackend extends Partial<GrammarBackend> {
  tokenize(text: string): number[];
  /** The BOS token id the tokenizer prepends, or null when it adds none (tokenize without special tokens). */
  readonly bosToken?: number | null;
  /**
   * A cheap lower bound on the tokens `tokenize(text)` would produce, computed without tokenizing. The loop refuses
   * a prompt whose bound already exceeds the capacity, because tokenizing is synchronous and llama.cpp's
   * special-token pass is quadratic in the number of markers (an 800 KB prompt of `<|im_end|>` took 44 s).
   */
  tokenLowerBound?(text: string): number;
  bytesOf(token: number): Uint8Array;
  isEndOfGeneration(token: number): boolean;
  readonly eogTokens: number[];
  readonly vocabSize: number;
  /** A sampler whose repetition-penalty history starts as `history` (prompt + resumed tokens). */
  createSampler(cfg: SamplerConfig, history?: readonly number[]): SamplerHandle;
  /** Decode one batch; returns the batch logit index per item (-1 without logits). */
  decode(items: DecodeItem[]): Promise<number[]>;
  sample(batchLogitIndex: number, sampler: SamplerHandle): Promise<number>;
  /**
   * Sample several sequences of the current step in ONE synchronous native call: per item what `sample` gives, in
   * order; a failing item is an Error in its place. Absent when the backend has no such call (node-llama-cpp's own addon).
   */
  readonly sampleMany?: (batch: readonly SampleRequest[]) => (number | Error)[];
  /**
   * Raw-distribution log probabilities at a batch logit index (the sampled `token` and the `top` most likely).
   * Absent: the engine serves no log probabilities (capabilities.maxTopLogprobs = -1).
   */
  logprobs?(batchLogitIndex: number, token: number, top: number): Promise<RawLogprobs>;
  clearSequence(slot: number): void;
  /** Keep the first `keep` tokens of a slot's KV (0 = clear). False if the memory cannot be trimmed partially. */
  trimSequence?(slot: number, keep: number): boolean;
  /** False when a failed decode may leave state behind (recurrent memory): the loop then never retries. */
  readonly canRollBack?: boolean;
}

/** A command for the loop, applied at the next step boundary. */
export type LoopCommand = AddMessage | { type: "abort"; ids: string[] } | TokenizeMessage;

/** Engine-side data of one live request (the scheduler owns its tokens and slot). */
interface RequestState {
  /** Validated sampling parameters. */
  readonly params: SamplingParams;
  /** Sampler of the request's sequence, created at add. */
  readonly sampler: SamplerHandle;
  /** Incremental UTF-8 decoder: holds back an incomplete character, U+FFFD for impossible bytes. */
  readonly decoder: TextDecoder;
  /** Bias, penalty and stop state, a pure function of (params, prompt, generated ids). */
  readonly sampling: SamplingState;
  /** The guide's phase machine (params.guide), or null for an unguided request. */
  readonly guide: GuideState | null;
  /** What the sampler was last configured with for the guide (reconfigure when the grammar or bias changes). */
  configured: { grammar: GrammarState | null; bias: ReadonlyMap<number, number> } | null;
  /** The rule-phase bias last built: (base bias, ending) → merged map, kept while unchanged (compared by identity). */
  guideBias: { base: ReadonlyMap<number, number>; ending: boolean; merged: ReadonlyMap<number, number> } | null;
}

/** A token sampled for a request, with its log probabilities when the request asked for them. */
interface SampledToken {
  id: string;
  token: number;
  logprobs?: PositionLogprobs;
  /** The guide allowed only EOG (it ends the request even under ignore_eos / min_tokens). */
  guideEnd?: boolean;
}

/** Largest `params.logprobs` a backend with log probabilities serves (OpenAI's top_logprobs cap). */
export const MAX_TOP_LOGPROBS = 20;

/**
 * Seed of the token at `position`, derived from the request seed (splitmix32-style mixing). A token's randomness
 * depends only on (seed, position), so a generation resumed on a new engine samples what the first run would have.
 */
export function tokenSeed(seed: number, position: number): number {
  let z = (seed ^ Math.imul(position + 1, 0x9e3779b9)) >>> 0;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}

/** The grammar methods of a backend bound to it (the guide calls them as plain functions). */
function bindGrammar(g: GrammarBackend): Omit<GrammarBackend, "grammarCanContinue" | "specialTokens"> {
  return {
    compileGrammar: g.compileGrammar.bind(g),
    createGrammarState: g.createGrammarState.bind(g),
    grammarCanBeNext: g.grammarCanBeNext.bind(g),
    grammarAccept: g.grammarAccept.bind(g),
    grammarIsComplete: g.grammarIsComplete.bind(g),
  };
}

export class StepLoop {
  /** Commands received since the last snapshot, in arrival order. */
  private inbox: LoopCommand[] = [];
  /** Engine-side state of every request the scheduler holds. */
  private readonly requests = new Map<string, RequestState>();
  /** Step counter when an abort for a live or pending request arrived. */
  private readonly abortArrivedAtStep = new Map<string, number>();
  /** When each `add` arrived (ms since epoch), until its admission: the queue time reported in `admitted.queueMs`. */
  private readonly addArrivedAt = new Map<string, number>();
  /** Resolves the idle wait when a command arrives. */
  private wake: (() => void) | null = null;
  /** Set by stop(); the loop exits at the next boundary. */
  private stopping = false;
  /** Steps that decoded a batch. */
  steps = 0;
  /** Microseconds the current step spent in the native decode and in sampling (reset at each step's start). */
  private phase = { decodeUs: 0, sampleUs: 0 };
  /**
   * Test-only fault injection (docs/fault-injection.md): called before each decode with the batch; it may throw
   * (a failed step), never resolve (a hung step) or kill the process.
   */
  beforeDecode: ((items: BatchItem[], step: number) => void | Promise<void>) | null = null;
  /** Called after every step with the scheduler's invariant violations (tests fail on any). */
  onInvariantViolation: ((violations: string[]) => void) | null = null;

  readonly scheduler: Scheduler;

  constructor(
    private readonly backend: ModelBackend,
    config: SchedulerConfig,
    private readonly emit: (msg: EngineMessage) => void,
  ) {
    this.scheduler = new Scheduler(config);
  }

  /** Queue a command for the next step boundary. Never touches engine state. */
  submit(cmd: LoopCommand): void {
    if (cmd.type === "add" && !this.addArrivedAt.has(cmd.id)) this.addArrivedAt.set(cmd.id, Date.now());
    if (cmd.type === "abort") {
      // Remember when each abort arrived, to report how many steps it took to apply (docs/design-rules.md, I4/I5).
      for (const id of cmd.ids) {
        const known = this.requests.has(id) || this.inbox.some((c) => c.type === "add" && c.id === id);
        if (known && !this.abortArrivedAtStep.has(id)) this.abortArrivedAtStep.set(id, this.steps);
      }
    }
    this.inbox.push(cmd);
    this.wake?.();
  }

  /** Ask the loop to exit at the next step boundary. */
  stop(): void {
    this.stopping = true;
    this.wake?.();
  }

  /**
   * Run until stop(). A failing decode or sampler fails only its requests; an unexpected exception in the loop
   * itself rejects, and the engine process then exits so that the gateway restarts it (never a stuck loop).
   */
  async run(): Promise<void> {
    while (!this.stopping) {
      if (this.inbox.length === 0 && !this.scheduler.hasWork) {
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = null;
        continue;
      }
      await this.step();
      // Let I/O in (commands, pings) between steps: with Keel's addon a decode step's native calls all run on this
      // thread, so a busy loop would otherwise never leave the microtask queue and starve the command channel.
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
  }

  /** One step: snapshot, apply, plan, decode, sample, commit, emit. Exposed for tests that step by hand. */
  async step(): Promise<void> {
    const stepStart = performance.now();
    this.phase = { decodeUs: 0, sampleUs: 0 };
    const outputs = new Map<string, RequestOutput>();
    const out = (id: string): RequestOutput => {
      let o = outputs.get(id);
      if (!o) outputs.set(id, (o = { id, tokens: [], text: "" }));
      return o;
    };
    // 1. One snapshot of the commands; adds before aborts so an abort that raced its own add is never lost.
    const snapshot = this.inbox;
    this.inbox = [];
    const abortIds: string[] = [];
    for (const cmd of snapshot) {
      if (cmd.type === "add") this.applyAdd(cmd);
      else if (cmd.type === "tokenize") this.emit(this.tokenize(cmd));
      else abortIds.push(...cmd.ids);
    }
    // 2. Aborts free their slots at once (no decode is in flight here).
    this.finish(this.scheduler.abort(abortIds), out);
    // 3. Admission and one batch.
    const plan = this.scheduler.schedule();
    // Queue time ends here, at admission — before the prefill runs (the step output arrives only after it).
    const admittedAt = Date.now();
    for (const a of plan.admitted) {
      const arrived = this.addArrivedAt.get(a.id);
      this.addArrivedAt.delete(a.id);
      out(a.id).admitted = { promptTokens: a.promptTokens, cachedTokens: a.cachedTokens, ...(arrived !== undefined ? { queueMs: admittedAt - arrived } : {}) };
    }
    // 3b. Trim reused prefix-cache slots to the shared prefix before decoding into them.
    for (const op of plan.kvOps) {
      const ok = this.backend.trimSequence ? this.backend.trimSequence(op.slot, op.keep) : (this.backend.clearSequence(op.slot), op.keep === 0);
      if (ok) continue;
      // The slot could not keep its prefix (it was cleared): fail only the request that was placed there.
      const victim = plan.items.filter((it) => it.slot === op.slot);
      plan.items = plan.items.filter((it) => it.slot !== op.slot);
      this.finish(this.scheduler.failStep({ ...plan, items: victim }, { code: "engine_error", message: "the prefix cache slot could not be trimmed" }), out);
    }
    let batchTokens = 0;
    if (plan.items.length > 0) {
      // 4. Decode the batch and sample it; a failing decode is retried once, then bisected so that only the
      //    request whose presence makes it fail is failed (llama.cpp rolls a failed decode back).
      const { sampled, decoded, failed } = await this.decodeAndSample(plan.items, this.steps + 1);
      for (const f of failed) {
        this.finish(this.scheduler.failStep({ ...plan, items: [f.item] }, { code: "engine_error", message: f.message }), out);
      }
      if (decoded.length > 0) {
        this.steps += 1;
        batchTokens = decoded.reduce((a, it) => a + it.tokens.length, 0);
        // 5. Decide who finished, then record tokens, log probabilities and text (a stop token that ended its
        //    request is reported without text), then release the finished.
        const outcome = this.scheduler.commit({ ...plan, items: decoded }, sampled, (t) => this.backend.isEndOfGeneration(t));
        const stoppedBy = new Set(outcome.finished.filter((f) => f.reason === "stop").map((f) => f.id));
        for (const { id, token, logprobs } of sampled) {
          const st = this.requests.get(id);
          if (!st) continue;
          const o = out(id);
          o.tokens.push(token);
          if (logprobs) (o.logprobs ??= []).push(logprobs);
          st.sampling.accept(token);
          if (st.guide) {
            // The guide's phase moves between steps only: here, after this sequence's sample settled.
            st.guide.onToken(token);
            const dropped = st.guide.takeDropped();
            if (dropped !== undefined) o.guideDropped = dropped;
          }
          const silent = this.backend.isEndOfGeneration(token) || (stoppedBy.has(id) && st.sampling.isStopToken(token));
          if (!silent) o.text += st.decoder.decode(this.backend.bytesOf(token), { stream: true });
        }
        this.finish(outcome, out);
      }
    }
    const violations = this.scheduler.checkInvariants();
    if (violations.length > 0) {
      // Report (tests fail on any), then contain: only the implicated requests fail; the loop goes on.
      this.onInvariantViolation?.(violations);
      this.finish(this.scheduler.repairInvariants(), out);
    }
    // 6. Exactly one output message for the step.
    if (outputs.size > 0 || batchTokens > 0) {
      this.emit({
        v: PROTOCOL_VERSION,
        type: "step",
        step: this.steps,
        batchTokens,
        outputs: [...outputs.values()],
        stats: {
          waiting: this.scheduler.waitingCount,
          running: this.scheduler.runningCount,
          activeSequences: this.scheduler.activeSlots,
          cachedSequences: this.scheduler.cachedSlots,
          prefixCacheHitTokens: this.scheduler.prefixHitTokens,
          kvTokensInUse: this.scheduler.kvTokensInUse,
          phaseUs: { decode: Math.round(this.phase.decodeUs), sample: Math.round(this.phase.sampleUs), step: Math.round((performance.now() - stepStart) * 1000) },
        },
      });
    }
  }

  /**
   * Decode `items` and sample those that want logits, never two native calls at once (parallel sampling races in
   * llama.cpp's output_reorder, docs/upstream.md). Policy on a failed decode (documented in docs/fault-injection.md):
   * retry once; if it fails again, split the batch in halves and handle each the same way, so a batch that fails
   * because of one request costs only that request. A backend that cannot roll a failed decode back (recurrent
   * state) rethrows instead: the engine process exits and the gateway restarts it and resumes every request.
   */
  private async decodeAndSample(
    items: BatchItem[],
    step: number,
  ): Promise<{ sampled: SampledToken[]; decoded: BatchItem[]; failed: { item: BatchItem; message: string }[] }> {
    let logitIdx: number[] | null = null;
    let lastError: unknown = null;
    for (let attempt = 0; attempt < 2 && logitIdx === null; attempt++) {
      try {
        if (this.beforeDecode) await this.beforeDecode(items, step);
        const t0 = performance.now();
        try {
          logitIdx = await this.backend.decode(items);
        } finally {
          this.phase.decodeUs += (performance.now() - t0) * 1000;
        }
      } catch (err) {
        lastError = err;
        if (this.backend.canRollBack === false) throw err;
      }
    }
    if (logitIdx === null) {
      const message = `decode failed: ${(lastError as Error)?.message ?? String(lastError)}`;
      if (items.length === 1) return { sampled: [], decoded: [], failed: [{ item: items[0]!, message }] };
      const half = Math.ceil(items.length / 2);
      const a = await this.decodeAndSample(items.slice(0, half), step);
      const b = await this.decodeAndSample(items.slice(half), step);
      return { sampled: [...a.sampled, ...b.sampled], decoded: [...a.decoded, ...b.decoded], failed: [...a.failed, ...b.failed] };
    }
    const t0 = performance.now();
    try {
      return await this.sampleBatch(items, logitIdx);
    } finally {
      this.phase.sampleUs += (performance.now() - t0) * 1000;
    }
  }

  /**
   * Sample every decoded item that wants logits. With a backend that samples many sequences per native call, the
   * unguided ones are sampled together first (one call for the step); guided ones (their probes read the logits
   * between calls) and backends without it go one sequence per call.
   */
  private async sampleBatch(
    items: BatchItem[],
    logitIdx: number[],
  ): Promise<{ sampled: SampledToken[]; decoded: BatchItem[]; failed: { item: BatchItem; message: string }[] }> {
    const sampled: SampledToken[] = [];
    const decoded: BatchItem[] = [];
    const failed: { item: BatchItem; message: string }[] = [];
    // 1. One native call for every unguided sequence (their samplers configured first, as the single path does).
    const batched = new Map<number, number | Error>();
    if (this.backend.sampleMany) {
      const picks: number[] = [];
      for (let i = 0; i < items.length; i++) {
        const it = items[i]!;
        const st = this.requests.get(it.id);
        if (!it.wantsLogits || !st || st.guide) continue;
        try {
          this.configureUnguided(st, tokenSeed(st.params.seed, it.pos + it.tokens.length));
          picks.push(i);
        } catch (err) {
          batched.set(i, err as Error);
        }
      }
      if (picks.length > 0) {
        let results: (number | Error)[];
        try {
          results = this.backend.sampleMany(picks.map((i) => ({ batchLogitIndex: logitIdx[i]!, sampler: this.requests.get(items[i]!.id)!.sampler })));
        } catch (err) {
          results = picks.map(() => err as Error); // the call itself failed: every item it held fails, nothing else
        }
        picks.forEach((i, k) => batched.set(i, results[k] ?? new Error("no sample returned")));
      }
    }
    // 2. In batch order: finish the batched ones, sample the rest one call each.
    for (let i = 0; i < items.length; i++) {
      const it = items[i]!;
      const st = this.requests.get(it.id);
      if (!it.wantsLogits || !st) {
        decoded.push(it);
        continue;
      }
      try {
        // Sampled in step 1 (a token, or the Error it failed with), or not yet.
        const pre = batched.get(i);
        if (pre instanceof Error) throw pre;
        const seed = tokenSeed(st.params.seed, it.pos + it.tokens.length);
        let guided: GuideSampling | null = null;
        if (pre === undefined) {
          if (st.guide) {
            // 1. The guide decides, before this sample, what constrains it (a rule that is complete and cannot
            //    continue ends here: the probe reads this step's logits).
            guided = await this.prepareGuide(st, logitIdx[i]!);
            this.configureGuided(st, seed, guided);
          } else this.configureUnguided(st, seed);
        }
        let token: number;
        try {
          token = pre ?? (await this.backend.sample(logitIdx[i]!, st.sampler));
        } catch (err) {
          if (!guided?.grammar || !st.guide) throw err;
          // 2. A sampler error under a grammar (everything masked, a rejected pick): that grammar state is never
          //    touched again; the request goes on unconstrained (sampling never changes the logits: sample again).
          st.guide.drop(`sampling under the grammar failed: ${(err as Error).message}`);
          guided = { grammar: null, bans: new Set(), ending: false };
          this.configureGuided(st, seed, guided);
          token = await this.backend.sample(logitIdx[i]!, st.sampler);
        }
        if (!Number.isInteger(token) || token < 0 || token >= this.backend.vocabSize) throw new Error(`sampled invalid token ${token}`);
        const guideEnd = guided?.ending === true && this.backend.isEndOfGeneration(token) ? { guideEnd: true } : {};
        const top = st.params.logprobs;
        if (top != null) {
          if (!this.backend.logprobs) throw new Error("this backend serves no log probabilities");
          sampled.push({ id: it.id, token, logprobs: this.withBytes(await this.backend.logprobs(logitIdx[i]!, token, top)), ...guideEnd });
        } else sampled.push({ id: it.id, token, ...guideEnd });
        decoded.push(it);
      } catch (err) {
        failed.push({ item: it, message: (err as Error).message });
      }
    }
    return { sampled, decoded, failed };
  }

  /** Number of requests the loop holds (for tests). */
  get liveRequests(): number {
    return this.requests.size;
  }

  /**
   * Answer a `tokenize` question (docs/protocol.md §3.5) at the step boundary, like every other call into the model:
   * nothing touches the backend while a decode is in flight. Without `addSpecialTokens` a leading BOS the tokenizer
   * adds is dropped.
   */
  private tokenize(m: TokenizeMessage): TokenizedMessage {
    try {
      const tokens = this.backend.tokenize(m.text);
      const bos = this.backend.bosToken ?? null;
      if (!m.addSpecialTokens && bos !== null && tokens[0] === bos) tokens.shift();
      return { v: PROTOCOL_VERSION, type: "tokenized", id: m.id, tokens };
    } catch (err) {
      return { v: PROTOCOL_VERSION, type: "tokenized", id: m.id, error: (err as Error)?.message ?? String(err) };
    }
  }

  private applyAdd(cmd: AddMessage): void {
    const refuse = (code: EngineErrorCode, message: string): void => {
      this.abortArrivedAtStep.delete(cmd.id);
      if (!this.requests.has(cmd.id)) this.addArrivedAt.delete(cmd.id);
      this.emit({ v: PROTOCOL_VERSION, type: "request_error", id: cmd.id, code, message });
    };
    if (this.requests.has(cmd.id)) return refuse("duplicate_id", `request id ${cmd.id} is already live`);
    let prompt: number[];
    if ("text" in cmd.prompt && this.backend.tokenLowerBound) {
      const atLeast = this.backend.tokenLowerBound(cmd.prompt.text);
      if (atLeast >= this.scheduler.config.maxModelLen) {
        return refuse(
          "context_length_exceeded",
          `This model's maximum context length is ${this.scheduler.config.maxModelLen} tokens. However, your messages resulted in at least ${atLeast} tokens.`,
        );
      }
    }
    try {
      prompt = "text" in cmd.prompt ? this.backend.tokenize(cmd.prompt.text) : [...cmd.prompt.tokens];
    } catch (err) {
      return refuse("invalid_prompt", `could not tokenize the prompt: ${(err as Error).message}`);
    }
    const generated = cmd.generated ?? [];
    const all = [...prompt, ...generated];
    const bad = all.find((t) => t >= this.backend.vocabSize);
    if (bad !== undefined) return refuse("invalid_prompt", `token id ${bad} is outside the vocabulary (${this.backend.vocabSize})`);
    const maxNew = cmd.params.maxTokens === null ? null : cmd.params.maxTokens - generated.length;
    if (maxNew !== null && maxNew < 1) return refuse("invalid_prompt", "the resumed generation already reached max_tokens");
    const invalid = checkSamplingParams(cmd.params, { vocabSize: this.backend.vocabSize, maxTopLogprobs: this.maxTopLogprobs, grammars: this.grammars });
    if (invalid) return refuse("invalid_params", invalid);
    const sampling = new SamplingState(cmd.params, this.backend.eogTokens, generated);
    // The guide's phase is a pure function of the generated tokens: replay resumed ones (no grammar is compiled
    // before a rule phase needs one).
    let guide: GuideState | null = null;
    if (cmd.params.guide) {
      const grammar = grammarSupport(this.backend)!;
      const uncompilable = guideCompileError(grammar, cmd.params.guide);
      if (uncompilable) return refuse("invalid_params", uncompilable);
      guide = new GuideState(cmd.params.guide, { ...bindGrammar(grammar), bytesOf: (t) => this.backend.bytesOf(t), isEndOfGeneration: (t) => this.backend.isEndOfGeneration(t) }, GuideState.bansFor(cmd.params.guide, grammar.specialTokens()));
      generated.forEach((t, i) => guide!.onToken(t, { isBanned: (b) => sampling.bannedAt(i, b) }));
    }
    // Engine-side state first: a sampler that cannot be created refuses this add only, before the scheduler
    // holds a request that nobody could sample.
    let sampler: SamplerHandle;
    try {
      const history = sampling.repetitionPenalty !== 1 ? all : [];
      sampler = this.backend.createSampler(this.samplerConfig({ params: cmd.params, sampling }, tokenSeed(cmd.params.seed, all.length)), history);
    } catch (err) {
      return refuse("engine_error", `could not create a sampler: ${(err as Error).message}`);
    }
    const refusal = this.scheduler.add({
      id: cmd.id,
      inputTokens: all,
      promptLength: prompt.length,
      maxNewTokens: maxNew,
      ignoreEos: cmd.params.ignoreEos,
      ...(sampling.stopTokens.size > 0 ? { stopTokens: sampling.stopTokens } : {}),
      ...(sampling.minTokens > 0 ? { minTokens: sampling.minTokens } : {}),
    });
    if (refusal) {
      sampler.dispose();
      return refuse(refusal.code, refusal.message);
    }
    const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
    // Re-prime the decoder with resumed tokens so a character split across the resume point completes.
    for (const t of generated) if (!this.backend.isEndOfGeneration(t)) decoder.decode(this.backend.bytesOf(t), { stream: true });
    this.requests.set(cmd.id, { params: cmd.params, sampler, decoder, sampling, guide, configured: null, guideBias: null });
  }

  /**
   * Each token's raw bytes in its logprob entry (protocol TokenLogprob.bytes; added by the gateway branch), so the
   * gateway can show the token text and OpenAI's `bytes`. A token without bytes (a control token) gets none.
   */
  private withBytes(lp: RawLogprobs): PositionLogprobs {
    const one = (t: { token: number; logprob: number }) => {
      const bytes = this.backend.bytesOf(t.token);
      return bytes.length > 0 ? { ...t, bytes: [...bytes] } : { ...t };
    };
    return { ...one(lp), top: lp.top.map(one) };
  }

  /** Largest `params.logprobs` served: {@link MAX_TOP_LOGPROBS} when the backend has log probabilities, else -1. */
  get maxTopLogprobs(): number {
    return this.backend.logprobs ? MAX_TOP_LOGPROBS : -1;
  }

  /** True when the backend applies guides (capabilities.grammars). */
  get grammars(): boolean {
    return grammarSupport(this.backend) !== null;
  }

  /** Ask the guide what constrains this sample; its continuation probe sees the bias the sample would get. */
  private prepareGuide(st: RequestState, batchLogitIndex: number): Promise<GuideSampling> {
    const grammar = grammarSupport(this.backend)!;
    return st.guide!.prepare(async (state, then) => {
      const bias = this.guidedBias(st, { grammar: state, bans: st.guide!.bansInRules, ending: false });
      // The probe applies the grammar to the whole vocabulary: skip it where its answer changes nothing (a
      // complete then:"end" rule with EOG allowed: the sampler picks EOG or a continuation by itself).
      if (then === "end" && !this.backend.eogTokens.some((t) => bias.get(t) === -Infinity)) return true;
      return grammar.grammarCanContinue(batchLogitIndex, state, bias);
    });
  }

  /**
   * Configure the sampler of a guided request when its grammar, bias or seed changed. Rule phases add the special
   * token bans; while the guide allows only EOG, the EOG bans (ignore_eos, min_tokens) are lifted so that the
   * grammar never faces an empty choice.
   */
  private configureGuided(st: RequestState, seed: number, g: GuideSampling): void {
    const bias = this.guidedBias(st, g);
    const changed = st.configured === null || st.configured.grammar !== g.grammar || st.configured.bias !== bias;
    if (!changed && st.params.temperature === 0) return;
    st.configured = { grammar: g.grammar, bias };
    st.sampler.configure({ ...this.samplerConfig(st, seed), bias, grammar: g.grammar });
  }

  /** The bias of a guided sample: the request's own, plus rule-phase bans, minus EOG bans while ending. */
  private guidedBias(st: RequestState, g: GuideSampling): ReadonlyMap<number, number> {
    const base = st.sampling.takeBias();
    if (!g.grammar) return base;
    const cached = st.guideBias;
    if (cached && cached.base === base && cached.ending === g.ending) return cached.merged;
    const merged = new Map(base);
    for (const t of g.bans) merged.set(t, -Infinity);
    if (g.ending) for (const t of this.backend.eogTokens) merged.delete(t);
    st.guideBias = { base, ending: g.ending, merged };
    return merged;
  }

  /**
   * Reconfigure an unguided request's sampler only when something changed: the seed (per position, with a
   * temperature) or the bias (penalties, min_tokens); a greedy request without those keeps its sampler as created.
   */
  private configureUnguided(st: RequestState, seed: number): void {
    if (st.params.temperature > 0 || st.sampling.biasChanged) st.sampler.configure(this.samplerConfig(st, seed));
  }

  private samplerConfig(st: Pick<RequestState, "params" | "sampling">, seed: number): SamplerConfig {
    const p = st.params;
    return { temperature: p.temperature, topP: p.topP, topK: p.topK, minP: p.minP ?? 0, seed, bias: st.sampling.takeBias(), repetitionPenalty: st.sampling.repetitionPenalty };
  }

  /** Apply an outcome: clear freed slots, dispose samplers, record terminal events. */
  private finish(outcome: Outcome, out: (id: string) => RequestOutput): void {
    for (const slot of outcome.freedSlots) this.backend.clearSequence(slot);
    for (const f of outcome.finished) {
      const st = this.requests.get(f.id);
      this.requests.delete(f.id);
      const o = out(f.id);
      if (st) {
        if (f.reason === "stop" || f.reason === "length") o.text += st.decoder.decode();
        st.sampler.dispose();
      }
      const arrived = this.abortArrivedAtStep.get(f.id);
      this.abortArrivedAtStep.delete(f.id);
      this.addArrivedAt.delete(f.id);
      o.finish = {
        reason: f.reason,
        promptTokens: f.promptTokens,
        completionTokens: f.completionTokens,
        ...(f.reason === "abort" && arrived !== undefined ? { stepsAfterAbort: this.steps - arrived } : {}),
        ...(f.error ? { error: f.error } : {}),
      };
    }
  }
}

/**
 * Why a guide cannot be applied at all, or null: a rule it names is not defined, or its grammar does not compile.
 * Checked at add so that a client asking for structured output or a forced call never gets unconstrained text
 * instead (a 400 at the gateway); the text is compiled once (cached by text for the rule phases that follow).
 */
export function guideCompileError(grammar: Pick<GrammarBackend, "compileGrammar">, guide: GuideSpec): string | null {
  const named = new Set<string>();
  const add = (p: GuidePhase | undefined): void => {
    if (p?.kind === "rule") named.add(p.rule);
  };
  add(guide.start);
  add(guide.reasoning?.after);
  for (const t of guide.triggers ?? []) named.add(t.rule);
  if (named.size === 0) return null;
  // One pass over the grammar for its rule names (a qwen3coder guide names one trigger rule per tool).
  const defined = new Set([...guide.grammar.matchAll(/^([A-Za-z0-9_-]+)\s*::=/gm)].map((m) => m[1]!));
  const missing = [...named].filter((r) => !defined.has(r));
  if (missing.length > 0) return `the guide names undefined grammar rules: ${missing.join(", ")}`;
  try {
    grammar.compileGrammar(guide.grammar, [...named][0]!);
    return null;
  } catch (err) {
    return `the guide's grammar does not compile: ${(err as Error)?.message ?? String(err)}`;
  }
}
