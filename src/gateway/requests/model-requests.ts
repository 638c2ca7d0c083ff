/**
 * A served model's request path, as its model unit (models/model-set.ts) runs it: the request table and its output
 * processor, and the one place an {@link Outcome} is applied — first its events (to each HTTP request's writer, and
 * to metrics and logs), then its aborts, after the whole step. A client found gone while the events are delivered
 * (a write failed, its buffer overflowed) is an input like any other: its aborts join the step's and go out with
 * them, each engine request aborted once.
 */
import type { AddMessage, RequestErrorMessage, StepMessage } from "../../protocol/messages.js";
import type { KeelHttpError } from "../http/errors.js";
import type { ExitDecision } from "../supervision/recovery.js";
import type { ObservedEvent } from "./events.js";
import type { Phase } from "./lifecycle.js";
import { OutputProcessor, type Abort, type Child, type Outcome } from "./output-processor.js";
import { RequestRegistry, type Culprit } from "./registry.js";
import type { GenerationSession } from "./session/session.js";
import type { SessionEvent } from "./session/events.js";

/** Where an HTTP request's events go: its encoder and writer (generate.ts). */
export type Deliver = (events: readonly SessionEvent[]) => void;

export class ModelRequests {
  readonly table: RequestRegistry;
  readonly processor: OutputProcessor;
  /** Writers of the open HTTP requests, by request id. */
  private readonly writers = new Map<string, Deliver>();
  /** Aborts decided while an outcome's events are being delivered; applied right after them. */
  private pending: Abort[] = [];
  /** Set while an outcome is being applied (inputs that arrive meanwhile join it). */
  private applying = false;
  /**
   * When the step message being applied was read (performance.now() ms; 0 before the first): where a request's
   * `engine` phase of the first token ends and its `deliver` phase begins (keel_request_ttft_phase_seconds).
   */
  stepReadAt = 0;

  constructor(
    send: (msg: AddMessage | { v: number; type: "abort"; ids: string[] }) => boolean,
    /** Metrics and logs: they read every event. */
    private readonly observe: (ev: ObservedEvent) => void = () => undefined,
    /** The engine's step counter as last reported (0 when unknown). */
    currentStep: () => number = () => 0,
  ) {
    this.table = new RequestRegistry(send, currentStep);
    this.processor = new OutputProcessor(this.table);
  }

  /**
   * Open an HTTP request that came in on `route` (its children are submitted). False when the engine went away: it
   * failed with `unavailable`.
   */
  open(id: string, session: GenerationSession, children: readonly Child[], deliver: Deliver, unavailable: () => KeelHttpError, route: string): boolean {
    this.writers.set(id, deliver);
    let accepted = false;
    this.apply(() => {
      const out = this.processor.open(id, session, children, unavailable, route);
      accepted = out.accepted;
      return out;
    });
    if (session.ended) this.writers.delete(id);
    return accepted;
  }

  /** The client of HTTP request `id` left. */
  clientGone(id: string): void {
    this.writers.delete(id);
    this.apply(() => this.processor.clientGone(id));
  }

  /** One engine step. */
  handleStep(msg: StepMessage): void {
    this.stepReadAt = performance.now();
    this.apply(() => this.processor.process(msg));
  }

  /** The engine refused an add. */
  handleRequestError(msg: RequestErrorMessage): void {
    this.apply(() => this.processor.requestError(msg));
  }

  /** The engine exited: apply recovery's decision; returns the requests isolated as culprits. */
  applyEngineExit(d: ExitDecision): Culprit[] {
    let culprits: Culprit[] = [];
    this.apply(() => {
      const out = this.processor.engineExit(d);
      culprits = out.culprits;
      return out;
    });
    return culprits;
  }

  /** A (re)started engine is ready: resubmit what waits. */
  resumeRecovering(): void {
    this.apply(() => this.processor.resume());
  }

  /** End every live request with a 503 (drain timeout); returns how many were ended. */
  endAll(message: string): number {
    let ended = 0;
    this.apply(() => {
      const out = this.processor.endAll(message);
      ended = out.ended;
      return out;
    });
    return ended;
  }

  /** Live engine requests. */
  get size(): number {
    return this.table.size;
  }

  /** Engine requests waiting to be resubmitted after an engine death. */
  get recoveringCount(): number {
    return this.table.recoveringCount;
  }

  /** Live engine requests per phase. */
  counts(): { waiting: number; running: number } {
    return this.table.counts();
  }

  /** Phase of a live engine request, or null. */
  phase(id: string): Phase | null {
    return this.table.phase(id);
  }

  /**
   * Apply an outcome: 1. its events, to metrics and logs and to each HTTP request's writer; 2. its aborts and those
   * decided meanwhile (a client found gone), after every event was delivered; 3. what the aborts released, the same
   * way. An input arriving while an outcome is applied (a writer reporting its client gone) joins it.
   */
  private apply(run: () => Outcome): void {
    if (this.applying) {
      const nested = run();
      this.deliver(nested);
      this.pending.push(...nested.aborts);
      return;
    }
    this.applying = true;
    try {
      let out: Outcome | null = run();
      while (out) {
        this.deliver(out);
        const aborts: Abort[] = [...out.aborts, ...this.pending];
        this.pending = [];
        out = aborts.length > 0 ? this.processor.abort(aborts) : null;
      }
    } finally {
      this.applying = false;
    }
  }

  /** Deliver an outcome's events; a broken writer or observer fails nobody else. */
  private deliver(out: Outcome): void {
    // 1. The clients first: the step's tokens reach the sockets before metrics and logs take their turn.
    const observed = [...out.observed];
    for (const [id, events] of out.deliveries) {
      const write = this.writers.get(id);
      if (!write) continue;
      if (events.some((e) => e.type === "finished" || e.type === "failed")) this.writers.delete(id);
      try {
        write(events);
      } catch (err) {
        // A gateway-side exception while writing fails this request alone: its children are aborted with the rest.
        this.writers.delete(id);
        const failed = this.processor.writerFailed(id, err);
        observed.push(...failed.observed);
        try {
          write(failed.deliveries.get(id) ?? []);
        } catch {
          /* the writer is broken: the client cannot be told */
        }
        this.pending.push(...failed.aborts);
      }
    }
    // 2. Then metrics and logs, in the order the events happened.
    for (const ev of observed) {
      try {
        this.observe(ev);
      } catch {
        /* metrics/logging must never take a request or the gateway down */
      }
    }
  }
}
