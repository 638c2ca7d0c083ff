/**
 * The output processor of one served model: where a request's fate is decided, with the lifecycle (lifecycle.ts).
 * It owns the request table (registry.ts: engine requests and their lifecycle) and one {@link GenerationSession}
 * per HTTP request (its `n` children, detokenised text, stop strings, output parsers, logprobs, usage). Every input —
 * an engine step, a refusal, an engine exit, a ready engine, a client that left, a shutdown — goes through the table,
 * and the table's events are routed to the sessions; the answer is an {@link Outcome}: the events for each HTTP
 * request (what its encoder writes), the engine requests to abort, and everything metrics and logs read.
 *
 * Nothing here writes to a client or sends an abort while an input is being processed: the caller (model-requests.ts)
 * delivers the outcome's events and then applies its aborts ({@link OutputProcessor.abort}), after the whole step.
 */
import type { AddMessage, RequestErrorMessage, SamplingParams, StepMessage } from "../../protocol/messages.js";
import { engineError, type KeelHttpError } from "../http/errors.js";
import type { ExitDecision } from "../supervision/recovery.js";
import type { ObservedEvent, TableEvent } from "./events.js";
import type { CancelCause, Phase } from "./lifecycle.js";
import { RequestRegistry, type Culprit } from "./registry.js";
import { RequestTally } from "./request-record.js";
import type { GenerationSession } from "./session/session.js";
import type { SessionEvent, SessionStep } from "./session/events.js";

/** An engine request to abort, and why. */
export interface Abort {
  id: string;
  cause: CancelCause;
}

/** What processing one input decided. */
export interface Outcome {
  /** Events for each HTTP request (by its id), in order: what its encoder writes. */
  deliveries: Map<string, SessionEvent[]>;
  /** Engine requests to abort once the events were delivered (the caller applies them with {@link OutputProcessor.abort}). */
  aborts: Abort[];
  /** Everything metrics and logs read, in order. */
  observed: ObservedEvent[];
}

/** One engine request of an HTTP request (a choice). */
export interface Child {
  id: string;
  prompt: AddMessage["prompt"];
  params: SamplingParams;
}

/** Where an HTTP request's client is: connected, or gone with the children being released for it. */
type ClientState =
  | { state: "connected" }
  | {
      state: "gone";
      /** Children whose release is awaited. */
      releasing: Set<string>;
      /** Phases the children were released in (the disconnect is counted in the furthest). */
      phases: (Phase | null)[];
    };

/** Processor record of one HTTP request. */
interface HttpRequest {
  readonly id: string;
  /** The request's session: the pure state machine from its children's events to its encoder's events. */
  readonly session: GenerationSession;
  /** Children the table still holds. */
  readonly live: Set<string>;
  /** Whether its client is still there (see {@link ClientState}). */
  client: ClientState;
  /** What its events said so far, for its terminal record (logged once the table holds none of its children). */
  readonly tally: RequestTally;
}

/** The most advanced phase among children (for the disconnect metric). */
function furthest(phases: (Phase | null)[]): Phase | null {
  for (const p of ["decode", "prefill", "queued"] as const) if (phases.includes(p)) return p;
  return null;
}

export class OutputProcessor {
  /** HTTP requests with a child in the table, by request id. */
  private readonly requests = new Map<string, HttpRequest>();
  /** Child (engine request) id → its HTTP request. */
  private readonly owner = new Map<string, HttpRequest>();

  constructor(readonly table: RequestRegistry) {}

  /**
   * A new HTTP request (on `route`): submit one engine request per child. When the engine refuses one (it went away
   * since the readiness check), the request fails with `unavailable` and the children already submitted are released.
   */
  open(id: string, session: GenerationSession, children: readonly Child[], unavailable: () => KeelHttpError, route: string): Outcome & { accepted: boolean } {
    const req: HttpRequest = { id, session, live: new Set(), client: { state: "connected" }, tally: new RequestTally(children, route) };
    this.requests.set(id, req);
    let accepted = true;
    for (const c of children) {
      if (!this.table.submit(c.id, c.prompt, c.params)) {
        accepted = false;
        break;
      }
      req.live.add(c.id);
      this.owner.set(c.id, req);
    }
    const out = this.route(this.table.drain());
    if (!accepted) this.take(out, req, session.fail(unavailable()), "sibling_failed");
    this.forgetIfDone(out, req);
    return { ...out, accepted };
  }

  /** One engine step. */
  process(step: StepMessage): Outcome {
    this.table.handleStep(step);
    return this.route(this.table.drain());
  }

  /** The engine refused an add. */
  requestError(msg: RequestErrorMessage): Outcome {
    this.table.handleRequestError(msg);
    return this.route(this.table.drain());
  }

  /** The engine exited: apply recovery's decision (the requests it isolated as culprits come back with it). */
  engineExit(d: ExitDecision): Outcome & { culprits: Culprit[] } {
    const culprits = this.table.applyEngineExit(d);
    return { ...this.route(this.table.drain()), culprits };
  }

  /** A (re)started engine is ready: the waiting requests are resubmitted. */
  resume(): Outcome {
    this.table.resumeRecovering();
    return this.route(this.table.drain());
  }

  /** End every live request with a 503 (shutdown). */
  endAll(message: string): Outcome & { ended: number } {
    const ended = this.table.endAll(message);
    return { ...this.route(this.table.drain()), ended };
  }

