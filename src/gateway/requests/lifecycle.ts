/**
 * The gateway's request lifecycle: ONE discriminated union of states and named transitions. Everything the registry
 * knows about where a request is — whether an engine holds it, how many engine deaths it is suspected of, how much
 * progress it made since it was last (re)submitted — lives in these states; there are no side flags beside them.
 *
 *   queued ──admit──▶ prefill ──generated──▶ decode ──finish──▶ finished
 *     │                 │                       │
 *     └──── cancel ─────┴──────── cancel ───────┘──▶ cancelling ──finish / engineDied──▶ finished
 *     │                 │                       │
 *     └── engineDied ───┴────── engineDied ─────┘──▶ recovering ──resubmit──▶ queued
 *                                                      │  ├── cancel ──▶ finished (no engine holds it)
 *                                                      │  └── isolate ──▶ finished(error) (the engine's killer)
 *                                                      └── suspect ──▶ suspect ──resubmit (its test)──▶ queued
 *                                                                         ├── cancel ──▶ finished
 *                                                                         └── isolate ──▶ finished(error)
 *
 * `recovering` means the engine died while it held the request; the gateway kept what it needs (prompt and
 * generated token ids, sampling parameters, seed) and resubmits it as a continuation to the restarted engine.
 * `cancelling` means an abort was sent and the gateway keeps the request until the engine confirms the release
 * (SGLang #36876: the front end must not drop state before the engine does). A transition that does not apply to
 * the current state returns null and the caller ignores the event (late events are never asserted on).
 *
 * `suspect` means deaths repeated while the request was in flight: it waits, held by no engine, until recovery's
 * group testing (supervision/recovery.ts) resubmits it as part of a test of its own.
 *
 * Death accounting (culprit isolation, supervision/recovery.ts): `deaths` counts engine deaths the request was in flight for
 * and could have caused. It is carried by the states in which it means something (an engine holds the request, or
 * it waits to be resubmitted) and forgotten by {@link generated} once the request made {@link FORGIVE_AFTER_TOKENS}
 * tokens of progress since its last (re)submission: a culprit dies again before making progress.
 */
import type { FinishReason } from "../../protocol/messages.js";
/** How a request ended (defined once, in the protocol). */
export type { FinishReason };

/** Where a request is when it is cancelled; also the `phase` label of the disconnect metric. */
export type Phase = "queued" | "prefill" | "decode";

/**
 * Why the gateway cancels a request. `sibling_failed`: another choice of the same `n` request failed, so the
 * response has failed and this choice is released (an abort, not an error of its own). `guide_unsatisfiable`: the
 * engine dropped the request's guide while the client's logit_bias bans tokens (its bans left the guide nothing).
 */
export type CancelCause = "client_disconnect" | "stop_string" | "shutdown" | "internal_error" | "sibling_failed" | "guide_unsatisfiable";

/** Tokens of progress after a (re)submission that clear a request's death count. */
export const FORGIVE_AFTER_TOKENS = 8;

export type Lifecycle =
  /** `add` sent to the current engine; it has not admitted the request to a sequence yet. */
  | {
      state: "queued";
      /** Engine deaths this request was suspected of (in flight for) and not yet forgiven. */
      deaths: number;
    }
  /** Admitted to a sequence; its prompt is being prefilled. */
  | {
      state: "prefill";
      /** Engine deaths this request was suspected of and not yet forgiven. */
      deaths: number;
    }
  /** At least one token generated on the current engine. */
  | {
      state: "decode";
      /** Engine deaths this request was suspected of and not yet forgiven. */
      deaths: number;
      /** Tokens generated since the request was last (re)submitted to an engine. */
      sinceSubmit: number;
    }
  /** The engine died while holding the request (it was in `phase`); no engine holds it; waiting to be resubmitted. */
  | {
      state: "recovering";
      /** Phase it was in when the engine died. */
      phase: Phase;
      /** Engine deaths this request is suspected of, including the last one when it was blamed. */
      deaths: number;
    }
  /**
   * Like `recovering`, but suspected of killing the engine while a bisection runs: held back until recovery's group
   * testing resubmits it in a test of its own (never beside another test, so one culprit cannot frame it).
   */
  | {
      state: "suspect";
      /** Phase it was in when the engine died. */
      phase: Phase;
      /** Engine deaths this request is suspected of. */
      deaths: number;
    }
  /** Abort sent in `phase` because of `cause`; the engine still holds it until its terminal event. */
  | {
      state: "cancelling";
      /** Phase it was in when it was cancelled. */
      phase: Phase;
      /** Why the gateway cancelled it; decides the reason it is finished with. */
      cause: CancelCause;
    }
  /** Terminal: the engine released the request (or no engine held it). */
  | {
      state: "finished";
      /** How it ended. */
      reason: FinishReason;
    };

