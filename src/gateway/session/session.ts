/**
 * One generation session per admitted HTTP request: it owns everything between the registry's per-request events
 * and an API encoder — the `n` children (one engine request per choice), stop strings (and
 * `include_stop_str_in_output`), text accumulation for unary answers, logprob views, usage summed over children,
 * and the request's end (all children finished, one failed, or the client left).
 *
 * It is a pure state machine: each input (admitted / output / finish / clientGone) returns a {@link SessionStep}
 * — the events to encode and the child ids the route must cancel in the registry. It never calls the registry
 * back (issue #8: control does not go back up a layer), which is what makes it testable with plain inputs.
 */
import type { PositionLogprobs, TokenLogprob } from "../../protocol/messages.js";
import { engineError, type KeelHttpError } from "../errors.js";
import type { FinishReason } from "../lifecycle.js";
import type { Usage } from "../registry.js";
import { StopMatcher } from "../stop-strings.js";
import type { ChoiceFinishReason, ChoiceResult, PositionLogprobView, SessionEvent, SessionStep, TokenLogprobView } from "./events.js";

/** What a session needs to know about its request. */
export interface SessionOptions {
  /** Engine request id of each child, in choice order (length = n). */
  childIds: readonly string[];
  /** Prompt index of each child (completions with a list of prompts); absent = one prompt for all. */
  promptOf?: readonly number[];
  /** Stop strings (OpenAI `stop`); matched in the detokenised text of each choice independently. */
  stop: readonly string[];
  /** Keep the matched stop string at the end of the output (vLLM's `include_stop_str_in_output`). */
  includeStopStr: boolean;
  /** Logprobs were requested: turn the engine's entries into views (else they are ignored). */
  logprobs: boolean;
  /** `min_tokens`: stop strings are not matched until a choice generated this many tokens (vLLM). Absent = 0. */
  minTokens?: number;
}

/**
 * Lifecycle of one choice: `waiting` (not admitted), `generating`, `done` with its reason. A choice that was
 * stopped by a stop string is `done` at once; its engine request is aborted by the route.
 */
type ChoiceState = { state: "waiting" } | { state: "generating" } | { state: "done"; reason: ChoiceFinishReason };

/** Per-choice record. */
interface Choice {
  readonly id: string;
  readonly index: number;
  /** Where the choice is (see {@link ChoiceState}). */
  status: ChoiceState;
  /** Stop-string matcher over this choice's text; holds back a possible stop-string prefix. */
  readonly stop: StopMatcher;
  /** Output text emitted so far (after stop handling). */
  text: string;
  /** Every logprob view emitted so far (for unary answers). */
  readonly logprobs: PositionLogprobView[];
  /** Tokens the engine generated for this choice (completion tokens, counted even past a stop string). */
  tokens: number;
  /** Prompt tokens reported for this child (the same prompt for every child). */
  promptTokens: number;
}

/**
 * Session state: `open` while choices generate; `ended` after `finished`, `failed` or the client leaving — from
 * then on every input returns nothing (late engine events are ignored, docs/design-rules.md rule 5).
 */
type SessionState = { state: "open"; started: boolean } | { state: "ended"; how: "finished" | "failed" | "client_gone" };

const NOTHING: SessionStep = Object.freeze({ events: [], abort: [] }) as SessionStep;
const utf8 = new TextDecoder("utf-8", { fatal: false });

/** The view of one engine token logprob: text decoded from its bytes (U+FFFD for a partial character). */
export function tokenView(t: TokenLogprob): TokenLogprobView {
  if (!t.bytes) return { token: `token_id:${t.token}`, logprob: t.logprob, bytes: null };
  return { token: utf8.decode(Uint8Array.from(t.bytes)), logprob: t.logprob, bytes: [...t.bytes] };
}

function positionView(p: PositionLogprobs): PositionLogprobView {
  return { ...tokenView(p), top: p.top.map(tokenView) };
}

export class GenerationSession {
  /** The choices, by index. */
  readonly #choices: Choice[];
  /** Child id → choice. */
  readonly #byId = new Map<string, Choice>();
  /** The request's options (children, stop strings, logprobs). */
  readonly #opts: SessionOptions;
  /** Where the session is (see {@link SessionState}). */
  #state: SessionState = { state: "open", started: false };