  /** The client of HTTP request `id` left: every child still in the engine is released (an input like any other). */
  clientGone(id: string): Outcome {
    const out = empty();
    const req = this.requests.get(id);
    if (!req || req.session.ended) return out;
    const step = req.session.clientGone();
    req.client = { state: "gone", releasing: new Set(step.abort), phases: [] };
    out.observed.push({ type: "client_disconnect", requestId: id, children: step.abort.length });
    this.take(out, req, step, "client_disconnect");
    return out;
  }

  /**
   * Writing HTTP request `id`'s events failed (a gateway-side exception): the request fails alone — its client is
   * told if it still can be, and every child still in the engine is aborted.
   */
  writerFailed(id: string, err: unknown): Outcome {
    const out = empty();
    const message = `internal error while serving the request: ${(err as Error)?.message ?? String(err)}`;
    out.observed.push({ type: "internal_error", id, message });
    const req = this.requests.get(id);
    if (req) this.take(out, req, req.session.fail(engineError(message)), "internal_error");
    return out;
  }

  /** Apply aborts decided by earlier outcomes (each engine request is aborted once: a cancel is idempotent). */
  abort(aborts: readonly Abort[]): Outcome {
    for (const a of aborts) this.table.cancel(a.id, a.cause);
    return this.route(this.table.drain());
  }

  /** Route the table's events to the sessions of their HTTP requests. */
  private route(events: readonly TableEvent[]): Outcome {
    const out = empty();
    for (const ev of events) {
      out.observed.push(ev);
      const req = this.owner.get(ev.id);
      if (!req) continue;
      req.tally.child(ev);
      try {
        this.input(out, req, ev);
      } catch (err) {
        this.failLocally(out, req, ev, err);
      }
      if (ev.type === "finished") {
        this.owner.delete(ev.id);
        req.live.delete(ev.id);
        this.forgetIfDone(out, req);
      }
    }
    return out;
  }

  /** One table event of a child of `req`: what its session makes of it. */
  private input(out: Outcome, req: HttpRequest, ev: TableEvent): void {
    switch (ev.type) {
      case "admitted":
        if (ev.live) this.take(out, req, req.session.admitted(ev.id, ev.promptTokens), "stop_string");
        return;
      case "output":
        this.take(out, req, req.session.output(ev.id, ev.tokens, ev.text, ev.logprobs, ev.textEnds), "stop_string");
        return;
      case "ended":
        out.aborts.push({ id: ev.id, cause: ev.cause });
        this.take(out, req, req.session.finish(ev.id, "error", ev.usage, ev.error), "sibling_failed");
        return;
      case "finished":
        if (!ev.released) this.take(out, req, req.session.finish(ev.id, ev.reason, ev.usage, ev.error), "sibling_failed");
        else this.released(out, req, ev.id, ev.phase);
        return;
      default:
        return;
    }
  }

  /**
   * A gateway-side exception while serving one child fails only its HTTP request: the child is aborted and the
   * client told (guarded: the session may be what failed). A failure on a finished child is only reported.
   */
  private failLocally(out: Outcome, req: HttpRequest, ev: TableEvent, err: unknown): void {
    const why = (err as Error)?.message ?? String(err);
    if (ev.type === "finished") {
      out.observed.push({ type: "internal_error", id: ev.id, message: `session failed: ${why}` });
      return;
    }
    const message = `internal error while serving the request: ${why}`;
    out.observed.push({ type: "internal_error", id: ev.id, message });
    out.aborts.push({ id: ev.id, cause: "internal_error" });
    try {
      const usage = { promptTokens: this.table.promptLength(ev.id), completionTokens: 0 };
      this.take(out, req, req.session.finish(ev.id, "error", usage, { message }), "sibling_failed");
    } catch {
      /* the session is broken; the abort already is decided */
    }
  }

  /** A child the gateway cancelled was released; once a gone client's children all are, its disconnect is counted. */
  private released(out: Outcome, req: HttpRequest, id: string, phase: Phase | null): void {
    if (req.client.state !== "gone" || !req.client.releasing.delete(id)) return;
    req.client.phases.push(phase);
    if (req.client.releasing.size > 0) return;
    out.observed.push({ type: "client_disconnect_released", requestId: req.id, phase: furthest(req.client.phases) });
  }

  /** Add a session step to the outcome: its events for `req`, its aborts with `cause`. */
  private take(out: Outcome, req: HttpRequest, step: SessionStep, cause: CancelCause): void {
    req.tally.session(step.events);
    if (step.events.length > 0) {
      const list = out.deliveries.get(req.id);
      if (list) list.push(...step.events);
      else out.deliveries.set(req.id, [...step.events]);
    }
    for (const id of step.abort) out.aborts.push({ id, cause });
  }

  /**
   * Forget an HTTP request once the table holds none of its children: its fate is sealed, and its terminal record
   * (the one line logged per request) is made here, once.
   */
  private forgetIfDone(out: Outcome, req: HttpRequest): void {
    if (req.live.size > 0 || !this.requests.delete(req.id)) return;
    out.observed.push({ type: "request_done", ...req.tally.record(req.id, req.client.state === "gone") });
  }
}

/** An outcome with nothing in it. */
function empty(): Outcome {
  return { deliveries: new Map(), aborts: [], observed: [] };
}
