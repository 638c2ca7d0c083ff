/**
 * # Output parsers
 *
 * One parser per choice turns generated text (after stop strings) into content, reasoning and tool calls,
 * incrementally: each `push` returns what became certain, holding back only text that could still turn into a tag
 * (the longest suffix that is a prefix of one) or, at the start, a possible bare JSON call. The deltas of all
 * `push`es and `finish` concatenate to `result()` for any split of the text — a stream and the unary answer of the
 * same generation always agree.
 *
 * Stages: the reasoning parser first (`--reasoning_parser qwen3`: `<think>…</think>`, see reasoning-qwen3.ts),
 * then the tool parser (`--tool_parser`) on the rest.
 *
 * | format | markup | file |
 * | --- | --- | --- |
 * | hermes3 | `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, several | hermes3.ts |
 * | qwen3coder | `<tool_call><function=N><parameter=P>V</parameter></function></tool_call>` (+ `\n`) | qwen3coder.ts |
 * | llama3 | `<|python_tag|>` (optional) + `{"name": …, "parameters": {…}}`, `;`-separated | llama3.ts |
 *
 * Streaming shape: a call's first delta `{index, id, name}` comes as soon as its name is certain (hermes3: its
 * `"name"` string closed; llama3: the same after `<|python_tag|>`; qwen3coder: its first `<parameter=` or its
 * `</function>`), then `{index, arguments}` fragments as the model writes them. Stages report call events
 * (stage.ts) and this parser records what it emits, so the unary `arguments` is the concatenation of the fragments
 * by construction. The arguments are compact JSON: hermes3/llama3 re-write the arguments object while it arrives
 * (compact-json.ts, json-call-reader.ts); qwen3coder writes `{"P":…}` as parameters arrive, a string value as
 * JSON-string fragments (streamed-parameter.ts), typed values whole when they close. A bare call object at the start
 * of the output (hermes3, llama3: no tag) streams the same way once its name is a declared tool; a bare list or a
 * fenced call is a call only as the whole output, so it is reported whole at `finish`.
 *
 * What is lenient (beyond OVMS), and what is kept:
 * - Content before, between and after calls is kept, in streams too (OVMS drops text after the first call when
 *   streaming, and qwen3coder text sharing a chunk with the tag). Whitespace touching only calls and the ends of
 *   the output is dropped (content-gaps.ts).
 * - Bare calls (hermes3, llama3) — Qwen2.5-Coder-0.5B and 1.5B answer so: an output starting with
 *   `{"name": <declared tool>, …` is a call from its name on (several separated by `;`; text after them is
 *   content); a whole output (trimmed) that is a list of calls, OpenAI's wrapper shape, or a call in a ```json
 *   fence is a call too. A candidate is held while it could still be one and released as content as soon as it
 *   cannot (a key no call has, an undeclared name).
 * - `"parameters"` is accepted for `"arguments"` and vice versa; arguments given as a JSON text are parsed.
 * - What Qwen3.x models emit (test/support/parsers/qwen3-corpus.ts): a call from an unterminated `<think>` is a
 *   call (reasoning-qwen3.ts holds text from a call opener inside the block; `finish` offers it to a fresh tool
 *   stage); markup inside a ``` fence is quoted text; a repeated `</tool_call>` is dropped; a missing
 *   `</tool_call>`, `<tool_call>`, `</function>` or `</parameter>` is read as meant where unambiguous.
 * - Malformed markup never aborts the stream. Before a call is announced it stays in content as the raw text (no
 *   call, no error); after, the call ends where the markup broke (arguments closed as produced) and the rest is
 *   content. OVMS ends the stream with an error mid-way.
 *
 * Truncation (`finish("length")`, or a model that stopped mid-call): a call already announced stays a call, its
 * arguments closed into a valid JSON object as far as they were produced (an open string and containers closed, a
 * number or key still being written dropped); `finish_reason` stays `length` (the session decides it). A call not
 * yet announced is content, raw. With `finish("stop")` a hermes3 body read whole (not the streamed shape) that is a
 * complete call counts even without its `</tool_call>`.
 *
 * @module
 */
import { randomInt } from "node:crypto";
import type { ToolCall, ToolParserName } from "../tools.js";
import { Hermes3Stage } from "./hermes3.js";
import { Llama3Stage } from "./llama3.js";
import { Qwen3CoderStage } from "./qwen3coder.js";
import { Qwen3Reasoning } from "./reasoning-qwen3.js";
import type { CallEvent, ToolStage } from "./stage.js";
import type { OutputParser, OutputParserOptions, ParsedDelta, ParsedOutput, ToolCallDelta } from "./types.js";

export type { OutputParser, OutputParserOptions, ParsedDelta, ParsedOutput, ToolCallDelta } from "./types.js";

const ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/** `call_` + 24 random alphanumerics (vLLM's length; OpenAI's ids look alike). */
export function randomToolCallId(): string {
  let id = "call_";
  for (let i = 0; i < 24; i++) id += ID_ALPHABET[randomInt(ID_ALPHABET.length)];
  return id;
}

/** A parser for one choice. */
export function createOutputParser(opts: OutputParserOptions): OutputParser {
  return new ComposedParser(opts);
}

/**
 * `--tool_parser auto`: the format the model's chat template asks for, or null when it shows none.
 * qwen3coder's XML also uses `<tool_call>`, so it is checked first.
 */
