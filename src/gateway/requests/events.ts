/**
 * What the request table reports about each engine request (one child of an HTTP request), in order: the one typed
 * stream between the engine's messages and everything that reads them. The output processor
 * (output-processor.ts) turns these into each HTTP request's {@link SessionEvent}s (what the API encoders write) and
 * its abort decisions; metrics and request logs (metrics/metrics-observer.ts) read the same events. Nothing in the
 * table calls back into a layer above it.
 */
import type { PositionLogprobs } from "../../protocol/messages.js";
import type { KeelHttpError } from "../http/errors.js";
import type { CancelCause, FinishReason, Phase } from "./lifecycle.js";
import type { RequestRecord } from "./request-record.js";

/** Token counts of a request (tokens). */
export interface Usage {
  promptTokens: number;
  completionTokens: number;
}

/** The error a request ended with: its code, its message, and what its client is answered (when known). */
export interface RequestError {
  code: string;
  message: string;
  httpError?: KeelHttpError;
}

export type TableEvent =
  /** The request was handed to the engine's queue. */
  | { type: "queued"; id: string }
  /**
   * The engine admitted the request to a sequence (its prefill starts) with a prompt of `promptTokens` tokens.
   * `first`: the first admission's queue time (ms) and prompt tokens reused from the prefix cache (null when it is
   * resumed). `live`: false when the request is being cancelled (its client is not told).
   */
  | { type: "admitted"; id: string; promptTokens: number; first: { queueMs: number; cachedTokens: number } | null; live: boolean }
  /** The engine stopped constraining this request (`RequestOutput.guideDropped`): it goes on unconstrained. */
  | { type: "guide_dropped"; id: string; reason: string; /** The request ends here (a 400: its logit_bias left the guide nothing) rather than going on unconstrained. */ ends: boolean }
  /** New tokens and the text they completed (text may be "" while a character is incomplete). */
  | { type: "output"; id: string; tokens: number[]; text: string; logprobs?: PositionLogprobs[]; textEnds?: number[] }
  /** The first generated token: time to first token from acceptance (ms). */
  | { type: "first_token"; id: string; ttftMs: number }
  /** Later tokens: how many, and the mean inter-token latency over them (ms). */
  | { type: "tokens"; id: string; count: number; itlMs: number }
  /** The gateway cancelled the request in `phase`, for `cause`. */
  | { type: "cancelled"; id: string; phase: Phase; cause: CancelCause }
  /**
   * The request ended and the table forgot it. `released`: the gateway had cancelled it itself, so its client is not
   * told (its phase is known only now when the abort came during the step that admitted it). `refused`: the engine
   * refused it as invalid (a 4xx; not counted as finished).
   */
  | {
      type: "finished";
      id: string;
      reason: FinishReason;
      usage: Usage;
      phase: Phase | null;
      e2eMs: number;
      abortLatencySteps?: number;
      error?: RequestError;
      released: boolean;
      refused: boolean;
    }
  /**
   * The gateway ends the live request for its client with `error` (a shutdown, an internal error): it is to be
   * aborted for `cause` (the output processor decides it, applied after the operation), and its release from the
   * engine follows as a `finished` with `released`.
   */
  | { type: "ended"; id: string; usage: Usage; error: RequestError; cause: CancelCause }
  /** The request was resubmitted to a restarted engine as a continuation. */
  | { type: "resumed"; id: string; generatedTokens: number; deaths: number }
  /** The request was isolated as the one whose presence kills the engine. */
  | { type: "culprit"; id: string; deaths: number }
  /** A gateway-side exception while serving the request (it fails alone). */
  | { type: "internal_error"; id: string; message: string };

/** What the output processor reports about an HTTP request besides its children's table events (for logs and metrics). */
export type RequestNote =
  /** The client left; `children` engine requests are being released. */
  | { type: "client_disconnect"; requestId: string; children: number }
  /** Every child of a client that left was released; `phase` is the furthest they had reached (null: none held). */
  | { type: "client_disconnect_released"; requestId: string; phase: Phase | null }
  /** The HTTP request's terminal record: every child was released and the processor forgot it (its one log line). */
  | ({ type: "request_done" } & RequestRecord);

/** Everything metrics and logs read. */
export type ObservedEvent = TableEvent | RequestNote;
