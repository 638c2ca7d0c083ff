/**
 * What a chat request says about tools and structured output, after validation (chat-request.ts) — the one
 * vocabulary shared by the chat template, the output parsers (parsers/) and the guide builder (guided/).
 */

/** One function tool (OpenAI nested `{type:"function",function:{…}}` and OVMS flat `{type:"function",name,…}`). */
export interface ToolSpec {
  name: string;
  description?: string;
  /** JSON schema of the arguments (an object schema); absent = the tool takes no declared parameters. */
  parameters?: Record<string, unknown>;
  /** OpenAI `strict`: arguments must match the schema exactly (Keel guides them either way when guidance is on). */
  strict?: boolean;
}

/**
 * `tool_choice`: `none` (no tool parsing; tools are not rendered), `auto` (the model decides), `required` (at least
 * one call), or one named function (exactly that tool).
 */
export type ToolChoice = { kind: "none" } | { kind: "auto" } | { kind: "required" } | { kind: "function"; name: string };

/**
 * The one output constraint of a request: free text, any JSON object, JSON matching a schema (`response_format`,
 * vLLM's `structured_outputs.json`), the full match of a regex, exactly one of a list of strings, or the language of
 * a GBNF grammar (`structured_outputs` regex / choice / grammar, llama.cpp's `grammar`). `field` names the request
 * field it came from, for the 400s about it (absent on the json kinds: `response_format`).
 */
export type ResponseFormat =
  | { kind: "text" }
  | { kind: "json_object"; field?: string }
  | { kind: "json_schema"; name: string; schema: Record<string, unknown>; strict: boolean; field?: string }
  | { kind: "regex"; pattern: string; field: string }
  | { kind: "choice"; choices: readonly string[]; field: string }
  | { kind: "grammar"; grammar: string; field: string };

/** A tool call as the API returns it (unary `message.tool_calls[i]`). `arguments` is a JSON text. */
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** Tool-call output formats Keel parses and guides (`--tool_parser`). */
export const TOOL_PARSERS = ["hermes3", "qwen3coder", "llama3"] as const;
export type ToolParserName = (typeof TOOL_PARSERS)[number];

/** Reasoning output formats (`--reasoning_parser`). */
export const REASONING_PARSERS = ["qwen3"] as const;
export type ReasoningParserName = (typeof REASONING_PARSERS)[number];
