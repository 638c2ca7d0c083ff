/**
 * One generation session per admitted HTTP request, held by the output processor (../output-processor.ts) as the
 * request's state: it owns everything between the request table's per-child events and an API encoder — the `n` children (one engine request per choice), stop strings (and
 * `include_stop_str_in_output`), text accumulation for unary answers, logprob views, usage summed over children,
 * and the request's end (all children finished, one failed, or the client left).
 *
 * It is a pure state machine: each input (admitted / output / finish / clientGone) returns a {@link SessionStep}
 * — the events to encode and the child ids to abort, which the model's request path applies after the step. It
 * never calls the table back (control does not go back up a layer), which is what makes it testable with plain
 * inputs.
 */
import type { PositionLogprobs, TokenLogprob } from "../../../protocol/messages.js";
import { engineError, type KeelHttpError } from "../../http/errors.js";
import type { FinishReason } from "../lifecycle.js";
import type { Usage } from "../events.js";
import type { OutputParser, ParsedDelta } from "../../parsers/types.js";
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
  /**
   * Makes one output parser per choice (reasoning / tool calls, chat only): it reads the text after stop strings,
   * and the deltas and the unary answer come from what it returns. Absent = the text is the content.
   */
  parser?: () => OutputParser;
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
  /** Output text emitted so far (after stop handling; before the output parser). */
  text: string;
  /** This choice's output parser, or null when the request has none. */
  readonly parser: OutputParser | null;
  /** Every logprob view emitted so far (for unary answers). */
  readonly logprobs: PositionLogprobView[];
  /** Tokens the engine generated for this choice (completion tokens, counted even past a stop string). */
  tokens: number;
  /** Prompt tokens reported for this child (the same prompt for every child). */
  promptTokens: number;
}

/**
 * Session state: `open` while choices generate; `ended` after `finished`, `failed` or the client leaving — from
 * then on every input returns nothing (late events are ignored: docs/design-rules.md, "Late events").
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

/** Two consecutive parser outputs as one (text concatenated, tool-call fragments in order). */
function merge(a: ParsedDelta, b: ParsedDelta): ParsedDelta {
  const out: ParsedDelta = {};
  const content = (a.content ?? "") + (b.content ?? "");
  const reasoning = (a.reasoning ?? "") + (b.reasoning ?? "");
  const toolCalls = [...(a.toolCalls ?? []), ...(b.toolCalls ?? [])];
  if (content.length > 0) out.content = content;
  if (reasoning.length > 0) out.reasoning = reasoning;
  if (toolCalls.length > 0) out.toolCalls = toolCalls;
  return out;
}

/** The delta event for what became certain, or null when there is nothing (no text, no fragments, no logprobs). */
function deltaEvent(index: number, d: ParsedDelta, logprobs: PositionLogprobView[]): SessionEvent | null {
  const content = d.content ?? "";
  const hasReasoning = d.reasoning !== undefined && d.reasoning.length > 0;
  const hasCalls = d.toolCalls !== undefined && d.toolCalls.length > 0;
  if (content.length === 0 && !hasReasoning && !hasCalls && logprobs.length === 0) return null;
  return {
    type: "delta",
    index,
    content,
    logprobs,
    ...(hasReasoning ? { reasoning: d.reasoning! } : {}),
    ...(hasCalls ? { toolCalls: d.toolCalls! } : {}),
  };
}

/** A choice that stopped after at least one parsed tool call finished with `tool_calls`; `length` always wins. */
function finishReason(c: Choice, cut: "stop" | "length"): ChoiceFinishReason {
  if (cut === "stop" && c.parser && c.parser.result().toolCalls.length > 0) return "tool_calls";
  return cut;
}

/** Text, reasoning and tool calls of a choice for the unary answer. */
function parsedResult(c: Choice): Pick<ChoiceResult, "text" | "reasoning" | "toolCalls"> {
  if (!c.parser) return { text: c.text, reasoning: null, toolCalls: [] };
  const r = c.parser.result();
  return { text: r.content, reasoning: r.reasoning, toolCalls: r.toolCalls };
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
      parser: opts.parser ? opts.parser() : null,
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

  /**
   * New tokens of child `id` and the text they completed (the engine holds incomplete UTF-8 back); `textEnds`: where
   * each token's text ends when there are several (protocol RequestOutput.textEnds).
   */
  output(id: string, tokens: readonly number[], text: string, logprobs?: readonly PositionLogprobs[], textEnds?: readonly number[]): SessionStep {
    const c = this.#byId.get(id);
    if (!c || this.#state.state !== "open" || c.status.state === "done") return NOTHING;
    const events: SessionEvent[] = this.#startIfNeeded();
    // 1. Token by token where the engine said where each one's text ends (a speculative step), else all at once:
    //    count the tokens and match stop strings — once min_tokens tokens were generated; before that the text goes
    //    out as it is. Tokens after the one that completed a stop string are not completion tokens.
    let emit = "";
    let stopped = false;
    let counted = 0;
    for (const [piece, n] of tokenPieces(tokens.length, text, textEnds)) {
      c.tokens += n;
      counted += n;
      const r = c.tokens < (this.#opts.minTokens ?? 0) ? { emit: piece, stopped: false } : c.stop.push(piece);
      emit += r.emit;
      if ((stopped = r.stopped)) break;
    }
    // 2. The logprob views of the counted tokens (sent with this step's text).
    const views = this.#opts.logprobs && logprobs ? logprobs.slice(0, counted).map(positionView) : [];
    c.logprobs.push(...views);
    const r = { emit, stopped };
    let content = r.emit;
    if (r.stopped && this.#opts.includeStopStr) content += c.stop.matched ?? "";
    c.text += content;
    // 3. The output parser (if any) turns the text into content / reasoning / tool-call fragments; a stop string
    //    ends the text, so the parser flushes what it held back.
    const parsed = c.parser ? merge(c.parser.push(content), r.stopped ? c.parser.finish("stop") : {}) : { content };
    const delta = deltaEvent(c.index, parsed, views);
    if (delta) events.push(delta);
    if (!r.stopped) return { events, abort: [] };
    // 4. A stop string matched: this choice ends now with "stop"; its engine request must be aborted, or the engine
    //    would keep generating for nobody until max_tokens.
    const reason = finishReason(c, "stop");
    c.status = { state: "done", reason };
    events.push({ type: "choice_finished", index: c.index, reason });
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
    const cut = reason === "length" ? "length" : "stop";
    const parsed = c.parser ? merge(c.parser.push(tail), c.parser.finish(cut)) : { content: tail };
    const delta = deltaEvent(c.index, parsed, []);
    if (delta) events.push(delta);
    const why = finishReason(c, cut);
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
      ...parsedResult(c),
      reason: c.status.state === "done" ? c.status.reason : "stop",
      ...(c.stop.matched !== null ? { stopSequence: c.stop.matched } : {}),
      logprobs: c.logprobs,
      completionTokens: c.tokens,
    }));
    return [{ type: "finished", usage: { promptTokens, completionTokens }, choices }];
  }
}

/**
 * An output's text as [piece, tokens] units: one per token where `textEnds` says where each token's text ends (the
 * rest of the text, a finished request's flushed bytes, goes with the last), else the whole text with every token.
 */
function tokenPieces(tokens: number, text: string, textEnds: readonly number[] | undefined): [string, number][] {
  if (!textEnds || tokens < 2 || textEnds.length !== tokens) return [[text, tokens]];
  return textEnds.map((end, k) => [text.slice(k === 0 ? 0 : textEnds[k - 1], k === tokens - 1 ? text.length : end), 1]);
}
