/**
 * The typed event stream of one generation session (src/gateway/requests/session/session.ts) — what every API encoder
 * (chat, completions, responses) turns into its wire shape. The session never writes to a client and never calls
 * the request table; it returns these events and the aborts the model's request path applies after the step.
 */
import type { KeelHttpError } from "../../http/errors.js";
import type { ToolCallDelta } from "../../parsers/types.js";
import type { Usage } from "../events.js";
import type { ToolCall } from "../../tools.js";

/** One generated token's log probability as the APIs show it. */
export interface TokenLogprobView {
  /** Token text: its bytes decoded as UTF-8, an incomplete character as U+FFFD (what OpenAI does). */
  token: string;
  logprob: number;
  /** The token's raw bytes, or null when the engine did not report them. */
  bytes: number[] | null;
}

/** Log probabilities at one generated position: the sampled token and the most likely alternatives. */
export interface PositionLogprobView extends TokenLogprobView {
  top: TokenLogprobView[];
}

/**
 * How one choice ended, as the APIs report it: `tool_calls` = it stopped (EOS or a stop string) after at least one
 * parsed tool call; a cut by the token budget stays `length` even with calls (as OpenAI and OVMS).
 */
export type ChoiceFinishReason = "stop" | "length" | "tool_calls";

/**
 * Events, in order: `started` once (the engine admitted the first child), then per choice any number of `delta`s
 * followed by one `choice_finished`, and finally exactly one of `finished` / `failed`. Nothing follows `finished`
 * or `failed`. With output parsers (chat with `--reasoning_parser` / tools), `content` is the parsed content and a delta
 * may carry `reasoning` and `toolCalls` too; without them `content` is the text itself.
 */
export type SessionEvent =
  | { type: "started" }
  | {
      type: "delta";
      /** Choice index (0..n-1). */
      index: number;
      /** Output text that is final (stop strings and held-back UTF-8 already resolved); may be "". */
      content: string;
      /** Logprobs of the tokens generated since the previous delta of this choice (when requested). */
      logprobs: PositionLogprobView[];
      /** Reasoning text that became certain (reasoning parser); absent when none. */
      reasoning?: string;
      /** Tool-call fragments that became certain (tool parser); absent when none. */
      toolCalls?: ToolCallDelta[];
    }
  | { type: "choice_finished"; index: number; reason: ChoiceFinishReason }
  | { type: "finished"; usage: Usage; choices: ChoiceResult[] }
  | { type: "failed"; error: KeelHttpError };

/** What one choice produced in total (for unary answers and the `.done` events of the Responses API). */
export interface ChoiceResult {
  index: number;
  /** The output text; with output parsers, the content outside reasoning and tool calls. */
  text: string;
  /** Reasoning (reasoning parser), or null when there was none. */
  reasoning: string | null;
  /** Parsed tool calls (tool parser); [] when none. */
  toolCalls: ToolCall[];
  reason: ChoiceFinishReason;
  /** The stop string that ended this choice (Anthropic's `stop_sequence`); absent when it ended otherwise. */
  stopSequence?: string;
  logprobs: PositionLogprobView[];
  completionTokens: number;
}

/** What a session step returns: events for the encoder, and engine requests the route must abort. */
export interface SessionStep {
  events: SessionEvent[];
  /** Child request ids to cancel in the registry (a stop string matched, a sibling failed, the client left). */
  abort: string[];
}