export type State = Lifecycle["state"];

export const initial: Lifecycle = { state: "queued", deaths: 0 };

/** True while an engine process holds the request (an abort must be sent to release it). */
export function heldByEngine(s: Lifecycle): boolean {
  return s.state === "queued" || s.state === "prefill" || s.state === "decode" || s.state === "cancelling";
}

/** Deaths a live request is suspected of (0 for cancelling and finished requests, which are never suspects). */
export function deathsOf(s: Lifecycle): number {
  return s.state === "queued" || s.state === "prefill" || s.state === "decode" || s.state === "recovering" || s.state === "suspect" ? s.deaths : 0;
}

/**
 * The engine admitted the request to a sequence. A request cancelled while queued can still be reported admitted —
 * the abort arrived during the (long) step that began its prefill — and then was in prefill when it was cancelled.
 */
export function admit(s: Lifecycle): Lifecycle | null {
  if (s.state === "queued") return { state: "prefill", deaths: s.deaths };
  if (s.state === "cancelling" && s.phase === "queued") return { ...s, phase: "prefill" };
  return null;
}

/**
 * `count` tokens were generated (0: text completed without a new token). Moves to `decode`; progress since the last
 * (re)submission of {@link FORGIVE_AFTER_TOKENS} tokens or more forgives earlier deaths.
 */
export function generated(s: Lifecycle, count: number): Lifecycle | null {
  if (s.state !== "queued" && s.state !== "prefill" && s.state !== "decode") return null;
  const sinceSubmit = (s.state === "decode" ? s.sinceSubmit : 0) + count;
  return { state: "decode", deaths: sinceSubmit >= FORGIVE_AFTER_TOKENS ? 0 : s.deaths, sinceSubmit };
}

/** The first token arrived (no token count known). */
export function firstToken(s: Lifecycle): Lifecycle | null {
  return s.state === "prefill" || s.state === "queued" ? generated(s, 0) : null;
}

/**
 * The engine process died while holding the request. `blamed`: the death is one this request could have caused
 * (see supervisor.ts deathBlame), so it counts one more death. A cancelling request is released by the death itself
 * and finishes as it would have on the engine's confirmation.
 */
export function engineDied(s: Lifecycle, blamed: boolean): Lifecycle | null {
  if (s.state === "queued" || s.state === "prefill" || s.state === "decode") return { state: "recovering", phase: s.state, deaths: s.deaths + (blamed ? 1 : 0) };
  if (s.state === "cancelling") return finish(s, "abort");
  return null;
}

/** True while the request waits, held by no engine, to be resubmitted (`recovering` or `suspect`). */
export function awaitingResubmit(s: Lifecycle): boolean {
  return s.state === "recovering" || s.state === "suspect";
}

/** Recovery holds a recovering request back as a suspect until its group test. */
export function suspect(s: Lifecycle): Lifecycle | null {
  return s.state === "recovering" ? { state: "suspect", phase: s.phase, deaths: s.deaths } : null;
}

/** The request was resubmitted to a restarted engine as a continuation. Its progress count starts again. */
export function resubmit(s: Lifecycle): Lifecycle | null {
  return awaitingResubmit(s) ? { state: "queued", deaths: deathsOf(s) } : null;
}

/** A waiting request was isolated as the one whose presence kills the engine: it ends with an error. */
export function isolate(s: Lifecycle): Lifecycle | null {
  return awaitingResubmit(s) ? { state: "finished", reason: "error" } : null;
}

/** Reason a request cancelled for `cause` ends with (OpenAI reports a stop string as `stop`). */
export function cancelledReason(cause: CancelCause): FinishReason {
  return cause === "stop_string" ? "stop" : cause === "internal_error" || cause === "guide_unsatisfiable" ? "error" : "abort";
}

/**
 * The gateway decided to abort the request. A request an engine holds goes to `cancelling` (the abort is sent and
 * its confirmation awaited); a recovering or suspect one is held by no engine, so it finishes at once. Cancelling or finished
 * requests are left alone.
 */
export function cancel(s: Lifecycle, cause: CancelCause): Lifecycle | null {
  if (s.state === "queued" || s.state === "prefill" || s.state === "decode") return { state: "cancelling", phase: s.state, cause };
  if (awaitingResubmit(s)) return { state: "finished", reason: cancelledReason(cause) };
  return null;
}

/** The engine reported the request's terminal event (or the gateway ends it). A cancelled request ends as its cause
 * says, whatever the engine reported. */
export function finish(s: Lifecycle, reason: FinishReason): Lifecycle | null {
  if (s.state === "finished") return null;
  if (s.state === "cancelling") return { state: "finished", reason: cancelledReason(s.cause) };
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
    case "suspect":
      return s.phase;
    case "finished":
      return null;
  }
}
