/**
 * llama3 tool calls (Llama 3.1+ JSON tool calling): `<|python_tag|>` (optional) then JSON objects
 * `{"name": …, "parameters": {…}}` (also `"arguments"`), several separated by `;`. Without the tag, an output that
 * is as a whole such JSON (a leading `{`) is a call when it names a declared tool — the same lenient rule as
 * hermes3's bare calls. Text before the tag is content; what follows the calls and is not one is content, raw.
 *
 * @module
 */
import type { ToolSpec } from "../tools.js";
import { BareCallDetector } from "./bare-calls.js";
import { callsFromJson, tryParseJson } from "./call-shape.js";
import { ContentGaps } from "./content-gaps.js";
import { JsonScanner } from "./json-scanner.js";
import { emptyOutput, type StageOutput, type ToolStage } from "./stage.js";
import { findFirstTag, isSpace, partialTagLength, skipSpace } from "./tag-scan.js";

const TAG = "<|python_tag|>";

/** Where the stage is; `pending` holds the unread text. */
type Llama3State =
  | { kind: "start" } // only whitespace so far: a bare call may still come
  | { kind: "bare"; detector: BareCallDetector } // holding text that may be bare calls
  | { kind: "text" } // content, watching for `<|python_tag|>`
  /** After the tag, between values; `unclaimed`: raw text since the tag, content if no call follows it. */
  | { kind: "gap"; unclaimed: string; afterCall: boolean }
  /** Inside one JSON value; `raw` = its text so far. */
  | { kind: "value"; unclaimed: string; raw: string; scanner: JsonScanner };

export class Llama3Stage implements ToolStage {
  /** Position in the format. */
  #state: Llama3State = { kind: "start" };
  /** Text received but not yet consumed. */
  #pending = "";
  /** Whitespace around calls. */
  readonly #gaps = new ContentGaps();

  constructor(
    /** The request's tools (bare calls must name one). */
    private readonly tools: readonly ToolSpec[],
  ) {}

  push(text: string): StageOutput {
    const out = emptyOutput();
    this.#pending += text;
    this.#drain(out);
    return out;
  }

  finish(_reason: "stop" | "length"): StageOutput {
    const out = emptyOutput();
    // 1. A held bare candidate: calls if it is them as a whole, else ordinary text (which may hold the tag).
    if (this.#state.kind === "bare") {
      const detector = this.#state.detector;
      const calls = detector.calls();
      this.#state = { kind: "text" };
      if (calls !== null) {
        this.#gaps.call();
        out.calls.push(...calls);
      } else {
        this.#pending = detector.text;
        this.#drain(out);
      }
    }
    // 2. Whatever is unread or unclaimed is content (a value cut in the middle is not a call).
    const st = this.#state;
    const rest =
      st.kind === "value" ? st.unclaimed + st.raw : st.kind === "gap" && !st.afterCall ? st.unclaimed : "";
    out.content += this.#gaps.text(rest + this.#pending) + this.#gaps.finish();
    this.#pending = "";
    return out;
  }

  /** Consumes `pending` as far as it is decidable. */
  #drain(out: StageOutput): void {
    for (;;) {
      const st = this.#state;
      switch (st.kind) {
        case "start": {
          // 1. Leading whitespace is a gap; a leading `{` or `[` may be a bare call.
          const i = skipSpace(this.#pending);
          out.content += this.#gaps.text(this.#pending.slice(0, i));
          this.#pending = this.#pending.slice(i);
          if (this.#pending === "") return;
          const first = this.#pending[0]!;
          this.#state =
            first === "{" || first === "["
              ? { kind: "bare", detector: new BareCallDetector(this.tools) }
              : { kind: "text" };
          continue;
        }
        case "bare": {
          // 2. Hold while it can still be bare calls; once it cannot, re-read it all as ordinary text.
          const text = this.#pending;
          this.#pending = "";
          if (st.detector.push(text)) return;
          this.#pending = st.detector.text;
          this.#state = { kind: "text" };
          continue;
        }
        case "text": {
          // 3. Content up to the tag; hold only a suffix that could still become it.
          const hit = findFirstTag(this.#pending, [TAG]);
          if (hit === null) {
            const cut = this.#pending.length - partialTagLength(this.#pending, [TAG]);
            out.content += this.#gaps.text(this.#pending.slice(0, cut));
            this.#pending = this.#pending.slice(cut);
            return;
          }
          out.content += this.#gaps.text(this.#pending.slice(0, hit.at));
          this.#pending = this.#pending.slice(hit.at + TAG.length);
          this.#state = { kind: "gap", unclaimed: TAG, afterCall: false };
          continue;
        }
        case "gap": {
          // 4. Between values: whitespace and `;` separate; `{`/`[` starts a value; anything else ends the calls.
          let i = 0;
          while (i < this.#pending.length && (isSpace(this.#pending[i]!) || this.#pending[i] === ";")) i++;
          // Why only before the first call: separators after a call belong to the call syntax, not to content.
          if (!st.afterCall) st.unclaimed += this.#pending.slice(0, i);
          this.#pending = this.#pending.slice(i);
          if (this.#pending === "") return;
          const first = this.#pending[0]!;
          if (first === "{" || first === "[") {
            const unclaimed = st.afterCall ? "" : st.unclaimed;
            this.#state = { kind: "value", unclaimed, raw: "", scanner: new JsonScanner() };
            continue;
          }
          if (!st.afterCall) out.content += this.#gaps.text(st.unclaimed);
          this.#state = { kind: "text" };
          continue;
        }
        case "value": {
          // 5. One JSON value, character by character; when it closes, a call — or raw content if it is not one.
          let i = 0;
          let step: "more" | "done" | "error" = "more";
          while (i < this.#pending.length && step === "more") step = st.scanner.push(this.#pending[i++]!);
          st.raw += this.#pending.slice(0, step === "error" ? i - 1 : i);
          this.#pending = this.#pending.slice(step === "error" ? i - 1 : i);
          if (step === "more") return;
          const calls = step === "done" ? callsFromJson(tryParseJson(st.raw), this.tools, false) : null;
          if (calls !== null) {
            this.#gaps.call();
            out.calls.push(...calls);
            this.#state = { kind: "gap", unclaimed: "", afterCall: true };
          } else {
            out.content += this.#gaps.text(st.unclaimed + st.raw);
            this.#state = { kind: "text" };
          }
          continue;
        }
      }
    }
  }
}
