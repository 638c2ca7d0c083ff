/**
 * The terminal record of one HTTP request: what its one INFO log line says once the output processor forgets it (every
 * child released). It is gathered, as the request's events pass through the processor, from its children's table
 * events (first token, end) and its session's end (`finished` with the choices' reasons, or `failed`); nothing here
 * decides anything about the request.
 */
import type { AddMessage } from "../../protocol/messages.js";
import type { TableEvent } from "./events.js";
import type { SessionEvent } from "./session/events.js";

/** How an HTTP request ended, as its log line says it. */
export interface RequestRecord {
  requestId: string;
  /** The route it came in on (e.g. `/v3/chat/completions`). */
  route: string;
  /** Prompt tokens (each distinct prompt once, as the usage of an `n` request counts them). */
  promptTokens: number;
  /** Completion tokens over every choice. */
  completionTokens: number;
  /** Time to the first generated token from acceptance (ms), or null when none came. */
  ttftMs: number | null;
  /** From acceptance to the last child's end (ms). */
  e2eMs: number;
  /** Tokens generated after each choice's first, per second after the first token; null when there were none. */
  tokPerS: number | null;
  /** The choices' finish reasons (`stop`, `length`, `tool_calls`, joined by "," when they differ), `error` or `abort`. */
  finishReason: string;
  /** The client went away before its answer ended. */
  clientGone: boolean;
  /** The error its client was answered with (code, HTTP status, message), when it failed. */
  error?: { code: string; status: number; message: string };
  /** Engine steps from the abort to the release of its slowest cancelled child, when one was cancelled. */
  abortLatencySteps?: number;
}

/** What an HTTP request's events said so far, gathered for its {@link RequestRecord}. */
export class RequestTally {
  /**
   * Child id → the prompt it generates for (its text, or its token array): children of one prompt share its tokens in
   * the usage. The children of one prompt hold the same string: the key is no copy, and V8 hashes a string once.
   */
  private readonly promptOf = new Map<string, unknown>();
  /** Prompt tokens per prompt, from the children's ends. */
  private readonly promptTokens = new Map<unknown, number>();
  /** Completion tokens summed over the children's ends. */
  private completionTokens = 0;
  /** Earliest first token among the children (ms from acceptance), or null. */
  private ttftMs: number | null = null;
  /** Children that produced a first token. */
  private firstTokens = 0;
  /** Longest child from acceptance to its end (ms). */
  private e2eMs = 0;
  /** Largest abort latency of a cancelled child (steps), or null. */
  private abortSteps: number | null = null;
  /** How the session ended for its client: finished (usage and reasons), failed, or not yet / the client left. */
  private end: Extract<SessionEvent, { type: "finished" }> | Extract<SessionEvent, { type: "failed" }> | null = null;

  /** @param children the request's engine requests and their prompts; `route` the path it came in on */
  constructor(
    children: readonly { id: string; prompt: AddMessage["prompt"] }[],
    private readonly route: string,
  ) {
    for (const c of children) this.promptOf.set(c.id, "text" in c.prompt ? c.prompt.text : c.prompt.tokens);
  }

  /** A table event of one of the request's children. */
  child(ev: TableEvent): void {
    if (ev.type === "first_token") {
      this.firstTokens += 1;
      this.ttftMs = this.ttftMs === null ? ev.ttftMs : Math.min(this.ttftMs, ev.ttftMs);
    } else if (ev.type === "finished") {
      const prompt = this.promptOf.get(ev.id) ?? ev.id;
      this.promptTokens.set(prompt, Math.max(this.promptTokens.get(prompt) ?? 0, ev.usage.promptTokens));
      this.completionTokens += ev.usage.completionTokens;
      this.e2eMs = Math.max(this.e2eMs, ev.e2eMs);
      if (ev.abortLatencySteps !== undefined) this.abortSteps = Math.max(this.abortSteps ?? 0, ev.abortLatencySteps);
    }
  }

  /** Events the request's session produced (only its end is kept). */
  session(events: readonly SessionEvent[]): void {
    for (const ev of events) if (ev.type === "finished" || ev.type === "failed") this.end = ev;
  }

  /** The record, once every child was released. `clientGone`: the client left before its answer ended. */
  record(requestId: string, clientGone: boolean): RequestRecord {
    const end = this.end;
    // The usage the client was given when the session finished; else what the children's ends reported.
    const usage = end?.type === "finished" ? end.usage : { promptTokens: [...this.promptTokens.values()].reduce((s, n) => s + n, 0), completionTokens: this.completionTokens };
    const after = usage.completionTokens - this.firstTokens;
    const decodeMs = this.ttftMs === null ? 0 : this.e2eMs - this.ttftMs;
    return {
      requestId,
      route: this.route,
      ...usage,
      ttftMs: this.ttftMs,
      e2eMs: this.e2eMs,
      tokPerS: after > 0 && decodeMs > 0 ? Math.round((after / decodeMs) * 10_000) / 10 : null,
      finishReason: end === null ? "abort" : end.type === "failed" ? "error" : [...new Set(end.choices.map((c) => c.reason))].join(","),
      clientGone,
      ...(end?.type === "failed" ? { error: { code: end.error.code, status: end.error.status, message: end.error.message } } : {}),
      ...(this.abortSteps !== null ? { abortLatencySteps: this.abortSteps } : {}),
    };
  }
}
