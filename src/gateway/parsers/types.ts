/**
 * The output-parser seam: a pure, incremental transformation of one choice's generated text (after stop strings)
 * into content, reasoning and tool calls. One instance per choice; the generation session feeds it and turns what
 * it returns into API deltas. Unary answers are the concatenation of the same deltas, so a stream and the unary
 * answer of the same generation always agree.
 */
import type { ReasoningParserName, ToolCall, ToolParserName, ToolSpec } from "../tools.js";

/**
 * A fragment of one tool call for streaming: the first fragment of a call carries `id` and `name` (as soon as the
 * name is certain), later ones the next piece of `arguments` as the model writes it.
 */
export interface ToolCallDelta {
  /** 0, 1, … in order of appearance within the choice. */
  index: number;
  id?: string;
  name?: string;
  /** The next piece of the arguments JSON text; all pieces of a call concatenate to its `arguments`. */
  arguments?: string;
}

/** What became certain after a `push` or at `finish`. Empty strings/arrays are omitted. */
export interface ParsedDelta {
  content?: string;
  reasoning?: string;
  toolCalls?: ToolCallDelta[];
}

/** The parsed whole of a choice, for unary answers and `finish_reason`. */
export interface ParsedOutput {
  content: string;
  /** null when the model produced no reasoning (the field is then omitted from the answer). */
  reasoning: string | null;
  toolCalls: ToolCall[];
}

export interface OutputParser {
  /** New generated text (any split, including inside tags); returns what can be emitted now. */
  push(text: string): ParsedDelta;
  /**
   * The generation ended ("length" = cut by max_tokens/capacity): flushes held-back text. A call left open after it
   * was announced stays a call, its arguments closed as produced; one not yet announced is content, raw
   * (documented in docs/agents.md).
   */
  finish(reason: "stop" | "length"): ParsedDelta;
  /** Everything parsed so far (after `finish`: the final answer). */
  result(): ParsedOutput;
}

/** What a choice's parser needs to know. */
export interface OutputParserOptions {
  /** Tool-call format, or null for none (no tools with parameters in the request, tool_choice none, or no flag). */
  toolParser: ToolParserName | null;
  /** The request's tools (names and schemas, e.g. to type qwen3coder parameter values). */
  tools: readonly ToolSpec[];
  /** Reasoning format, or null. */
  reasoningParser: ReasoningParserName | null;
  /** The rendered prompt already opened reasoning (it ends with `<think>`): output starts inside reasoning. */
  reasoningOpen: boolean;
  /** Tool-call id generator (`call_` + random by default; tests inject a counter). */
  newId?: () => string;
}
