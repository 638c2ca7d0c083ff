/**
 * qwen3coder tool calls (Qwen3-Coder, Qwen3.5/3.6):
 * `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>`; a bare
 * `<function=` (no `<tool_call>`) starts a call too. Values are raw text typed by the tool's schema
 * (parameter-values.ts). A value ends at `</parameter>` — with or without the `\n` before it, as OVMS — but only
 * when what follows is `<parameter=` or `</function>` (after whitespace): a `</parameter>` written inside a value (code
 * about these tags) stays in the value. Streamed: a call is announced at its first `<parameter=` (or its
 * `</function>`), its arguments written as a JSON object while the values arrive (streamed-parameter.ts); markup
 * that does not fit before that stays in content, raw; after it, the call ends there (arguments closed as produced)
 * and the rest is content. Leniency (what Qwen3 models are seen to write): a `<tool_call>` whose body is
 * hermes-style JSON is a call too (reported whole); `</tool_call>` in place of `</function>` closes the function; a
 * missing `</parameter>` is recovered where the next line opens a declared, not yet given parameter of the same
 * function, or where `</function>` is followed by `</tool_call>`; a repeated `</tool_call>` is dropped.
 *
 * @module
 */
import type { ToolSpec } from "../tools.js";
import { callsFromJson, tryParseJson } from "./call-shape.js";
import { ContentGaps } from "./content-gaps.js";
import { isPlainObject } from "./call-shape.js";
import { emptyOutput, pushArgs, pushWhole, type StageOutput, type ToolStage } from "./stage.js";
import { StreamedParameter } from "./streamed-parameter.js";
import { couldStartWith, findFirstTag, partialTagLength, skipSpace } from "./tag-scan.js";

const CALL_OPEN = "<tool_call>";
const CALL_CLOSE = "</tool_call>";
const FN_OPEN = "<function=";
const FN_CLOSE = "</function>";
const PARAM_OPEN = "<parameter=";
const PARAM_CLOSE = "</parameter>";
/** A Markdown code fence: markup between two is quoted, not a call. */
const FENCE = "```";

/** Where a call is inside its markup. */
type CallPart =
  | { at: "open" } // after `<tool_call>`, before `<function=`
  | { at: "name" } // after `<function=`, reading up to `>`
  | { at: "between" } // after the name or a parameter: `<parameter=`, `</function>` (or `</tool_call>`)
  | { at: "paramName" } // after `<parameter=`, reading up to `>`
  /** Inside a value; `out` writes it (null for a repeated parameter, whose value is dropped). */
  | { at: "value"; param: string; value: string; out: StreamedParameter | null }
  /** After `</parameter>`: does a tag follow, or was it text? */
  | { at: "valueEnd"; param: string; value: string; out: StreamedParameter | null }
  | { at: "malformed" }; // not the format: wait for `</tool_call>`, then JSON or raw content

/** Where the stage is; `pending` holds the unread text. */
type CoderState =
  /** Content; `expectClose`: a `</tool_call>` right after a call's `</function>` is markup to drop. */
  | { kind: "text"; expectClose: boolean }
  /**
   * Inside a call. `wrapped`: opened by `<tool_call>` (vs a bare `<function=`); `raw`: all text consumed since the
   * opener (content if the call fails before it is announced); `params`: names given, first duplicate wins;
   * `announced`: the call was sent (from then on it stays a call).
   */
  | {
      kind: "call";
      wrapped: boolean;
      raw: string;
      part: CallPart;
      name: string;
      params: Set<string>;
      announced: boolean;
    };

export class Qwen3CoderStage implements ToolStage {
  /** Position in the format. */
  #state: CoderState = { kind: "text", expectClose: false };
  /** Text received but not yet consumed. */
  #pending = "";
  /** Whitespace around calls. */
  readonly #gaps = new ContentGaps();
  /** Inside a ``` code fence of the content. */
  #fenced = false;

  constructor(
    /** The request's tools (schemas type the parameter values). */
    private readonly tools: readonly ToolSpec[],
  ) {}

  push(text: string): StageOutput {
    const out = emptyOutput();
    this.#pending += text;
    this.#drain(out);
    return out;
  }