  constructor(opts: SessionOptions) {
    if (opts.childIds.length === 0) throw new Error("a session needs at least one child");
    this.#opts = opts;
    this.#choices = opts.childIds.map((id, index) => ({
      id,
      index,
      status: { state: "waiting" },
      stop: new StopMatcher(opts.stop),
      text: "",
      logprobs: [],
      tokens: 0,
      promptTokens: 0,
    }));
    for (const c of this.#choices) this.#byId.set(c.id, c);
  }

  /** True once the session emitted `finished` or `failed`, or the client left. */
  get ended(): boolean {
    return this.#state.state === "ended";
  }

  /** The engine admitted child `id` (its prefill starts) with a prompt of `promptTokens` tokens. */
  admitted(id: string, promptTokens: number): SessionStep {
    const c = this.#byId.get(id);
    if (!c || this.#state.state !== "open") return NOTHING;
    c.promptTokens = promptTokens;
    if (c.status.state === "waiting") c.status = { state: "generating" };
    if (this.#state.started) return NOTHING;
    this.#state = { state: "open", started: true };
    return { events: [{ type: "started" }], abort: [] };
  }

  /** New tokens of child `id` and the text they completed (the engine holds incomplete UTF-8 back). */
  output(id: string, tokens: readonly number[], text: string, logprobs?: readonly PositionLogprobs[]): SessionStep {
    const c = this.#byId.get(id);
    if (!c || this.#state.state !== "open" || c.status.state === "done") return NOTHING;
    const events: SessionEvent[] = this.#startIfNeeded();
    // 1. Count the tokens and build their logprob views (sent with this step's text).
    c.tokens += tokens.length;
    const views = this.#opts.logprobs && logprobs ? logprobs.map(positionView) : [];
    c.logprobs.push(...views);
    // 2. Stop strings: emit what is certain, hold back a possible stop-string prefix — once min_tokens tokens were
    //    generated; before that the text goes out as it is.
    const r = c.tokens < (this.#opts.minTokens ?? 0) ? { emit: text, stopped: false } : c.stop.push(text);
    let content = r.emit;
    if (r.stopped && this.#opts.includeStopStr) content += c.stop.matched ?? "";
    c.text += content;
    if (content.length > 0 || views.length > 0) events.push({ type: "delta", index: c.index, content, logprobs: views });
    if (!r.stopped) return { events, abort: [] };
    // 3. A stop string matched: this choice ends now with "stop"; its engine request must be aborted, or the engine
    //    would keep generating for nobody until max_tokens.
    c.status = { state: "done", reason: "stop" };
    events.push({ type: "choice_finished", index: c.index, reason: "stop" });
    events.push(...this.#finishIfAllDone());
    return { events, abort: [c.id] };
  }

  /**
   * Child `id` ended in the engine. A finish with "error" fails the whole request (the other children are aborted);
   * "abort" from the engine's side (not asked for by this session) is treated like an error.
   */
  finish(id: string, reason: FinishReason, usage: Usage, error?: { message: string; httpError?: KeelHttpError }): SessionStep {
    const c = this.#byId.get(id);
    if (!c || this.#state.state !== "open" || c.status.state === "done") return NOTHING;
    if (usage.promptTokens > 0) c.promptTokens = usage.promptTokens;
    // The registry's count is authoritative (it includes tokens generated before an engine restart).
    c.tokens = Math.max(c.tokens, usage.completionTokens);
    if (reason === "error" || reason === "abort") {
      c.status = { state: "done", reason: "stop" };
      return this.#fail(error?.httpError ?? engineError(error?.message ?? "the request was aborted by the engine"));
    }
    const events: SessionEvent[] = this.#startIfNeeded();
    // The held-back tail is output now: no stop string can complete any more.
    const tail = c.stop.flush();
    c.text += tail;
    if (tail.length > 0) events.push({ type: "delta", index: c.index, content: tail, logprobs: [] });
    const why: ChoiceFinishReason = reason === "length" ? "length" : "stop";
    c.status = { state: "done", reason: why };
    events.push({ type: "choice_finished", index: c.index, reason: why });
    events.push(...this.#finishIfAllDone());
    return { events, abort: [] };
  }

  /** The request failed before or outside the engine (e.g. shutdown): fail it and abort every live child. */
  fail(error: KeelHttpError): SessionStep {
    if (this.#state.state !== "open") return NOTHING;
    return this.#fail(error);
  }

  /** The client left: every child still in the engine is released (vLLM #14326: no orphaned siblings). */
  clientGone(): SessionStep {
    if (this.#state.state !== "open") return NOTHING;
    this.#state = { state: "ended", how: "client_gone" };
    return { events: [], abort: this.#liveIds() };
  }

  /** Ids of the children that have not ended. */
  #liveIds(): string[] {
    return this.#choices.filter((c) => c.status.state !== "done").map((c) => c.id);
  }

  #fail(error: KeelHttpError): SessionStep {
    const abort = this.#liveIds();
    this.#state = { state: "ended", how: "failed" };
    return { events: [{ type: "failed", error }], abort };
  }

  /** A choice can produce output or finish without an admission being seen (e.g. a resumed child): start first. */
  #startIfNeeded(): SessionEvent[] {
    if (this.#state.state !== "open" || this.#state.started) return [];
    this.#state = { state: "open", started: true };
    return [{ type: "started" }];
  }

  #finishIfAllDone(): SessionEvent[] {
    if (this.#choices.some((c) => c.status.state !== "done")) return [];
    this.#state = { state: "ended", how: "finished" };
    // Each prompt is counted once (its `n` children share it), completions summed — as OpenAI reports `n`.
    const perPrompt = new Map<number, number>();
    for (const c of this.#choices) {
      const p = this.#opts.promptOf?.[c.index] ?? 0;
      perPrompt.set(p, Math.max(perPrompt.get(p) ?? 0, c.promptTokens));
    }
    const promptTokens = [...perPrompt.values()].reduce((s, t) => s + t, 0);
    const completionTokens = this.#choices.reduce((s, c) => s + c.tokens, 0);
    const choices: ChoiceResult[] = this.#choices.map((c) => ({
      index: c.index,
      text: c.text,
      reason: c.status.state === "done" ? c.status.reason : "stop",
      logprobs: c.logprobs,
      completionTokens: c.tokens,
    }));
    return [{ type: "finished", usage: { promptTokens, completionTokens }, choices }];
  }
}
