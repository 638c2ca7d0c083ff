/**
 * Test-only fault injection as a backend wrapper (docs/fault-injection.md): every call goes to the wrapped backend,
 * and `decode` first checks the switches of `KEEL_FAULT_INJECTION` — it may abort the process (as a GGML_ASSERT
 * would), throw (a failed step) or never resolve (a hung step). Off unless the variable is set; the step loop knows
 * nothing of it. The OpenVINO worker reads the same switches (src/engine-openvino/faults.py).
 */
import type { AddMessage } from "../protocol/messages.js";
import type {
  CompiledGrammar,
  DecodeItem,
  GrammarState,
  ModelBackend,
  RawLogprobs,
  SampleRequest,
  SamplerConfig,
  SamplerHandle,
} from "./backend.js";

/** The switches, read from the KEEL_FAULT_INJECTION environment variable (JSON). */
export interface FaultSwitches {
  /** Abort the process (as a GGML_ASSERT would) before decoding step N — first engine process only. */
  crashAtStep?: number;
  /** Abort the process whenever a request whose prompt contains this text is in the batch — every process. */
  crashOnPrompt?: string;
  /** Make the decode of step N throw — first engine process only. */
  throwAtStep?: number;
  /** Make step N hang forever (for the watchdog) — first engine process only. */
  hangAtStep?: number;
  /** Make every decode throw while a request whose prompt contains this text is in the batch — every process. */
  failOnPrompt?: string;
}

/**
 * Every switch name this engine reads; the OpenVINO worker reads the same and adds `ignoreAtStep`
 * (src/engine-openvino/faults.test.ts checks both lists).
 */
export const FAULT_SWITCHES = ["crashAtStep", "crashOnPrompt", "throwAtStep", "hangAtStep", "failOnPrompt"] as const satisfies readonly (keyof FaultSwitches)[];

/** The switches of `env`, or null when fault injection is off. @throws SyntaxError on malformed JSON. */
export function faultSwitchesFrom(env: NodeJS.ProcessEnv): FaultSwitches | null {
  const raw = env["KEEL_FAULT_INJECTION"];
  return raw ? (JSON.parse(raw) as FaultSwitches) : null;
}

/** What the wrapper does when a switch fires (the process-level effects, replaceable in tests). */
export interface FaultEffects {
  /** Log that a fault fired. */
  injected(fault: "crash" | "throw" | "fail" | "hang", step: number): void;
  /** Abort the process (default: process.abort()). */
  abort(): never;
}

/** A backend whose decode misbehaves as the switches say. */
export class FaultyBackend implements ModelBackend {
  /** Prompt text of each request seen by {@link noteAdd}, for the *OnPrompt switches. */
  private readonly promptText = new Map<string, string>();
  /** Step-keyed faults that fired (each fires once, on the first decode attempt of its step). */
  private readonly fired = new Set<string>();

  /** @param firstProcess whether this is the model's first engine process (step-keyed faults fire only there). */
  constructor(
    private readonly inner: ModelBackend,
    private readonly switches: FaultSwitches,
    private readonly firstProcess: boolean,
    private readonly effects: FaultEffects,
  ) {
    // The optional parts of the port exist exactly when the wrapped backend has them.
    if (inner.tokenLowerBound) this.tokenLowerBound = (text) => inner.tokenLowerBound!(text);
    if (inner.sampleMany) this.sampleMany = (batch) => inner.sampleMany!(batch);
    if (inner.logprobs) this.logprobs = (i, token, top) => inner.logprobs!(i, token, top);
    if (inner.trimSequence) this.trimSequence = (slot, keep) => inner.trimSequence!(slot, keep);
    if (inner.compileGrammar) this.compileGrammar = (g, rule, prefix) => inner.compileGrammar!(g, rule, prefix);
    if (inner.createGrammarState) this.createGrammarState = (g) => inner.createGrammarState!(g);
    if (inner.grammarCanBeNext) this.grammarCanBeNext = (s, t) => inner.grammarCanBeNext!(s, t);
    if (inner.grammarAccept) this.grammarAccept = (s, t) => inner.grammarAccept!(s, t);
    if (inner.grammarIsComplete) this.grammarIsComplete = (s) => inner.grammarIsComplete!(s);
    if (inner.grammarCanContinue) this.grammarCanContinue = (i, s, bias) => inner.grammarCanContinue!(i, s, bias);
    if (inner.specialTokens) this.specialTokens = () => inner.specialTokens!();
  }