  finish(_reason: "stop" | "length"): StageOutput {
    // Why the same for both reasons: an announced call stays a call either way, one not announced is text.
    const out = emptyOutput();
    const st = this.#state;
    if (st.kind === "call" && st.announced) {
      // 1. The value being read ends here; what is held after it could only be markup (a cut closing tag).
      const part = st.part;
      if (part.at === "value" || part.at === "valueEnd") this.#endParam(part, out);
      pushArgs(out, "}");
    } else {
      // 2. Raw text: a call never announced, or a partial tag held back.
      const raw = st.kind === "call" ? st.raw : "";
      out.content += this.#gaps.text(raw + this.#pending);
    }
    out.content += this.#gaps.finish();
    this.#pending = "";
    this.#state = { kind: "text", expectClose: false };
    return out;
  }

  /** Moves `n` characters of `pending` into the current call's raw text; returns them. */
  #consume(n: number): string {
    const taken = this.#pending.slice(0, n);
    this.#pending = this.#pending.slice(n);
    if (this.#state.kind === "call") this.#state.raw += taken;
    return taken;
  }

  /** Consumes `pending` as far as it is decidable. */
  #drain(out: StageOutput): void {
    for (;;) {
      const st = this.#state;
      if (st.kind === "text") {
        if (!this.#text(st, out)) return;
      } else if (!this.#call(st, out)) {
        return;
      }
    }
  }

