/**
 * qwen3 reasoning: `<think>…</think>` at the start of the output is reasoning, the rest goes on to the tool stage.
 * When the prompt already opened `<think>` (Qwen3.5/3.6 templates, `reasoningOpen`), the output starts inside
 * reasoning. Reasoning without its `</think>` (cut, or a model that never closes) is reasoning to the end — OVMS
 * does that for the implicit start only; here an explicit `<think>` streams as reasoning too, and a stream cannot
 * take it back. Nothing inside reasoning is parsed (a `<tool_call>` there stays reasoning) and the text is kept
 * as written, no trimming; only whitespace before an opening `<think>` is dropped (and a `<think>` the model
 * repeats after the prompt opened one). Thinking switched off
 * (`<think>\n\n</think>\n\n` already in the prompt) means `reasoningOpen` false and an output of plain content.
 * `<think>` is recognised only at the start: a later mention of the tag is content.
 *
 * @module
 */
import { couldStartWith, findFirstTag, partialTagLength, skipSpace } from "./tag-scan.js";

const OPEN = "<think>";
const CLOSE = "</think>";

/** What one push made certain: reasoning text, and text for the next stage. */
export interface ReasoningSplit {
  reasoning: string;
  rest: string;
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

  constructor(
    /** The prompt ended with `<think>`: the output begins inside reasoning. */
    reasoningOpen: boolean,
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
          // 2. Reasoning up to `</think>`; hold only a suffix that could still become it.
          const hit = findFirstTag(this.#pending, [CLOSE]);
          if (hit === null) {
            const cut = this.#pending.length - partialTagLength(this.#pending, [CLOSE]);
            out.reasoning += this.#pending.slice(0, cut);
            this.#pending = this.#pending.slice(cut);
            return out;
          }
          out.reasoning += this.#pending.slice(0, hit.at);
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

  /** End of output: held text is reasoning when inside the block, else text for the next stage. */
  finish(): ReasoningSplit {
    const held = this.#pending;
    this.#pending = "";
    const inside = this.#state === "inside" || this.#state === "openStart";
    return inside ? { reasoning: held, rest: "" } : { reasoning: "", rest: held };
  }
}