  /** Remember an add's prompt text (token prompts: their bytes as UTF-8), for crashOnPrompt / failOnPrompt. */
  noteAdd(m: AddMessage): void {
    const text = "text" in m.prompt ? m.prompt.text : Buffer.concat(m.prompt.tokens.map((t) => Buffer.from(this.inner.bytesOf(t)))).toString("utf8");
    this.promptText.set(m.id, text);
  }

  async decode(items: DecodeItem[], step: number, alongside?: () => Promise<void> | void): Promise<number[]> {
    const s = this.switches;
    if (this.once("crash", step, s.crashAtStep) || this.inBatch(items, s.crashOnPrompt)) {
      this.effects.injected("crash", step);
      this.effects.abort();
    }
    if (this.once("throw", step, s.throwAtStep)) {
      this.effects.injected("throw", step);
      throw new Error(`injected failure at step ${step}`);
    }
    if (this.inBatch(items, s.failOnPrompt)) {
      this.effects.injected("fail", step);
      throw new Error("injected failure: a poisoned request is in the batch");
    }
    if (this.once("hang", step, s.hangAtStep)) {
      this.effects.injected("hang", step);
      await new Promise<never>(() => undefined);
    }
    return this.inner.decode(items, step, alongside);
  }

  /** A step-keyed switch fires: first process, its step, not yet fired. */
  private once(kind: string, step: number, when: number | undefined): boolean {
    if (!this.firstProcess || when !== step || this.fired.has(kind)) return false;
    this.fired.add(kind);
    return true;
  }

  /** A request whose prompt contains `marker` is in the batch. */
  private inBatch(items: readonly DecodeItem[], marker: string | undefined): boolean {
    return marker !== undefined && items.some((it) => this.promptText.get(it.id)?.includes(marker));
  }

  // Everything else goes to the wrapped backend.
  get bosToken(): number | null | undefined {
    return this.inner.bosToken;
  }
  get eogTokens(): number[] {
    return this.inner.eogTokens;
  }
  get vocabSize(): number {
    return this.inner.vocabSize;
  }
  get overlapsDecode(): boolean | undefined {
    return this.inner.overlapsDecode;
  }
  get canRollBack(): boolean | undefined {
    return this.inner.canRollBack;
  }
  tokenize(text: string): number[] {
    return this.inner.tokenize(text);
  }
  bytesOf(token: number): Uint8Array {
    return this.inner.bytesOf(token);
  }
  isEndOfGeneration(token: number): boolean {
    return this.inner.isEndOfGeneration(token);
  }
  createSampler(cfg: SamplerConfig, history?: readonly number[]): SamplerHandle {
    return this.inner.createSampler(cfg, history);
  }
  sample(batchLogitIndex: number, sampler: SamplerHandle): Promise<number> {
    return this.inner.sample(batchLogitIndex, sampler);
  }
  clearSequence(slot: number): void {
    this.inner.clearSequence(slot);
  }
  readonly tokenLowerBound?: (text: string) => number;
  readonly sampleMany?: (batch: readonly SampleRequest[]) => (number | Error)[];
  readonly logprobs?: (batchLogitIndex: number, token: number, top: number) => Promise<RawLogprobs>;
  readonly trimSequence?: (slot: number, keep: number) => boolean;
  readonly compileGrammar?: (grammar: string, rule: string, prefix?: string) => CompiledGrammar;
  readonly createGrammarState?: (grammar: CompiledGrammar) => GrammarState;
  readonly grammarCanBeNext?: (state: GrammarState, token: number) => boolean;
  readonly grammarAccept?: (state: GrammarState, token: number) => void;
  readonly grammarIsComplete?: (state: GrammarState) => boolean;
  readonly grammarCanContinue?: (batchLogitIndex: number, state: GrammarState, bias: ReadonlyMap<number, number>) => Promise<boolean>;
  readonly specialTokens?: () => readonly { token: number; text: string }[];
}
