/**
 * hermes3 tool calls (Qwen2.5/Qwen3, Hermes): `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`,
 * any number, with content before, between and after them kept. Streamed: a call is announced when its `"name"`
 * string closes and its arguments follow as compact JSON while the model writes them (json-call-reader.ts).
 * Lenient: an output opening with a bare JSON call to a declared tool streams it the same way (no tag; a list, a
 * fenced call or OpenAI's wrapper shape is a call only as the whole output: bare-calls.ts, reported at the end); several call objects in one tag, a missing `</tool_call>` before
 * the next `<tool_call>`, and a repeated `</tool_call>` are read as the model meant them. A body that is not a
 * call (before its name is known) stays in content as raw text; text that breaks a call after its name is known
 * ends the call there (arguments closed as produced) and is content. OVMS ends the stream with an error instead.
 *
 * @module
 */
import type { ToolSpec } from "../tools.js";
import { BareCallDetector } from "./bare-calls.js";
import { callsFromJson, tryParseJson } from "./call-shape.js";
import { ContentGaps } from "./content-gaps.js";
import { JsonCallReader } from "./json-call-reader.js";
import { JsonScanner } from "./json-scanner.js";
import { announceWhenNamed, emptyOutput, pushArgs, pushWhole, type StageOutput, type ToolStage } from "./stage.js";
import { findFirstTag, partialTagLength, skipSpace } from "./tag-scan.js";

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";
/** A Markdown code fence: markup between two is quoted, not a call. */
const FENCE = "```";

/** Where the stage is; `pending` holds the unread text. `opener`: the tag text a failed call gives back. */
type HermesState =
  | { kind: "start" } // only whitespace so far: a bare call may still come
  | { kind: "bare"; detector: BareCallDetector } // holding text that may be a bare call
  | { kind: "text" } // content, watching for `<tool_call>`
  /** A call object, streamed; `opener` null: a bare call at the start of the output (no tag). */
  | { kind: "stream"; opener: string | null; reader: JsonCallReader; announced: boolean }
  | { kind: "bareGap" } // after a streamed bare call: `;` and whitespace, another bare call, or text
  | { kind: "call"; opener: string; body: string } // not the streamed shape: the body up to `</tool_call>`, whole
  | { kind: "inTag" } // after a call object, inside its tag: `</tool_call>`, another object, or text
  | { kind: "tail" } // text inside a tag after a call: content up to `</tool_call>` (dropped) or `<tool_call>`
  | { kind: "afterTag" }; // after `</tool_call>`: a repeated `</tool_call>` is dropped

