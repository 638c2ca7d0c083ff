/**
 * The phase machine of one guided request (protocol `SamplingParams.guide`, docs/protocol.md "Guided generation").
 *
 * Driven only by the text of the tokens the request generates, so its state is a pure function of the generated
 * tokens: a resumed request replays its `generated` tokens through it and continues exactly. The step loop asks it,
 * between steps, which grammar state to attach to the request's sampler and which special tokens to ban; it never
 * changes while that sequence's sample runs.
 *
 *   free ──trigger matched──▶ rule(trigger.rule, then) ──complete, cannot continue──▶ free (then "free") | EOG (then "end")
 *   rule(start, gate) | free(start, gate) ──text = reasoning.open──▶ reasoning ──reasoning.close──▶ reasoning.after
 *   any ──replay rejected / grammar unusable / sampler masked everything──▶ off (guideDropped, reported once)
 *
 * All native grammar work goes through {@link GuideGrammar} (the llama.cpp adapter, or a fake in unit tests), which
 * guards the process-fatal hazards (an EOG or a rejected token is never fed to llama.cpp).
 */
import type { GuidePhase, GuideSpec, GuideTrigger } from "../../protocol/messages.js";
import type { CompiledGrammar, GrammarState } from "../backend.js";

/** What the guide needs from the backend's grammar support. */
export interface GuideGrammar {
  /** Compile `grammar` with root `rule`, preceded by the literal `prefix` when non-empty. @throws on a bad grammar. */
  compileGrammar(grammar: string, rule: string, prefix?: string): CompiledGrammar;
  createGrammarState(grammar: CompiledGrammar): GrammarState;
  grammarCanBeNext(state: GrammarState, token: number): boolean;
  /** Feed a replayed token (never EOG; canBeNext first). @throws when refused; the state is then dead. */
  grammarAccept(state: GrammarState, token: number): void;
  grammarIsComplete(state: GrammarState): boolean;
  bytesOf(token: number): Uint8Array;
  isEndOfGeneration(token: number): boolean;
}

/** One token of a free or reasoning phase: its text and where that text starts in the phase text (may be < 0). */
interface Piece {
  token: number;
  /** Offset of the token's first character in the phase text (negative when it began before the phase). */
  start: number;
  /** The token's text (as decoded in stream order). */
  text: string;
}

/** Where the request is. Transitions are the named methods of {@link GuideState}. */
export type GuideMachinePhase =
  | {
      kind: "free";
      /** Text generated since the free phase began (trigger matches are searched here). */
      text: string;
      /**
       * The start phase while `reasoning.open` may still be generated (after leading whitespace): a model that opens
       * reasoning itself must not have its triggers armed inside it (the parser reads that text as reasoning).
       */
      gate?: boolean;
      /** Tokens of that text, in order (to replay from the one holding a match start). */
      pieces: Piece[];
    }
  | {
      kind: "reasoning";
      /** Text generated since reasoning began (the close marker is searched here). */
      text: string;
      /** Tokens of that text, in order. */
      pieces: Piece[];
    }
  | {
      kind: "rule";
      rule: string;
      then: "free" | "end";
      /** The start phase while `reasoning.open` may still be generated instead (switches to reasoning on it). */
      gate: boolean;
      /** Text generated in this phase (compared with `reasoning.open` while gated). */
      text: string;
      /** Root prefix literal and tokens to replay when the grammar state is created lazily (before the first sample). */
      pending: { prefix: string; replay: number[] } | null;
      /** The grammar state (null until first needed). */
      grammar: GrammarState | null;
      /** Complete, cannot continue, then "end": only EOG may follow (EOG bans are lifted; the EOG ends the request). */
      ending: boolean;
    }
  | {
      kind: "off";
      /** Why the guide was dropped. */
      reason: string;
    };

/** Outcome of one step's decision before sampling (see {@link GuideState.prepare}). */
export interface GuideSampling {
  /** Grammar state to attach, or null (unconstrained). */
  grammar: GrammarState | null;
  /** Special tokens to ban (rule phases only). */
  bans: ReadonlySet<number>;
  /** True while only EOG may follow: EOG bans (ignore_eos, min_tokens) are lifted and the EOG ends the request. */
  ending: boolean;
}

