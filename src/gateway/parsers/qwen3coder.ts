/**
 * qwen3coder tool calls (Qwen3-Coder, Qwen3.5/3.6):
 * `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>`; a bare
 * `<function=` (no `<tool_call>`) starts a call too. Values are raw text typed by the tool's schema
 * (parameter-values.ts). A value ends at `</parameter>` — with or without the `\n` before it, as OVMS — but only
 * when what follows is `<parameter=` or `</function>` (after whitespace): a `</parameter>` written inside a value (code
 * about these tags) stays in the value. A call is reported whole at `</function>`; anything that does not fit the
 * format stays in content, raw. Leniency: a `<tool_call>` whose body is hermes-style JSON is a call too, and
 * `</tool_call>` in place of `</function>` closes the function.
 *
 * @module
 */
import type { ToolSpec } from "../tools.js";
import { callsFromJson, tryParseJson } from "./call-shape.js";
import { ContentGaps } from "./content-gaps.js";
import { argumentsJson } from "./parameter-values.js";
import { emptyOutput, type StageOutput, type ToolStage } from "./stage.js";
import { couldStartWith, findFirstTag, partialTagLength, skipSpace } from "./tag-scan.js";

const CALL_OPEN = "<tool_call>";
const CALL_CLOSE = "</tool_call>";
const FN_OPEN = "<function=";
const FN_CLOSE = "</function>";
const PARAM_OPEN = "<parameter=";
const PARAM_CLOSE = "</parameter>";

/** Where a call is inside its markup. */
type CallPart =
  | { at: "open" } // after `<tool_call>`, before `<function=`
  | { at: "name" } // after `<function=`, reading up to `>`
  | { at: "between" } // after the name or a parameter: `<parameter=`, `</function>` (or `</tool_call>`)
  | { at: "paramName" } // after `<parameter=`, reading up to `>`
  | { at: "value"; param: string; value: string } // inside a value
  | { at: "valueEnd"; param: string; value: string } // after `</parameter>`: does a tag follow, or was it text?
  | { at: "malformed" }; // not the format: wait for `</tool_call>`, then JSON or raw content

/** Where the stage is; `pending` holds the unread text. */
type CoderState =
  /** Content; `expectClose`: a `</tool_call>` right after a call's `</function>` is markup to drop. */
  | { kind: "text"; expectClose: boolean }
  /**
   * Inside a call. `wrapped`: opened by `<tool_call>` (vs a bare `<function=`); `raw`: all text consumed since the
   * opener (content if the call fails); `params`: values by name, first duplicate wins.
   */
  | { kind: "call"; wrapped: boolean; raw: string; part: CallPart; name: string; params: Map<string, string> };

export class Qwen3CoderStage implements ToolStage {
  /** Position in the format. */
  #state: CoderState = { kind: "text", expectClose: false };
  /** Text received but not yet consumed. */
  #pending = "";
  /** Whitespace around calls. */
  readonly #gaps = new ContentGaps();

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
    // Why the same for both reasons: a call is complete only at `</function>`, where it was already reported.
    const out = emptyOutput();
    const raw = this.#state.kind === "call" ? this.#state.raw : "";
    out.content += this.#gaps.text(raw + this.#pending) + this.#gaps.finish();
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
    if (st.expectClose) {
      const rest = this.#pending.slice(skipSpace(this.#pending));
      if (couldStartWith(rest, CALL_CLOSE) && rest.length < CALL_CLOSE.length) return false;
      if (rest.startsWith(CALL_CLOSE)) this.#pending = rest.slice(CALL_CLOSE.length);
      st.expectClose = false;
    }
    // 2. Content up to an opener; hold only a suffix that could still become one.
    const openers = [CALL_OPEN, FN_OPEN];
    const hit = findFirstTag(this.#pending, openers);
    if (hit === null) {
      const cut = this.#pending.length - partialTagLength(this.#pending, openers);
      out.content += this.#gaps.text(this.#pending.slice(0, cut));
      this.#pending = this.#pending.slice(cut);
      return false;
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
      params: new Map(),
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
          st.part = { at: "malformed" };
          return true;
        }
        const name = this.#consume(at + 1).slice(0, at).trim();
        if (part.at === "name") {
          st.name = name;
          st.part = { at: "between" };
        } else {
          st.part = { at: "value", param: name, value: "" };
        }
        return true;
      }
      case "between": {
        // 3. Whitespace, then the next parameter or the end of the function.
        const i = skipSpace(this.#pending);
        const rest = this.#pending.slice(i);
        const closers = st.wrapped ? [PARAM_OPEN, FN_CLOSE, CALL_CLOSE] : [PARAM_OPEN, FN_CLOSE];
        const tag = closers.find((t) => rest.startsWith(t));
        if (tag === undefined) {
          if (closers.some((t) => t.startsWith(rest))) return false;
          st.part = { at: "malformed" };
          return true;
        }
        this.#consume(i + tag.length);
        if (tag === PARAM_OPEN) st.part = { at: "paramName" };
        else this.#complete(st, out, tag === FN_CLOSE && st.wrapped);
        return true;
      }
      case "value": {
        // 4. Raw value text up to `</parameter>`.
        const at = this.#pending.indexOf(PARAM_CLOSE);
        if (at < 0) {
          const cut = this.#pending.length - partialTagLength(this.#pending, [PARAM_CLOSE]);
          part.value += this.#consume(cut);
          return false;
        }
        part.value += this.#consume(at);
        this.#consume(PARAM_CLOSE.length);
        st.part = { at: "valueEnd", param: part.param, value: part.value };
        return true;
      }
      case "valueEnd": {
        // 5. The value ended only if a tag follows; otherwise `</parameter>` was value text. Nothing is consumed
        //    here: "between" reads the same whitespace and tag.
        const rest = this.#pending.slice(skipSpace(this.#pending));
        const next = st.wrapped ? [PARAM_OPEN, FN_CLOSE, CALL_CLOSE] : [PARAM_OPEN, FN_CLOSE];
        if (next.some((t) => rest.startsWith(t))) {
          if (!st.params.has(part.param)) st.params.set(part.param, part.value);
          st.part = { at: "between" };
        } else if (next.some((t) => t.startsWith(rest))) {
          return false;
        } else {
          st.part = { at: "value", param: part.param, value: part.value + PARAM_CLOSE };
        }
        return true;
      }
      case "malformed": {
        // 6. Not the format. Unwrapped: give the text back at once. Wrapped: up to `</tool_call>`, whose body may
        //    still be a hermes-style JSON call (models mix the formats up).
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
        out.calls.push(...calls);
        this.#state = { kind: "text", expectClose: false };
        return true;
      }
    }
  }

  /** `</function>` (or `</tool_call>`): the call is complete. */
  #complete(st: Extract<CoderState, { kind: "call" }>, out: StageOutput, expectClose: boolean): void {
    this.#gaps.call();
    out.calls.push({ name: st.name, arguments: argumentsJson(st.name, st.params, this.tools) });
    this.#state = { kind: "text", expectClose };
  }

  /** The call's raw text is content after all. */
  #fail(st: Extract<CoderState, { kind: "call" }>, out: StageOutput): boolean {
    out.content += this.#gaps.text(st.raw);
    this.#state = { kind: "text", expectClose: false };
    return true;
  }
}