export function pickToolParser(chatTemplate: string | null): ToolParserName | null {
  if (chatTemplate === null) return null;
  const has = (s: string) => chatTemplate.includes(s);
  if (has("<tool_call>") && has("<function=") && has("<parameter=")) return "qwen3coder";
  if (has("<tool_call>")) return "hermes3";
  // Llama 3.1+: the python tag, or the ipython tool role / JSON-call instructions inside llama-3 headers.
  if (has("<|python_tag|>")) return "llama3";
  if (has("<|start_header_id|>") && (has("ipython") || has('"parameters"'))) return "llama3";
  return null;
}

/** True when the rendered prompt opens reasoning itself: right-trimmed, it ends with `<think>`. */
export function promptOpensReasoning(prompt: string): boolean {
  return prompt.trimEnd().endsWith("<think>");
}

/** The tags that open a call in a format (held inside reasoning: see reasoning-qwen3.ts). */
function callOpeners(format: ToolParserName | null): string[] {
  switch (format) {
    case "hermes3":
      return ["<tool_call>"];
    case "qwen3coder":
      return ["<tool_call>", "<function="];
    case "llama3":
      return ["<|python_tag|>"];
    case null:
      return [];
  }
}

/** The tool stage for a format. */
function toolStage(opts: OutputParserOptions): ToolStage | null {
  switch (opts.toolParser) {
    case "hermes3":
      return new Hermes3Stage(opts.tools);
    case "qwen3coder":
      return new Qwen3CoderStage(opts.tools);
    case "llama3":
      return new Llama3Stage(opts.tools);
    case null:
      return null;
  }
}

/** Reasoning stage, then tool stage; numbers the calls and keeps the running result. */
class ComposedParser implements OutputParser {
  /** The reasoning stage, or null without `--reasoning_parser`. */
  readonly #reasoning: Qwen3Reasoning | null;
  /** The tool stage, or null when the request has no tool parsing. */
  readonly #tools: ToolStage | null;
  /** Makes call ids. */
  readonly #newId: () => string;
  /** The options (a second tool stage reads text held inside an unterminated reasoning block). */
  readonly #opts: OutputParserOptions;
  /** Content emitted so far. */
  #content = "";
  /** Reasoning emitted so far. */
  #reasoningText = "";
  /** Calls emitted so far, in order (their position is their `index`). */
  readonly #calls: ToolCall[] = [];
  /** Set by `finish`: later calls return nothing. */
  #finished = false;

  constructor(opts: OutputParserOptions) {
    this.#reasoning = opts.reasoningParser === "qwen3" ? new Qwen3Reasoning(opts.reasoningOpen, callOpeners(opts.toolParser)) : null;
    this.#tools = toolStage(opts);
    this.#opts = opts;
    this.#newId = opts.newId ?? randomToolCallId;
  }

  push(text: string): ParsedDelta {
    if (this.#finished || text === "") return {};
    const split = this.#reasoning ? this.#reasoning.push(text) : { reasoning: "", rest: text };
    const stage = this.#tools ? this.#tools.push(split.rest) : { content: split.rest, calls: [] };
    return this.#emit(split.reasoning, stage.content, stage.calls);
  }

  finish(reason: "stop" | "length"): ParsedDelta {
    if (this.#finished) return {};
    this.#finished = true;
    // 1. The reasoning stage flushes first: what it held may be text for the tool stage.
    const split = this.#reasoning ? this.#reasoning.finish() : { reasoning: "", rest: "", held: "" };
    if (!this.#tools) return this.#emit(split.reasoning + split.held, split.rest, []);
    // 2. A call opener inside a block that never closed: a call when a tool stage finds one in the held text
    //    (reasoning ended at the opener), else reasoning. The tool stage has seen nothing yet (all was reasoning).
    if (split.held !== "") {
      const trial = toolStage(this.#opts)!;
      const pushed = trial.push(split.held);
      const flushed = trial.finish(reason);
      if (pushed.calls.length + flushed.calls.length > 0) {
        return this.#emit(split.reasoning, pushed.content + flushed.content, [...pushed.calls, ...flushed.calls]);
      }
    }
    // 3. Then the tool stage reads the rest and flushes in turn.
    const pushed = this.#tools.push(split.rest);
    const flushed = this.#tools.finish(reason);
    return this.#emit(split.reasoning + split.held, pushed.content + flushed.content, [...pushed.calls, ...flushed.calls]);
  }

  result(): ParsedOutput {
    return {
      content: this.#content,
      reasoning: this.#reasoningText === "" ? null : this.#reasoningText,
      toolCalls: this.#calls.map((c) => ({ ...c })),
    };
  }

  /**
   * Records and shapes one delta (empty parts omitted). A `start` event opens call `index` with its id and name;
   * `args` events append to the latest call, consecutive ones joined into one fragment.
   */
  #emit(reasoning: string, content: string, calls: readonly CallEvent[]): ParsedDelta {
    const delta: ParsedDelta = {};
    if (reasoning !== "") {
      this.#reasoningText += reasoning;
      delta.reasoning = reasoning;
    }
    if (content !== "") {
      this.#content += content;
      delta.content = content;
    }
    const deltas: ToolCallDelta[] = [];
    for (const e of calls) {
      if (e.kind === "start") {
        const index = this.#calls.length;
        const id = this.#newId();
        this.#calls.push({ id, name: e.name, arguments: "" });
        deltas.push({ index, id, name: e.name });
        continue;
      }
      // Why skip an args event before any start: a stage never sends one; this keeps the invariant local.
      const index = this.#calls.length - 1;
      if (index < 0 || e.text === "") continue;
      this.#calls[index]!.arguments += e.text;
      const last = deltas[deltas.length - 1];
      if (last !== undefined && last.index === index && last.id === undefined) last.arguments += e.text;
      else deltas.push({ index, arguments: e.text });
    }
    if (deltas.length > 0) delta.toolCalls = deltas;
    return delta;
  }
}