/** No bans (free and reasoning phases). */
const NO_BANS: ReadonlySet<number> = new Set();

export class GuideState {
  /** Current phase (read-only outside; changed only through the named transitions). */
  get phase(): Readonly<GuideMachinePhase> {
    return this.current;
  }
  private current: GuideMachinePhase;
  /** Why the guide was dropped, until the step loop reports it (once). */
  private unreported: string | null = null;
  /** Incremental UTF-8 decoder of the generated text (a character split across tokens completes in the later one). */
  private readonly decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

  /** True while resumed tokens are replayed: a drop found then was already reported by the engine that ran them. */
  private replaying = false;

  /** @param bans special tokens banned in rule phases (control / user-defined, not EOG, not in spec.specialTokens). */
  constructor(
    private readonly spec: GuideSpec,
    private readonly grammar: GuideGrammar,
    private readonly bans: ReadonlySet<number>,
  ) {
    this.current = this.enter(spec.start, { gate: spec.start.kind !== "reasoning" && spec.reasoning !== undefined });
  }

  /** Special-token texts of a spec: the tokens among `specials` to ban in its rule phases. */
  static bansFor(spec: GuideSpec, specials: readonly { token: number; text: string }[]): ReadonlySet<number> {
    const allowed = new Set(spec.specialTokens ?? []);
    return new Set(specials.filter((s) => !allowed.has(s.text)).map((s) => s.token));
  }

  /** Special tokens banned in rule phases. */
  get bansInRules(): ReadonlySet<number> {
    return this.bans;
  }

  /** True in a rule phase (the sampler must be constrained). */
  get constrained(): boolean {
    return this.current.kind === "rule";
  }

  /** Why the guide was dropped, once (then undefined): the step loop puts it into RequestOutput.guideDropped. */
  takeDropped(): string | undefined {
    const r = this.unreported;
    this.unreported = null;
    return r ?? undefined;
  }

  /** The rule phase's grammar state, created (and replayed into) on first need; null when not constrained. */
  activeGrammar(): GrammarState | null {
    const p = this.current;
    if (p.kind !== "rule") return null;
    if (p.grammar === null) {
      const pending = p.pending ?? { prefix: "", replay: [] };
      p.pending = null;
      let state: GrammarState;
      try {
        state = this.grammar.createGrammarState(this.grammar.compileGrammar(this.spec.grammar, p.rule, pending.prefix));
      } catch (err) {
        this.drop(`the grammar could not be built for rule ${p.rule}: ${(err as Error).message}`);
        return null;
      }
      p.grammar = state;
      for (const t of pending.replay) {
        if (!this.replayInto(state, t)) {
          this.drop(`rule ${p.rule} rejected the generated text it was started on`);
          return null;
        }
      }
    }
    if (p.grammar.dead) {
      this.drop(`the grammar state of rule ${p.rule} failed`);
      return null;
    }
    return p.grammar;
  }

  /**
   * Before sampling: what the sampler gets. `canContinue` is asked only when the rule is complete (it needs the
   * step's logits: the adapter's probe; the loop answers true without probing where staying is harmless — `then:
   * "end"` with end-of-generation not banned, where the sampler itself picks EOG or a continuation); when it says no,
   * the phase ends (`then: "free"` → free, unconstrained this
   * very sample; `then: "end"` → only EOG may follow).
   */
  async prepare(canContinue: (state: GrammarState, then: "free" | "end") => Promise<boolean>): Promise<GuideSampling> {
    const grammar = this.activeGrammar();
    const p = this.current;
    if (p.kind !== "rule" || grammar === null) return { grammar: null, bans: NO_BANS, ending: false };
    if (!p.ending && this.grammar.grammarIsComplete(grammar) && !(await canContinue(grammar, p.then))) {
      if (p.then === "free") {
        this.ruleCompleted();
        return { grammar: null, bans: NO_BANS, ending: false };
      }
      p.ending = true;
    }
    return { grammar, bans: this.bans, ending: p.ending };
  }

