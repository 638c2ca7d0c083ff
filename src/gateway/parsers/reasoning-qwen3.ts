/**
 * qwen3 reasoning: `<think>…</think>` at the start of the output is reasoning, the rest goes on to the tool stage.
 * When the prompt already opened `<think>` (Qwen3.5/3.6 templates, `reasoningOpen`), the output starts inside
 * reasoning. Reasoning without its `</think>` (cut, or a model that never closes) is reasoning to the end — OVMS
 * does that for the implicit start only; here an explicit `<think>` streams as reasoning too, and a stream cannot
 * take it back. The text is kept as written, no trimming. A tool-call opener inside reasoning (`callOpeners`:
 * `<tool_call>` …) followed by what can start a call is held with all that follows (a mere mention streams on): if `</think>` comes later it was a draft and all of it is
 * reasoning (reasoning models plan calls there); if the output ends first, reasoning ended at the opener (Qwen3.x
 * models are seen to call from an unterminated `<think>`) and the composed parser offers the held text to the tool
 * stage (index.ts), keeping it as reasoning when no call is in it; only whitespace before an opening `<think>` is dropped (and a `<think>` the model
 * repeats after the prompt opened one). Thinking switched off
 * (`<think>\n\n</think>\n\n` already in the prompt) means `reasoningOpen` false and an output of plain content.
 * `<think>` is recognised only at the start: a later mention of the tag is content.
 *
 * @module
 */
import { couldStartWith, findFirstTag, partialTagLength, skipSpace } from "./tag-scan.js";

const OPEN = "<think>";
const CLOSE = "</think>";

/** The first characters after an opener that can start a call (`<function=`: any name, so not listed). */
const CALL_STARTS: Readonly<Record<string, string>> = { "<tool_call>": "{[<", "<|python_tag|>": "{[" };

/** What one push made certain: reasoning text, and text for the next stage. */
export interface ReasoningSplit {
  reasoning: string;
  rest: string;
}

/** The end of the output: as a push, plus the text held from a call opener inside an unterminated block. */
export interface ReasoningEnd extends ReasoningSplit {
  /** From the opener to the end ("" when none): reasoning, unless the tool stage finds a call in it. */
  held: string;
}

/**
 * Where the output is relative to the reasoning block: "start" (maybe `<think>` next), "openStart" (the prompt
 * opened reasoning; a repeated `<think>` is dropped), "inside", "after".
 */
type ReasoningState = "start" | "openStart" | "inside" | "after";

export class Qwen3Reasoning {
  /** Position; the start states last only while the output is whitespace or a prefix of `<think>`. */
  #state: ReasoningState;
  /** Text received but not yet decided. */
  #pending = "";
  /** Text held from a call opener inside the block until `</think>` or the end decides it. */
  #held = "";
  /** The opener that started `held`. */
  #opener = "";
  /** What follows the held opener can start a call (until then, a mere mention is released at once). */
  #heldLooksLikeCall = false;

  constructor(
    /** The prompt ended with `<think>`: the output begins inside reasoning. */
    reasoningOpen: boolean,
    /** Tags that open a tool call in the tool stage's format (none without one). */
    private readonly callOpeners: readonly string[] = [],
  ) {
    this.#state = reasoningOpen ? "openStart" : "start";
  }

  push(text: string): ReasoningSplit {
    const out: ReasoningSplit = { reasoning: "", rest: "" };
    this.#pending += text;
    for (;;) {
      switch (this.#state) {
        case "start":
        case "openStart": {
          // 1. Whitespace, then `<think>` opens reasoning; anything else means there is none — or, when the prompt
          //    opened it, that the reasoning text has begun (a model repeating the `<think>` is not reasoning text).
          const i = skipSpace(this.#pending);
          const rest = this.#pending.slice(i);
          if (!couldStartWith(rest, OPEN)) {
            this.#state = this.#state === "start" ? "after" : "inside";
            continue;
          }
          if (rest.length < OPEN.length) return out;
          this.#pending = rest.slice(OPEN.length);
          this.#state = "inside";
          continue;
        }
        case "inside": {
          // 2a. Just after a held opener: a mention (not followed by what starts a call) is reasoning at once.
          if (this.#held !== "" && !this.#heldLooksLikeCall) {
            const i = skipSpace(this.#pending);
            if (i === this.#pending.length) {
              this.#held += this.#pending;
              this.#pending = "";
              return out;
            }
            if (CALL_STARTS[this.#opener]?.includes(this.#pending[i]!) ?? true) {
              this.#heldLooksLikeCall = true;
            } else {
              out.reasoning += this.#held;
              this.#held = "";
            }
          }
          // 2b. Reasoning up to `</think>`; hold only a suffix that could still become it (or a call opener).
          const tags = this.#held === "" ? [CLOSE, ...this.callOpeners] : [CLOSE];
          const hit = findFirstTag(this.#pending, tags);
          if (hit === null) {
            const cut = this.#pending.length - partialTagLength(this.#pending, tags);
            this.#reason(out, this.#pending.slice(0, cut));
            this.#pending = this.#pending.slice(cut);
            return out;
          }
          this.#reason(out, this.#pending.slice(0, hit.at));
          if (hit.tag !== CLOSE) {
            // A call opener: held from here (see the module comment).
            this.#held = hit.tag;
            this.#opener = hit.tag;
            this.#heldLooksLikeCall = false;
            this.#pending = this.#pending.slice(hit.at + hit.tag.length);
            continue;
          }
          // The block closed: what was held was a draft, reasoning.
          out.reasoning += this.#held;
          this.#held = "";
          this.#pending = this.#pending.slice(hit.at + CLOSE.length);
          this.#state = "after";
          continue;
        }
        case "after":
          // 3. Everything after the block belongs to the next stage.
          out.rest += this.#pending;
          this.#pending = "";
          return out;
      }
    }
  }

  /** End of output: undecided text is reasoning when inside the block, else text for the next stage. */
  finish(): ReasoningEnd {
    const pending = this.#pending;
    this.#pending = "";
    const inside = this.#state === "inside" || this.#state === "openStart";
    if (!inside) return { reasoning: "", rest: pending, held: "" };
    if (this.#held !== "") return { reasoning: "", rest: "", held: this.#held + pending };
    return { reasoning: pending, rest: "", held: "" };
  }

  /** Reasoning text, or held text while a call opener is held. */
  #reason(out: ReasoningSplit, text: string): void {
    if (this.#held === "") out.reasoning += text;
    else this.#held += text;
  }
}