  /** Content mode; false when it needs more text. */
  #text(st: { kind: "text"; expectClose: boolean }, out: StageOutput): boolean {
    // 1. Right after a call: whitespace, then maybe the `</tool_call>` that closes its wrapper — markup, dropped
    //    with the whitespace before it; otherwise that whitespace is an ordinary gap.
    //    A repeated `</tool_call>` goes the same way.
    while (st.expectClose) {
      const rest = this.#pending.slice(skipSpace(this.#pending));
      if (couldStartWith(rest, CALL_CLOSE) && rest.length < CALL_CLOSE.length) return false;
      if (rest.startsWith(CALL_CLOSE)) this.#pending = rest.slice(CALL_CLOSE.length);
      else st.expectClose = false;
    }
    // 2. Content up to an opener; hold only a suffix that could still become one. Inside a ``` fence markup is
    //    quoted text (a model echoing the format from its prompt), so only the closing fence is watched there.
    const openers = this.#fenced ? [FENCE] : [CALL_OPEN, FN_OPEN, FENCE];
    const hit = findFirstTag(this.#pending, openers);
    if (hit === null) {
      const cut = this.#pending.length - partialTagLength(this.#pending, openers);
      out.content += this.#gaps.text(this.#pending.slice(0, cut));
      this.#pending = this.#pending.slice(cut);
      return false;
    }
    if (hit.tag === FENCE) {
      out.content += this.#gaps.text(this.#pending.slice(0, hit.at + FENCE.length));
      this.#pending = this.#pending.slice(hit.at + FENCE.length);
      this.#fenced = !this.#fenced;
      return true;
    }
    out.content += this.#gaps.text(this.#pending.slice(0, hit.at));
    this.#pending = this.#pending.slice(hit.at + hit.tag.length);
    const wrapped = hit.tag === CALL_OPEN;
    this.#state = {
      kind: "call",
      wrapped,
      raw: hit.tag,
      part: wrapped ? { at: "open" } : { at: "name" },
      name: "",
      params: new Set(),
      announced: false,
    };
    return true;
  }

  /** Inside a call; false when it needs more text. */
  #call(st: Extract<CoderState, { kind: "call" }>, out: StageOutput): boolean {
    const part = st.part;
    switch (part.at) {
      case "open": {
        // 1. Whitespace, then `<function=`.
        const i = skipSpace(this.#pending);
        const rest = this.#pending.slice(i);
        if (!couldStartWith(rest, FN_OPEN)) st.part = { at: "malformed" };
        else if (rest.length < FN_OPEN.length) return false;
        else {
          this.#consume(i + FN_OPEN.length);
          st.part = { at: "name" };
        }
        return true;
      }
      case "name":
      case "paramName": {
        // 2. A name runs to `>` on the same line; a `<` or a line break first means this is not the format.
        const at = this.#pending.search(/[>\n<]/);
        if (at < 0) return false;
        if (this.#pending[at] !== ">") {
          if (st.announced) return this.#broken(out, PARAM_OPEN);
          st.part = { at: "malformed" };
          return true;
        }
        const name = this.#consume(at + 1).slice(0, at).trim();
        if (part.at === "name") {
          st.name = name;
          st.part = { at: "between" };
          return true;
        }
        // A repeated parameter's value is dropped (the first one wins).
        const writer = st.params.has(name) ? null : new StreamedParameter(name, this.#schema(st.name, name), st.params.size === 0);
        st.params.add(name);
        st.part = { at: "value", param: name, value: "", out: writer };
        return true;
      }
      case "between": {
        // 3. Whitespace, then the next parameter or the end of the function. The first of these announces the call.
        const i = skipSpace(this.#pending);
        const rest = this.#pending.slice(i);
        const closers = st.wrapped ? [PARAM_OPEN, FN_CLOSE, CALL_CLOSE] : [PARAM_OPEN, FN_CLOSE];
        const tag = closers.find((t) => rest.startsWith(t));
        if (tag === undefined) {
          if (closers.some((t) => t.startsWith(rest))) return false;
          if (st.announced) return this.#broken(out, "");
          st.part = { at: "malformed" };
          return true;
        }
        if (!st.announced) {
          st.announced = true;
          this.#gaps.call();
          out.calls.push({ kind: "start", name: st.name }, { kind: "args", text: "{" });
        }
        this.#consume(i + tag.length);
        if (tag === PARAM_OPEN) st.part = { at: "paramName" };
        else this.#complete(out, tag === FN_CLOSE); // an unwrapped call may still end with an orphan `</tool_call>`
        return true;
      }
      case "value": {
        // 4. Raw value text up to its end: `</parameter>`, or where a missing `</parameter>` shows (findValueEnd).
        const end = findValueEnd(this.#pending, part.value.endsWith("\n"), st.wrapped, (p) => this.#canOpen(st, p));
        this.#addValue(part, this.#consume(end.at), out);
        if (end.kind === "hold") return false;
        if (end.kind === "close") {
          this.#consume(PARAM_CLOSE.length);
          st.part = { at: "valueEnd", param: part.param, value: part.value, out: part.out };
        } else {
          this.#endParam(part, out);
          st.part = { at: "between" };
        }
        return true;
      }
      case "valueEnd": {
        // 5. The value ended only if a tag follows; otherwise `</parameter>` was value text. Nothing is consumed
        //    here: "between" reads the same whitespace and tag.
        const rest = this.#pending.slice(skipSpace(this.#pending));
        const next = st.wrapped ? [PARAM_OPEN, FN_CLOSE, CALL_CLOSE] : [PARAM_OPEN, FN_CLOSE];
        if (next.some((t) => rest.startsWith(t))) {
          this.#endParam(part, out);
          st.part = { at: "between" };
        } else if (next.some((t) => t.startsWith(rest))) {
          return false;
        } else {
          const value = { at: "value" as const, param: part.param, value: part.value, out: part.out };
          this.#addValue(value, PARAM_CLOSE, out);
          st.part = value;
        }
        return true;
      }
      case "malformed": {
        // 6. Not the format (never announced). Unwrapped: give the text back at once. Wrapped: up to
        //    `</tool_call>`, whose body may still be a hermes-style JSON call (models mix the formats up).
        if (!st.wrapped) return this.#fail(st, out);
        const at = this.#pending.indexOf(CALL_CLOSE);
        if (at < 0) {
          this.#consume(this.#pending.length - partialTagLength(this.#pending, [CALL_CLOSE]));
          return false;
        }
        this.#consume(at + CALL_CLOSE.length);
        const body = st.raw.slice(CALL_OPEN.length, st.raw.length - CALL_CLOSE.length);
        const calls = callsFromJson(tryParseJson(body.trim()), this.tools, false);
        if (calls === null) return this.#fail(st, out);
        this.#gaps.call();
        pushWhole(out, calls);
        this.#state = { kind: "text", expectClose: true };
        return true;
      }
    }
  }

  /** The schema of parameter `param` of tool `fn` (undefined when not described). */
  #schema(fn: string, param: string): unknown {
    const properties = this.tools.find((t) => t.name === fn)?.parameters?.["properties"];
    return isPlainObject(properties) ? properties[param] : undefined;
  }

  /** Whether `<parameter=P>` on a new line inside a value opens the next parameter (a missing `</parameter>`). */
  #canOpen(st: Extract<CoderState, { kind: "call" }>, param: string): boolean {
    return !st.params.has(param) && this.#schema(st.name, param) !== undefined;
  }

  /** Value text: kept raw, and written as far as it is certain. */
  #addValue(part: Extract<CallPart, { at: "value" }>, text: string, out: StageOutput): void {
    if (text === "") return;
    part.value += text;
    if (part.out) pushArgs(out, part.out.push(text));
  }

  /** The parameter's value ended: the rest of its member. */
  #endParam(part: Extract<CallPart, { at: "value" | "valueEnd" }>, out: StageOutput): void {
    if (part.out) pushArgs(out, part.out.end());
  }

  /** `</function>` (or `</tool_call>`): the announced call is complete. */
  #complete(out: StageOutput, expectClose: boolean): void {
    pushArgs(out, "}");
    this.#state = { kind: "text", expectClose };
  }

  /**
   * Markup broke after the call was announced: the call ends here with its arguments so far, and the unread text
   * (after `given`, text consumed that belongs to it) is content.
   */
  #broken(out: StageOutput, given: string): boolean {
    pushArgs(out, "}");
    this.#pending = given + this.#pending;
    this.#state = { kind: "text", expectClose: false };
    return true;
  }

  /** The call's raw text is content after all. */
  #fail(st: Extract<CoderState, { kind: "call" }>, out: StageOutput): boolean {
    out.content += this.#gaps.text(st.raw);
    this.#state = { kind: "text", expectClose: false };
    return true;
  }
}