  /**
   * After a token was sampled (the sampler already fed it into the attached grammar) or when replaying a resumed
   * token (`replayed`: fed here, with the same decisions the live run took; `isBanned` tells the request's bias bans at
   * that position).
   */
  onToken(token: number, replayed: { isBanned: (token: number) => boolean } | null = null): void {
    this.replaying = replayed !== null;
    try {
      this.feed(token, replayed);
    } finally {
      this.replaying = false;
    }
  }

  private feed(token: number, replayed: { isBanned: (token: number) => boolean } | null): void {
    const text = this.grammar.isEndOfGeneration(token) ? "" : this.decoder.decode(this.grammar.bytesOf(token), { stream: true });
    let p = this.current;
    if (p.kind === "rule" && replayed) {
      // A live run decided before this token whether the rule had ended: complete and no unbanned continuation.
      const state = this.activeGrammar();
      p = this.current;
      if (p.kind === "rule" && state) {
        const eog = this.grammar.isEndOfGeneration(token);
        const fits = !eog && !replayed.isBanned(token) && !this.bans.has(token) && this.grammar.grammarCanBeNext(state, token);
        if (!fits && this.grammar.grammarIsComplete(state)) {
          if (p.then === "free") this.ruleCompleted();
          else p.ending = true;
        } else if (!eog && !this.replayInto(state, token)) {
          this.drop(`rule ${p.rule} rejected a resumed token (the sampler masked everything in the original run)`);
        }
      }
      p = this.current;
      if (p.kind === "rule") return this.afterRuleToken(p, text);
    } else if (p.kind === "rule") {
      return this.afterRuleToken(p, text);
    }
    if (p.kind === "free" || p.kind === "reasoning") {
      p.pieces.push({ token, start: p.text.length, text });
      p.text += text;
      if (p.kind === "free" && p.gate && this.freeGate(p)) return;
      if (p.kind === "free") this.matchTriggers(p, text.length);
      else this.matchClose(p, text.length);
    }
  }

  /**
   * The sampler found every token masked in a rule phase (the grammar state is dead), or a grammar failure
   * happened: drop the guide for the rest of the request.
   */
  drop(reason: string): void {
    if (this.current.kind === "off") return; // reported once: the first reason stands
    this.current = { kind: "off", reason };
    if (!this.replaying) this.unreported = reason;
  }

  /** Rule text bookkeeping and the reasoning gate. */
  private afterRuleToken(p: Extract<GuideMachinePhase, { kind: "rule" }>, text: string): void {
    p.text += text;
    const reasoning = this.spec.reasoning;
    if (!p.gate || !reasoning) return;
    if (p.text === reasoning.open) return this.reasoningOpened();
    if (!reasoning.open.startsWith(p.text)) p.gate = false; // the body was chosen: the gate can no longer open
  }

  /**
   * The free start phase's reasoning gate: true when the text (after leading whitespace) opened reasoning — the
   * phase is then `reasoning`, fed the text behind the marker. Closes for good once the text cannot open it.
   */
  private freeGate(p: Extract<GuideMachinePhase, { kind: "free" }>): boolean {
    const open = this.spec.reasoning!.open;
    const t = p.text.trimStart();
    if (t.startsWith(open)) {
      const rest = t.slice(open.length);
      const r: Extract<GuideMachinePhase, { kind: "reasoning" }> = { kind: "reasoning", text: rest, pieces: [] };
      this.current = r;
      if (rest.length > 0) this.matchClose(r, rest.length);
      return true;
    }
    if (!open.startsWith(t)) p.gate = false;
    return false;
  }

  /** Transition: gated start rule → reasoning (the gate's grammar is discarded; not a drop). */
  private reasoningOpened(): void {
    this.current = { kind: "reasoning", text: "", pieces: [] };
  }