export class Hermes3Stage implements ToolStage {
  /** Position in the format. */
  #state: HermesState = { kind: "start" };
  /** Text received but not yet consumed (at most a partial tag once a push returns, or the bare candidate). */
  #pending = "";
  /** Whitespace around calls. */
  readonly #gaps = new ContentGaps();
  /** Inside a ``` code fence of the content. */
  #fenced = false;

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
    // 1. A bare candidate (streamed or held): a call if it is one as a whole, else ordinary text (may hold tags).
    if (this.#state.kind === "stream" && this.#state.opener === null && !this.#state.announced) {
      this.#bareFallback(this.#state.reader.raw);
      if ((this.#state as HermesState).kind === "text") this.#drain(out);
    }
    if (this.#state.kind === "bare") {
      const calls = this.#state.detector.calls();
      if (calls !== null) {
        this.#gaps.call();
        pushWhole(out, calls);
        this.#state = { kind: "text" };
      } else {
        this.#pending = this.#state.detector.text;
        this.#state = { kind: "text" };
        this.#drain(out);
      }
    }
    const st = this.#state;
    // 2. A streamed call still open stays a call (it was announced), its arguments closed as produced so far;
    //    before its name it is raw text.
    if (st.kind === "stream") {
      if (st.announced) pushArgs(out, st.reader.closeArgs());
      else out.content += this.#gaps.text((st.opener ?? "") + st.reader.raw);
    }
    // 3. A whole-read body still open: kept only when the model stopped on its own right after a complete call.
    if (st.kind === "call") {
      const body = st.body + this.#pending;
      this.#pending = "";
      const calls = reason === "stop" ? callsFromJson(tryParseJson(body.trim()), this.tools, false) : null;
      if (calls !== null) {
        this.#gaps.call();
        pushWhole(out, calls);
      } else {
        out.content += this.#gaps.text(st.opener + body);
      }
    }
    // 4. A held partial tag (or whitespace inside a tag after a call) is plain text after all.
    out.content += (st.kind === "inTag" ? "" : this.#gaps.text(this.#pending)) + this.#gaps.finish();
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
          const first = this.#pending[0]!;
          // A leading `{` streams as a call once it names a declared tool; a list or a fence is read whole.
          if (first === "{") this.#state = { kind: "stream", opener: null, reader: new JsonCallReader(this.tools.map((t) => t.name)), announced: false };
          else this.#state = BareCallDetector.mayStartWith(first) ? { kind: "bare", detector: new BareCallDetector(this.tools) } : { kind: "text" };
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
        case "text":
        case "tail": {
          // 3. Content up to an opening tag (in a tail also up to the closing one); hold only a possible tag prefix.
          //    Inside a ``` fence markup is quoted text (a model echoing the format), so only the fence is watched.
          const tags = this.#fenced ? [FENCE] : st.kind === "tail" ? [OPEN, CLOSE, FENCE] : [OPEN, FENCE];
          const hit = findFirstTag(this.#pending, tags);
          if (hit === null) {
            const cut = this.#pending.length - partialTagLength(this.#pending, tags);
            out.content += this.#gaps.text(this.#pending.slice(0, cut));
            this.#pending = this.#pending.slice(cut);
            return;
          }
          if (hit.tag === FENCE) {
            out.content += this.#gaps.text(this.#pending.slice(0, hit.at + FENCE.length));
            this.#pending = this.#pending.slice(hit.at + FENCE.length);
            this.#fenced = !this.#fenced;
            continue;
          }
          out.content += this.#gaps.text(this.#pending.slice(0, hit.at));
          this.#pending = this.#pending.slice(hit.at + hit.tag.length);
          this.#state = hit.tag === OPEN ? this.#streamState(OPEN) : { kind: "afterTag" };
          continue;
        }
        case "stream":
          if (!this.#stream(st, out)) return;
          continue;
        case "inTag": {
          // 4. After a call object inside its tag: whitespace and commas (markup), then the closing tag, another call
          //    (a second object, or a `<tool_call>` whose predecessor was never closed), or text.
          let i = 0;
          while (i < this.#pending.length && (this.#pending[i] === "," || skipSpace(this.#pending, i) > i)) i++;
          const rest = this.#pending.slice(i);
          this.#pending = rest;
          if (rest === "" || ((CLOSE.startsWith(rest) || OPEN.startsWith(rest)) && rest !== CLOSE && rest !== OPEN)) return;
          if (rest.startsWith(CLOSE)) {
            this.#pending = rest.slice(CLOSE.length);
            this.#state = { kind: "afterTag" };
          } else if (rest.startsWith(OPEN)) {
            this.#pending = rest.slice(OPEN.length);
            this.#state = this.#streamState(OPEN);
          } else {
            this.#state = rest[0] === "{" ? this.#streamState("") : { kind: "tail" };
          }
          continue;
        }
        case "bareGap": {
          // 2b. After a bare call: `;`/whitespace separate the next bare call (Llama style); anything else is text.
          let i = 0;
          while (i < this.#pending.length && (this.#pending[i] === ";" || skipSpace(this.#pending, i) > i)) i++;
          if (i === this.#pending.length) return;
          if (this.#pending[i] === "{") {
            this.#pending = this.#pending.slice(i);
            this.#state = { kind: "stream", opener: null, reader: new JsonCallReader(this.tools.map((t) => t.name)), announced: false };
          } else {
            this.#state = { kind: "text" };
          }
          continue;
        }
        case "afterTag": {
          // 5. A `</tool_call>` repeated right after the one that closed a call is dropped with the space before it.
          const rest = this.#pending.slice(skipSpace(this.#pending));
          if (rest === "" || (CLOSE.startsWith(rest) && rest !== CLOSE)) return;
          if (rest.startsWith(CLOSE)) this.#pending = rest.slice(CLOSE.length);
          else this.#state = { kind: "text" };
          continue;
        }
        case "call": {
          // 6. The body up to `</tool_call>`; then a call, or raw content when it is not one. A closing tag inside a
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
            pushWhole(out, calls);
            this.#state = { kind: "afterTag" };
          } else {
            out.content += this.#gaps.text(st.opener + body + CLOSE);
            this.#state = { kind: "text" };
          }
          continue;
        }
      }
    }
  }

  /**
   * A bare call that cannot stream (a list, a wrapper, a key no call has, an undeclared name) or was cut before
   * its name: the whole-output detector reads `raw` again (then the rest of `pending`), or it is text.
   */
  #bareFallback(raw: string): void {
    const detector = new BareCallDetector(this.tools);
    if (detector.push(raw)) {
      this.#state = { kind: "bare", detector };
      return;
    }
    this.#pending = detector.text + this.#pending;
    this.#state = { kind: "text" };
  }

  /** A fresh streamed call after `opener`. */
  #streamState(opener: string): HermesState {
    return { kind: "stream", opener, reader: new JsonCallReader(), announced: false };
  }

  /** Feeds pending text to the streamed call; false when all of it was consumed (more is needed). */
  #stream(st: Extract<HermesState, { kind: "stream" }>, out: StageOutput): boolean {
    for (let i = 0; i < this.#pending.length; i++) {
      const step = st.reader.push(this.#pending[i]!);
      // 1. The name just closed: the call exists from here on.
      announceWhenNamed(st, this.#gaps, out);
      if (step === "more") continue;
      // 2. The object closed, or broke after its name (the rest is text), or was never the streamed shape.
      if (step === "giveUp") {
        this.#pending = this.#pending.slice(i);
        if (st.opener === null) this.#bareFallback(st.reader.raw);
        else this.#state = { kind: "call", opener: st.opener, body: st.reader.raw };
      } else {
        pushArgs(out, st.reader.closeArgs());
        const bare = st.opener === null;
        this.#state = step === "done" ? { kind: bare ? "bareGap" : "inTag" } : { kind: bare ? "text" : "tail" };
        this.#pending = this.#pending.slice(step === "done" ? i + 1 : i);
      }
      return true;
    }
    this.#pending = "";
    pushArgs(out, st.reader.takeArgs());
    return false;
  }
}

/** True when `body` is a JSON prefix that ends inside a string (so a tag found right after it is string text). */
function insideJsonString(body: string): boolean {
  const scanner = new JsonScanner();
  for (const ch of body.slice(skipSpace(body))) if (scanner.push(ch) !== "more") return false;
  return scanner.inString;
}
