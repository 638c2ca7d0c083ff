/**
 * hermes3 tool calls (Qwen2.5/Qwen3, Hermes): `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`,
 * any number, with content before, between and after them kept. Lenient: a whole output that is a bare JSON call
 * to a declared tool is a call too (bare-calls.ts). A tag pair whose body is not a call stays in content as raw
 * text — OVMS ends the stream with an error there; a client here still gets everything the model wrote.
 *
 * @module
 */
import { JsonScanner } from "./json-scanner.js";
import type { ToolSpec } from "../tools.js";
import { BareCallDetector } from "./bare-calls.js";
import { callsFromJson, tryParseJson } from "./call-shape.js";
import { ContentGaps } from "./content-gaps.js";
import { emptyOutput, type StageOutput, type ToolStage } from "./stage.js";
import { findFirstTag, partialTagLength, skipSpace } from "./tag-scan.js";

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";

/** Where the stage is; `pending` holds the unread text. */
type HermesState =
  | { kind: "start" } // only whitespace so far: a bare call may still come
  | { kind: "bare"; detector: BareCallDetector } // holding text that may be a bare call
  | { kind: "text" } // content, watching for `<tool_call>`
  | { kind: "call"; body: string }; // inside `<tool_call>`, collecting the body up to `</tool_call>`

export class Hermes3Stage implements ToolStage {
  /** Position in the format. */
  #state: HermesState = { kind: "start" };
  /** Text received but not yet consumed (at most a partial tag once a push returns, or the bare candidate). */
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

  finish(reason: "stop" | "length"): StageOutput {
    const out = emptyOutput();
    // 1. A held bare candidate: a call if it is one as a whole, else ordinary text (which may hold tags).
    if (this.#state.kind === "bare") {
      const calls = this.#state.detector.calls();
      if (calls !== null) {
        this.#gaps.call();
        out.calls.push(...calls);
        this.#state = { kind: "text" };
      } else {
        this.#pending = this.#state.detector.text;
        this.#state = { kind: "text" };
        this.#drain(out);
      }
    }
    // 2. A call still open: kept only when the model stopped on its own right after a complete call body.
    if (this.#state.kind === "call") {
      const body = this.#state.body + this.#pending;
      this.#pending = "";
      const calls = reason === "stop" ? callsFromJson(tryParseJson(body.trim()), this.tools, false) : null;
      if (calls !== null) {
        this.#gaps.call();
        out.calls.push(...calls);
      } else {
        out.content += this.#gaps.text(OPEN + body);
      }
    }
    // 3. A held partial tag is plain text after all.
    out.content += this.#gaps.text(this.#pending) + this.#gaps.finish();
    this.#pending = "";
    return out;
  }

  /** Consumes `pending` as far as it is decidable. */
  #drain(out: StageOutput): void {
    for (;;) {
      const st = this.#state;
      switch (st.kind) {
        case "start": {
          // 1. Leading whitespace is a gap; the first other character decides between bare candidate and text.
          const i = skipSpace(this.#pending);
          out.content += this.#gaps.text(this.#pending.slice(0, i));
          this.#pending = this.#pending.slice(i);
          if (this.#pending === "") return;
          this.#state = BareCallDetector.mayStartWith(this.#pending[0]!)
            ? { kind: "bare", detector: new BareCallDetector(this.tools) }
            : { kind: "text" };
          continue;
        }
        case "bare": {
          // 2. Hold while it can still be a bare call; once it cannot, re-read it all as ordinary text.
          const text = this.#pending;
          this.#pending = "";
          if (st.detector.push(text)) return;
          this.#pending = st.detector.text;
          this.#state = { kind: "text" };
          continue;
        }
        case "text": {
          // 3. Content up to an opening tag; hold only a suffix that could still become one.
          const hit = findFirstTag(this.#pending, [OPEN]);
          if (hit === null) {
            const cut = this.#pending.length - partialTagLength(this.#pending, [OPEN]);
            out.content += this.#gaps.text(this.#pending.slice(0, cut));
            this.#pending = this.#pending.slice(cut);
            return;
          }
          out.content += this.#gaps.text(this.#pending.slice(0, hit.at));
          this.#pending = this.#pending.slice(hit.at + OPEN.length);
          this.#state = { kind: "call", body: "" };
          continue;
        }
        case "call": {
          // 4. The body up to `</tool_call>`; then a call, or raw content when it is not one. A closing tag inside a
          //    JSON string of the body is text of that string (a guided call may write one there).
          let at = this.#pending.indexOf(CLOSE);
          while (at >= 0 && insideJsonString(st.body + this.#pending.slice(0, at))) at = this.#pending.indexOf(CLOSE, at + 1);
          if (at < 0) {
            const cut = this.#pending.length - partialTagLength(this.#pending, [CLOSE]);
            st.body += this.#pending.slice(0, cut);
            this.#pending = this.#pending.slice(cut);
            return;
          }
          const body = st.body + this.#pending.slice(0, at);
          this.#pending = this.#pending.slice(at + CLOSE.length);
          const calls = callsFromJson(tryParseJson(body.trim()), this.tools, false);
          if (calls !== null) {
            this.#gaps.call();
            out.calls.push(...calls);
          } else {
            out.content += this.#gaps.text(OPEN + body + CLOSE);
          }
          this.#state = { kind: "text" };
          continue;
        }
      }
    }
  }
}

/** True when `body` is a JSON prefix that ends inside a string (so a tag found right after it is string text). */
function insideJsonString(body: string): boolean {
  const scanner = new JsonScanner();
  for (const ch of body.slice(skipSpace(body))) if (scanner.push(ch) !== "more") return false;
  return scanner.inString;
}
