/**
 * Engine supervision, apart from the HTTP app: starts the engine process (through the configurable
 * {@link EngineCommand}), restarts it when it dies, kills it when it is stuck (watchdog), answers for readiness,
 * routes its messages to the model's request path, and feeds engine exits to recovery (supervision/recovery.ts), whose
 * decisions the request table applies; it keeps recovery's memory of prompts isolated as engine killers.
 */
import { TokenizeClient } from "./tokenize-client.js";
import type { Logger } from "pino";
import type { EngineCommand, EngineConfig } from "../../protocol/engine-config.js";
import type { GuideSpec, ReadyMessage, RequestErrorMessage, StepMessage } from "../../protocol/messages.js";
import { CHATML_TEMPLATE } from "../../model/chat-templates.js";
import { ChatTemplate } from "../models/chat-template.js";
import { EngineClient } from "./engine-client.js";
import { exitDecision, IsolatedPrompts, stallLimitMs, type WatchdogKill, type EngineExit, type ExitDecision } from "./recovery.js";
import { LoadProgressLines } from "./load-progress.js";
import { describeReady } from "./ready-line.js";
import type { Metrics } from "../metrics/metrics.js";
import { stepTrace, type StepObserver } from "../metrics/metrics-observer.js";
import type { Culprit } from "../requests/registry.js";

/** The request path the supervisor feeds with the engine's messages and exits (requests/model-requests.ts). */
export interface SupervisedRequests {
  handleStep(msg: StepMessage): void;
  handleRequestError(msg: RequestErrorMessage): void;
  /** Apply recovery's decision about an engine exit; returns the requests isolated as culprits. */
  applyEngineExit(d: ExitDecision): Culprit[];
  /** A (re)started engine is ready: resubmit what waits. */
  resumeRecovering(): void;
  /** Live engine requests. */
  readonly size: number;
  /** Engine requests waiting to be resubmitted. */
  readonly recoveringCount: number;
}

/**
 * Apply recovery's decision about an engine exit to the request table, and remember the prompts it isolated as
 * culprits (bounded in number and time) so that resending one is refused at admission without another crash.
 */
export function recoverFromExit(table: Pick<SupervisedRequests, "applyEngineExit">, isolated: IsolatedPrompts, decision: ExitDecision, now = Date.now()): void {
  isolated.addCulprits(table.applyEngineExit(decision), now);
}

/** Supervisor options. */
export interface SupervisorOptions {
  /** Engine start configuration (the mode is set per process). */
  engine: Omit<EngineConfig, "mode">;
  /** How to run the engine (default: node dist/engine/main.js). */
  engineCommand?: EngineCommand;
  /** No step progress for this long (ms) while there is work → the engine is killed and restarted. */
  stallMs: number;
  /** Ping period and readiness staleness (ms). */
  pingIntervalMs: number;
  readyStalenessMs: number;
  /** How long a prompt isolated as an engine killer stays refused (ms). */
  isolatedPromptTtlMs: number;
  /** Called after each engine reported ready (its template and limits are current), before requests resume. */
  onEngineReady?: (s: EngineSupervisor) => void;
}

export class EngineSupervisor {
  readonly engine: EngineClient;
  /** Resolves when the engine reported ready for the first time. */
  readonly firstReady: Promise<void>;
  /** Chat template of the current model; null until an engine reported ready. */
  template: ChatTemplate | null = null;
  /** Set once an engine reported ready: a 503 after that means restarting, not loading. */
  private wasReady = false;
  /** Set by stop(): exits are the shutdown's, not faults. */
  private stopping = false;
  /** Prompts isolated as engine killers (refused without running them, for a bounded time). */
  private readonly isolated: IsolatedPrompts;
  /** When the engine last made progress (a step), or work appeared; the watchdog compares against it. */
  private lastProgressAt = Date.now();
  /** When the current engine process died (for the recovery-time log), or null. */
  private diedAt: number | null = null;
  /** Set when the watchdog killed the engine: the exit is counted with reason "watchdog"; a stall blames the batch. */
  private killedByWatchdog: WatchdogKill = "none";
  /** Watchdog kills since the engine last made a step: one doubles the stall limit (recovery.ts, stallLimitMs). */
  private stallStreak = 0;
  /** The watchdog timer, or null when stopped. */
  private watchdog: NodeJS.Timeout | null = null;
  /** `/v3/tokenize` questions to the current engine, answered by id (rejected when the engine exits). */
  readonly tokenizer: TokenizeClient;

