/**
 * llama3 tool calls (Llama 3.1+ JSON tool calling): `<|python_tag|>` (optional) then JSON objects
 * `{"name": …, "parameters": {…}}` (also `"arguments"`), several separated by `;`. Without the tag, an output that
 * is as a whole such JSON (a leading `{`) is a call when it names a declared tool — the same lenient rule as
 * hermes3's bare calls (a leading call object streams once its name is a declared tool; a list is read whole). Text before the tag is content; what follows the calls and is
 * not one is content, raw. After the tag a call object streams: announced when its `"name"` closes, arguments as
 * compact JSON while they arrive (json-call-reader.ts); text that breaks it after that ends the call there.
 *
 * @module
 */
import type { ToolSpec } from "../tools.js";
import { BareCallDetector } from "./bare-calls.js";
import { callsFromJson, tryParseJson } from "./call-shape.js";
import { ContentGaps } from "./content-gaps.js";
import { JsonScanner } from "./json-scanner.js";
import { JsonCallReader } from "./json-call-reader.js";
import { announceWhenNamed, emptyOutput, pushArgs, pushWhole, type StageOutput, type ToolStage } from "./stage.js";
import { findFirstTag, isSpace, partialTagLength, skipSpace } from "./tag-scan.js";

const TAG = "<|python_tag|>";

/** Where the stage is; `pending` holds the unread text. */
type Llama3State =
  | { kind: "start" } // only whitespace so far: a bare call may still come
  | { kind: "bare"; detector: BareCallDetector } // holding text that may be bare calls
  | { kind: "text" } // content, watching for `<|python_tag|>`
  /** After the tag, between values; `unclaimed`: raw text since the tag, content if no call follows it. */
  | { kind: "gap"; unclaimed: string; afterCall: boolean }
  /** Inside one JSON value read whole (a list, a wrapper); `raw` = its text so far. */
  | { kind: "value"; unclaimed: string; raw: string; scanner: JsonScanner }
  /** Inside one call object, streamed; `announced` once its name was sent; `bare`: at the start, without the tag. */
  | { kind: "stream"; unclaimed: string; reader: JsonCallReader; announced: boolean; bare: boolean };

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
    // 1. A bare candidate (streamed or held): calls if it is them as a whole, else ordinary text (may hold the tag).
    if (this.#state.kind === "stream" && this.#state.bare && !this.#state.announced) {
      this.#bareFallback(this.#state.reader.raw);
      if ((this.#state as Llama3State).kind === "text") this.#drain(out);
    }
    if (this.#state.kind === "bare") {
      const detector = this.#state.detector;
      const calls = detector.calls();
      this.#state = { kind: "text" };
      if (calls !== null) {
        this.#gaps.call();
        pushWhole(out, calls);
      } else {
        this.#pending = detector.text;
        this.#drain(out);
      }
    }
    // 2. An announced call stays a call, its arguments closed as produced so far; whatever else is unread or
    //    unclaimed is content (a value cut before it named a call is not one).
    const st = this.#state;
    if (st.kind === "stream" && st.announced) pushArgs(out, st.reader.closeArgs());
    const rest =
      st.kind === "value"
        ? st.unclaimed + st.raw
        : st.kind === "stream" && !st.announced
          ? st.unclaimed + st.reader.raw
          : st.kind === "gap" && !st.afterCall
            ? st.unclaimed
            : "";
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
          // A leading `{` streams as a call once it names a declared tool; a list is read whole.
          const first = this.#pending[0]!;
          const names = this.tools.map((t) => t.name);
          if (first === "{") this.#state = { kind: "stream", unclaimed: "", reader: new JsonCallReader(names), announced: false, bare: true };
          else this.#state = first === "[" ? { kind: "bare", detector: new BareCallDetector(this.tools) } : { kind: "text" };
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
            this.#state =
              first === "{"
                ? { kind: "stream", unclaimed, reader: new JsonCallReader(), announced: false, bare: false }
                : { kind: "value", unclaimed, raw: "", scanner: new JsonScanner() };
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
            pushWhole(out, calls);
            this.#state = { kind: "gap", unclaimed: "", afterCall: true };
          } else {
            out.content += this.#gaps.text(st.unclaimed + st.raw);
            this.#state = { kind: "text" };
          }
          continue;
        }
        case "stream":
          if (!this.#stream(st, out)) return;
          continue;
      }
    }
  }

  /** A bare candidate that cannot stream: the whole-output detector reads `raw` again, or it is text. */
  #bareFallback(raw: string): void {
    const detector = new BareCallDetector(this.tools);
    if (detector.push(raw)) {
      this.#state = { kind: "bare", detector };
      return;
    }
    this.#pending = detector.text + this.#pending;
    this.#state = { kind: "text" };
  }

  /** Feeds pending text to the streamed call object; false when all of it was consumed (more is needed). */
  #stream(st: Extract<Llama3State, { kind: "stream" }>, out: StageOutput): boolean {
    for (let i = 0; i < this.#pending.length; i++) {
      const step = st.reader.push(this.#pending[i]!);
      // 1. The name just closed: the call exists from here on.
      announceWhenNamed(st, this.#gaps, out);
      if (step === "more") continue;
      // 2. Not the streamed shape: re-read what was consumed as one whole value (at the start: a bare candidate).
      if (step === "giveUp" && st.bare) {
        this.#pending = this.#pending.slice(i);
        this.#bareFallback(st.reader.raw);
        return true;
      }
      if (step === "giveUp") {
        const scanner = new JsonScanner();
        for (const ch of st.reader.raw) scanner.push(ch);
        this.#state = { kind: "value", unclaimed: st.unclaimed, raw: st.reader.raw, scanner };
        this.#pending = this.#pending.slice(i);
        return true;
      }
      // 3. The object closed (more calls may follow), or broke after its name (the rest is text).
      pushArgs(out, st.reader.closeArgs());
      this.#state = step === "done" ? { kind: "gap", unclaimed: "", afterCall: true } : { kind: "text" };
      this.#pending = this.#pending.slice(step === "done" ? i + 1 : i);
      return true;
    }
    this.#pending = "";
    pushArgs(out, st.reader.takeArgs());
    return false;
  }
}
