/**
 * The gateway's request lifecycle: a discriminated union of states and named transitions.
 *
 *   queued ──admit──▶ prefill ──firstToken──▶ decode ──finish──▶ finished
 *     │                 │                        │
 *     └──── cancel ─────┴──────── cancel ────────┘──▶ cancelling ──release──▶ finished
 *     │                 │                        │
 *     └── engineDied ───┴────── engineDied ──────┘──▶ recovering ──resubmit──▶ queued
 *
 * `recovering` means the engine died while it held the request; the gateway kept what it needs (prompt and
 * generated token ids, sampling parameters, seed) and resubmits it as a continuation to the restarted engine.
 * `cancelling` means an abort was sent and the gateway keeps the request until the engine confirms the release
 * (SGLang #36876: the front end must not drop state before the engine does). A transition that does not apply to
 * the current state returns null and the caller ignores the event (late events are never asserted on).
 */

/** Where a request is when it is cancelled; also the `phase` label of the disconnect metric. */
export type Phase = "queued" | "prefill" | "decode";

/** Why the gateway cancels a request. */
export type CancelCause = "client_disconnect" | "stop_string" | "shutdown" | "internal_error";

import type { FinishReason } from "../protocol/messages.js";
/** How a request ended (defined once, in the protocol). */
export type { FinishReason };

export type Lifecycle =
  /** `add` sent; the engine has not admitted it to a sequence yet. */
  | { state: "queued" }
  /** Admitted to a sequence; its prompt is being prefilled. */
  | { state: "prefill" }
  /** At least one token generated. */
  | { state: "decode" }
  /** The engine died while holding the request (it was in `phase`); waiting to be resubmitted. */
  | { state: "recovering"; phase: Phase }
  /** Abort sent in `phase` because of `cause`; waiting for the engine's terminal event. */
  | { state: "cancelling"; phase: Phase; cause: CancelCause }
  /** Terminal: the engine released the request (or it never reached the engine). */
  | { state: "finished"; reason: FinishReason };

export const initial: Lifecycle = { state: "queued" };

/**
 * The engine admitted the request to a sequence. A request cancelled while queued can still be reported admitted —
 * the abort arrived during the (long) step that began its prefill — and then was in prefill when it was cancelled.
 */
export function admit(s: Lifecycle): Lifecycle | null {
  if (s.state === "queued") return { state: "prefill" };
  if (s.state === "cancelling" && s.phase === "queued") return { ...s, phase: "prefill" };
  return null;
}

/** The first token arrived. */
export function firstToken(s: Lifecycle): Lifecycle | null {
  return s.state === "prefill" || s.state === "queued" ? { state: "decode" } : null;
}

/** The engine process died while holding the request. A cancelling request is released by the death itself. */
export function engineDied(s: Lifecycle): Lifecycle | null {
  if (s.state === "queued" || s.state === "prefill" || s.state === "decode") return { state: "recovering", phase: s.state };
  return null;
}

/** The request was resubmitted to a restarted engine as a continuation. */
export function resubmit(s: Lifecycle): Lifecycle | null {
  return s.state === "recovering" ? { state: "queued" } : null;
}

/** The gateway decided to abort the request. Only a live, not yet cancelling request can be cancelled. */
export function cancel(s: Lifecycle, cause: CancelCause): Lifecycle | null {
  if (s.state === "queued" || s.state === "prefill" || s.state === "decode") return { state: "cancelling", phase: s.state, cause };
  // Not in any engine: no confirmation will come, so the registry ends it at once (RequestRegistry.cancel).
  if (s.state === "recovering") return { state: "cancelling", phase: s.phase, cause };
  return null;
}

/** The engine reported the request's terminal event. A cancelled request always ends as `abort` from the
 * client's side unless it was a stop string, which OpenAI reports as `stop`. */
export function finish(s: Lifecycle, reason: FinishReason): Lifecycle | null {
  if (s.state === "finished") return null;
  if (s.state === "cancelling") {
    return { state: "finished", reason: s.cause === "stop_string" ? "stop" : s.cause === "internal_error" ? "error" : "abort" };
  }
  return { state: "finished", reason };
}

/** Phase of a live state (for metrics), or null when finished. */
export function phaseOf(s: Lifecycle): Phase | null {
  switch (s.state) {
    case "queued":
    case "prefill":
    case "decode":
      return s.state;
    case "cancelling":
    case "recovering":
      return s.phase;
    case "finished":
      return null;
  }
}