  constructor(
    private readonly opts: SupervisorOptions,
    private readonly requests: SupervisedRequests,
    private readonly steps: StepObserver,
    private readonly metrics: Metrics,
    private readonly log: Logger,
  ) {
    this.isolated = new IsolatedPrompts(opts.isolatedPromptTtlMs);
    this.tokenizer = new TokenizeClient((msg) => this.engine.send(msg));
    let resolveReady!: () => void;
    this.firstReady = new Promise<void>((r) => (resolveReady = r));
    this.engine = new EngineClient(
      {
        config: opts.engine,
        ...(opts.engineCommand ? { command: opts.engineCommand } : {}),
        pingIntervalMs: opts.pingIntervalMs,
        readyStalenessMs: opts.readyStalenessMs,
        restartMinMs: 100,
        restartMaxMs: 30_000,
      },
      {
        onReady: (msg) => {
          this.onReady(msg);
          resolveReady();
        },
        onMessage: (msg) => {
          switch (msg.type) {
            case "step":
              this.lastProgressAt = Date.now();
              this.stallStreak = 0;
              this.steps.observe(msg);
              if (this.log.isLevelEnabled("trace")) this.log.trace(stepTrace(msg), "engine step");
              this.requests.handleStep(msg);
              break;
            case "request_error":
              this.requests.handleRequestError(msg);
              break;
            case "tokenized":
              this.tokenizer.handle(msg);
              break;
            case "loading":
              this.logLoadProgress(msg.progress);
              break;
            case "protocol_error":
              this.log.error({ event: "protocol_error", error: msg.message }, "engine rejected a message");
              break;
            case "fatal":
              this.log.error({ event: "engine_fatal", error: msg.message }, "engine reported a fatal error");
              break;
            default:
              break;
          }
        },
        onExit: (exit) => this.onExit(exit),
        onLog: (line, stream) => {
          // Engine lines are JSON already; pass them through at their level.
          try {
            const parsed = JSON.parse(line) as { level?: string; msg?: string };
            const level = parsed.level === "fatal" || parsed.level === "error" ? "error" : parsed.level === "warn" ? "warn" : parsed.level === "debug" ? "debug" : "info";
            this.log[level]({ engine: parsed }, parsed.msg ?? "engine");
          } catch {
            this.log.info({ engineStream: stream }, line);
          }
        },
      },
    );
  }

  /** Spawn the engine and start the watchdog. */
  start(): void {
    this.engine.start();
    this.startWatchdog();
  }

  /** The engine reported ready and answered a ping recently. */
  get isReady(): boolean {
    return this.engine.isReady;
  }

  /** Why no engine is ready: `restarting` once one was ready before (a death or a stall), else `loading`. */
  get unavailableReason(): "loading" | "restarting" {
    return this.wasReady ? "restarting" : "loading";
  }

  /** Limits of the current engine, or null while none is ready. */
  get limits(): ReadyMessage["limits"] | null {
    return this.engine.ready?.limits ?? null;
  }

  /** The engine's step counter as last reported. */
  get currentStep(): number {
    return this.steps.lastStep;
  }

  /** True when this rendered prompt (with this guide) was isolated as an engine killer recently (answered without the engine). */
  isKnownCulprit(prompt: string, guide?: GuideSpec): boolean {
    return this.isolated.isKnownCulprit(prompt, guide);
  }

  /** Stop watching for stalls (a drain stops the engine itself). */
  stopWatchdog(): void {
    if (this.watchdog) clearInterval(this.watchdog);
    this.watchdog = null;
  }

  /** Stop the engine (no more restarts) and end whatever it did not release. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.stopWatchdog();
    await this.engine.stop();
    // Whatever the engine did not release (e.g. no engine was running) ends now, so no response stays open.
    this.requests.applyEngineExit({ kind: "shutdown" });
  }

  /** Which of the current load's progress reports are logged (its start, 100%, a tenth at most once a second). */
  private readonly loadLines = new LoadProgressLines();

  /** Log an engine's load progress (engines send finer `loading` messages than anyone wants to read). */
  private logLoadProgress(progress: number): void {
    if (!this.loadLines.take(progress)) return;
    this.log.info({ event: "engine_loading", progress }, `loading the model: ${Math.floor(progress * 100)}%`);
  }