  /** Transition: rule complete and cannot continue, `then: "free"` → free (triggers re-armed, fresh free text). */
  private ruleCompleted(): void {
    this.current = { kind: "free", text: "", pieces: [] };
  }

  /** Enter a phase from a spec phase (start, or reasoning.after with no text to carry). */
  private enter(phase: GuidePhase, opts: { gate: boolean }): GuideMachinePhase {
    if (phase.kind === "rule") return { kind: "rule", rule: phase.rule, then: phase.then, gate: opts.gate, text: "", pending: null, grammar: null, ending: false };
    if (phase.kind === "reasoning") return { kind: "reasoning", text: "", pieces: [] };
    return { kind: "free", text: "", pieces: [], gate: opts.gate };
  }

  /**
   * Transition: start rule `rule` at offset `at` of the phase text of `p`: the root becomes literal(text of the
   * token holding `at`, before `at`) + rule, and the tokens from that one on are replayed into it (lazily, before
   * the next sample). A rejection there drops the guide.
   */
  private startRuleAt(p: { text: string; pieces: Piece[] }, at: number, rule: string, then: "free" | "end"): void {
    const k = p.pieces.findIndex((x) => x.start + x.text.length > at);
    const from = k < 0 ? p.pieces.length : k;
    const holder = p.pieces[from];
    const prefix = holder ? holder.text.slice(0, at - holder.start) : "";
    const replay = p.pieces.slice(from).map((x) => x.token);
    this.current = { kind: "rule", rule, then, gate: false, text: p.text.slice(at), pending: { prefix, replay }, grammar: null, ending: false };
  }

  /** Free phase: the first trigger in list order whose text appeared (searching only where new text can match). */
  private matchTriggers(p: Extract<GuideMachinePhase, { kind: "free" }>, added: number): void {
    for (const trigger of this.spec.triggers ?? []) {
      const at = matchTrigger(trigger, p.text, added);
      if (at !== null) return this.startRuleAt(p, at, trigger.rule, trigger.then ?? "free");
    }
  }

  /** Reasoning phase: the close marker ends it; `after` starts right behind the marker. */
  private matchClose(p: Extract<GuideMachinePhase, { kind: "reasoning" }>, added: number): void {
    const reasoning = this.spec.reasoning!;
    const from = Math.max(0, p.text.length - added - reasoning.close.length + 1);
    const at = p.text.indexOf(reasoning.close, from);
    if (at < 0) return;
    const end = at + reasoning.close.length;
    const after = reasoning.after;
    if (after.kind === "rule") return this.startRuleAt(p, end, after.rule, after.then);
    // Free (or reasoning again): the text behind the marker, with the pieces that hold it.
    const pieces = p.pieces.filter((x) => x.start + x.text.length > end).map((x) => ({ ...x, start: x.start - end }));
    this.current = after.kind === "free" ? { kind: "free", text: p.text.slice(end), pieces } : { kind: "reasoning", text: p.text.slice(end), pieces };
    if (this.current.kind === "free" && this.current.text.length > 0) this.matchTriggers(this.current, this.current.text.length);
  }

  /** Replay one token into a grammar state with the adapter's guards; false when refused. */
  private replayInto(state: GrammarState, token: number): boolean {
    if (this.grammar.isEndOfGeneration(token) || !this.grammar.grammarCanBeNext(state, token)) return false;
    try {
      this.grammar.grammarAccept(state, token);
      return true;
    } catch {
      return false;
    }
  }
}

/**
 * Offset where `trigger` matches the free text, or null. `atStart`: only at the start after optional whitespace.
 * Otherwise only a match that ends in the `added` newest characters is new (earlier ones were already checked).
 */
export function matchTrigger(trigger: GuideTrigger, text: string, added: number): number | null {
  if (trigger.atStart) {
    const ws = /^\s*/.exec(text)![0].length;
    return text.startsWith(trigger.text, ws) ? ws : null;
  }
  const from = Math.max(0, text.length - added - trigger.text.length + 1);
  const at = text.indexOf(trigger.text, from);
  return at < 0 ? null : at;
}