/** Where a value ends in `text` (what follows the value so far), or how much of it is value text for certain. */
type ValueEnd = { kind: "close" | "param" | "function"; at: number } | { kind: "hold"; at: number };

/**
 * The end of a qwen3coder value in `text`: `</parameter>` (`close`); or, where a model forgot it, a line that
 * opens a parameter `canOpen` accepts (`param`) or `</function>` followed by `</tool_call>` (`function`, wrapped
 * calls only). `hold`: no end yet; `at` characters are value text, the rest could still become one of these.
 * `lineStart`: the value so far ends with a line break.
 */
export function findValueEnd(text: string, lineStart: boolean, wrapped: boolean, canOpen: (p: string) => boolean): ValueEnd {
  for (let i = text.indexOf("<"); i >= 0; i = text.indexOf("<", i + 1)) {
    const rest = text.slice(i);
    if (rest.startsWith(PARAM_CLOSE)) return { kind: "close", at: i };
    if (PARAM_CLOSE.startsWith(rest)) return { kind: "hold", at: i };
    if (!(i === 0 ? lineStart : text[i - 1] === "\n")) continue;
    if (rest.startsWith(PARAM_OPEN)) {
      const name = rest.slice(PARAM_OPEN.length);
      const at = name.search(/[>\n<]/);
      if (at < 0) return { kind: "hold", at: i };
      if (name[at] === ">" && canOpen(name.slice(0, at).trim())) return { kind: "param", at: i };
    } else if (PARAM_OPEN.startsWith(rest)) {
      return { kind: "hold", at: i };
    }
    if (!wrapped) continue;
    if (rest.startsWith(FN_CLOSE)) {
      const after = rest.slice(FN_CLOSE.length);
      const next = after.slice(skipSpace(after));
      if (next.startsWith(CALL_CLOSE)) return { kind: "function", at: i };
      if (CALL_CLOSE.startsWith(next)) return { kind: "hold", at: i };
    } else if (FN_CLOSE.startsWith(rest)) {
      return { kind: "hold", at: i };
    }
  }
  return { kind: "hold", at: text.length };
}
