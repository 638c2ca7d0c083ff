/**
 * The gateway's side of the protocol's `tokenize` / `tokenized` pair: one pending promise per question, answered by
 * id. A question the engine never answers (it died, or restarted) is rejected after a timeout, so `/v3/tokenize`
 * never hangs.
 */
import { PROTOCOL_VERSION, type TokenizedMessage, type TokenizeMessage } from "../../protocol/messages.js";

/** How long a tokenize question may stay unanswered (ms). */
export const TOKENIZE_TIMEOUT_MS = 10_000;

export class TokenizeClient {
  /** Questions waiting for their answer, by id. */
  readonly #pending = new Map<string, { resolve(tokens: number[]): void; reject(err: Error): void; timer: NodeJS.Timeout }>();
  /** Counter for question ids (unique per gateway). */
  #next = 0;

  constructor(private readonly send: (msg: TokenizeMessage) => boolean) {}

  /** Ask the engine; rejects when no engine is connected, it reports an error, or the answer times out. */
  tokenize(text: string, addSpecialTokens: boolean): Promise<number[]> {
    const id = `tok-${++this.#next}`;
    return new Promise<number[]>((resolve, reject) => {
      if (!this.send({ v: PROTOCOL_VERSION, type: "tokenize", id, text, addSpecialTokens })) {
        reject(new Error("no engine is connected"));
        return;
      }
      const timer = setTimeout(() => {
        this.#pending.delete(id);
        reject(new Error("the engine did not answer in time"));
      }, TOKENIZE_TIMEOUT_MS);
      timer.unref();
      this.#pending.set(id, { resolve, reject, timer });
    });
  }

  /** Deliver an engine answer; answers to unknown ids are ignored (late events, docs/design-rules.md). */
  handle(msg: TokenizedMessage): void {
    const p = this.#pending.get(msg.id);
    if (!p) return;
    this.#pending.delete(msg.id);
    clearTimeout(p.timer);
    if ("tokens" in msg) p.resolve(msg.tokens);
    else p.reject(new Error(msg.error));
  }

  /** The engine died: nobody will answer the pending questions. */
  failAll(reason: string): void {
    for (const [id, p] of this.#pending) {
      clearTimeout(p.timer);
      this.#pending.delete(id);
      p.reject(new Error(reason));
    }
  }
}