  private onReady(msg: ReadyMessage): void {
    this.steps.engineStarted();
    const m = msg.model;
    try {
      this.template = new ChatTemplate(m.chatTemplate ?? CHATML_TEMPLATE, { bosToken: m.bosToken, eosToken: m.eosToken });
    } catch (err) {
      this.log.error({ err: (err as Error).message }, "the model's chat template does not parse; using ChatML");
      this.template = new ChatTemplate(CHATML_TEMPLATE, { bosToken: m.bosToken, eosToken: m.eosToken });
    }
    this.wasReady = true;
    this.lastProgressAt = Date.now();
    this.opts.onEngineReady?.(this);
    const recovering = this.requests.recoveringCount;
    this.loadLines.reset();
    const ready = describeReady(msg, this.opts.engine.kvCacheType);
    this.log.info({ event: "engine_ready", enginePid: msg.pid, model: m.path, limits: msg.limits, engine: msg.engine, capabilities: msg.capabilities, recovering, ...ready.fields }, ready.text);
    if (this.diedAt !== null) {
      this.log.info({ event: "engine_recovered", downtimeMs: Date.now() - this.diedAt, resuming: recovering }, "engine restarted; resuming in-flight requests");
      this.diedAt = null;
    }
    this.requests.resumeRecovering();
  }

  private onExit(exit: EngineExit): void {
    this.steps.engineGone();
    this.tokenizer.failAll("the engine process exited");
    this.loadLines.reset(); // the next engine's load is logged from its start, even if this one died while loading
    // Recovery decides what the exit means (supervision/recovery.ts); the request table applies it.
    const decision = exitDecision({ stopping: this.stopping, failedStarts: this.engine.failedStarts, exit, byWatchdog: this.killedByWatchdog });
    if (decision.kind === "shutdown") {
      this.requests.applyEngineExit(decision);
      return;
    }
    const { verdict } = decision;
    this.killedByWatchdog = "none";
    this.diedAt = Date.now();
    this.log.error({ event: "engine_exit", code: exit.code, signal: exit.signal, reason: verdict.reason, blame: verdict.blame, inFlight: this.requests.size }, "engine process exited; restarting and resuming");
    this.metrics.engineRestarts.inc({ reason: verdict.reason });
    if (decision.kind === "unrecoverable") {
      this.log.error({ event: "engine_unrecoverable", failedStarts: decision.failedStarts }, "the engine keeps failing to start; failing in-flight requests");
    }
    recoverFromExit(this.requests, this.isolated, decision);
  }

  /**
   * Three ways an engine can be stuck, each checked whether or not requests are waiting:
   *   stalled  — requests are in the engine but no step came for stallMs;
   *   deaf     — the engine reported ready but answered no ping for max(stallMs, 10 s) (frozen while idle);
   *   starting — an engine process has not reported ready within max(10 × stallMs, 60 s) of its start.
   * Any of them: kill it (SIGKILL), restart, resume — and blame nobody for that death.
   */
  private startWatchdog(): void {
    const stallMs = this.opts.stallMs;
    const startupLimitMs = Math.max(10 * stallMs, 60_000);
    this.watchdog = setInterval(() => {
      const engine = this.engine;
      const now = Date.now();
      const work = this.requests.size > this.requests.recoveringCount;
      if (!engine.ready || !work) this.lastProgressAt = now;
      // A long step also delays ping answers (the engine's loop is busy), so both limits back off together.
      const limitMs = stallLimitMs(stallMs, this.stallStreak);
      const stalled = engine.ready !== null && work && now - this.lastProgressAt > limitMs;
      const deaf = engine.ready !== null && now - engine.lastPong > Math.max(limitMs, 10_000);
      const starting = engine.ready === null && engine.pid !== null && now - engine.startedAt > startupLimitMs;
      if (stalled || deaf || starting) {
        const why = stalled ? "no step progress" : deaf ? "no answer to pings" : "did not become ready";
        this.log.error({ event: "engine_stalled", why, stalledMs: now - this.lastProgressAt, pongAgeMs: now - engine.lastPong, limitMs }, `engine stuck (${why}); killing it to restart and resume`);
        if (stalled || deaf) this.stallStreak += 1;
        this.killedByWatchdog = stalled ? "stalled" : "unresponsive";
        this.lastProgressAt = now;
        engine.kill();
      }
    }, Math.min(500, Math.max(50, stallMs / 4)));
    this.watchdog.unref();
  }
}
