/**
 * The models a gateway serves, each with its own engine process, scheduler, request registry and limits (one
 * {@link ModelUnit} per model). A crash, hang or restart of one model's engine touches only its own unit: the other
 * units' registries, supervisors and engines are separate objects and processes.
 *
 * Requests route by name ({@link ModelSet.contextFor}); a reload ({@link ModelSet.apply}) starts added models,
 * drains removed ones (their streams finish, new requests 404) and gives a changed model a new engine that takes new
 * requests once ready while the old one finishes its streams.
 */
import type { GuideSpec } from "../../protocol/messages.js";
import type { Logger } from "pino";
import type { EngineCommand, EngineConfig } from "../../protocol/engine-config.js";
import { NO_AGENT_FLAGS, resolveAgentSettings, type AgentFlags, type AgentSettings } from "./agent-config.js";
import type { ChatTemplate } from "./chat-template.js";
import { needsToolInjection } from "./tool-prompt.js";
import { engineRestarting, notReady, shuttingDown } from "../http/errors.js";
import type { Metrics } from "../metrics/metrics.js";
import { requestObserver, StepObserver } from "../metrics/metrics-observer.js";
import { pickToolParser } from "../parsers/index.js";
import type { ToolParserName } from "../tools.js";
import { ModelRequests } from "../requests/model-requests.js";
import type { RequestRegistry } from "../requests/registry.js";
import { answersTo, MAX_UNREAD_BYTES, type ReadyEngine, type RouteContext } from "../http/route-context.js";
import { ISOLATED_PROMPT_TTL_MS } from "../supervision/recovery.js";
import { EngineSupervisor } from "../supervision/supervisor.js";

/** One model to serve: its name, engine start configuration and parsers. */
export interface ModelSpec {
  /** Served name (the `model` of requests). */
  name: string;
  /** Other names requests may use (the catalogue name given to `--model_path`); absent = none. */
  aliases?: readonly string[];
  /** Engine start configuration (the mode is set per process). */
  engine: Omit<EngineConfig, "mode">;
  /** `tool_parser`, `reasoning_parser`, `enable_tool_guided_generation` of this model. */
  agents: AgentFlags;
  /** Largest number of this model's requests waiting for a sequence before new ones get 429. */
  maxQueuedRequests: number;
  /** How to run this model's engine (`--engine`'s choice per model); absent = the set's shared command. */
  engineCommand?: EngineCommand;
  /** Which engine that is (for the start log); absent = not said. */
  engineName?: "llama.cpp" | "openvino";
}

/** What every unit shares: the server's settings, metrics and log. */
export interface ModelSetShared {
  engineCommand?: EngineCommand;
  stallMs: number;
  pingIntervalMs: number;
  readyStalenessMs: number;
  isolatedPromptTtlMs?: number;
  maxUnreadBytes?: number;
  metrics: Metrics;
  log: Logger;
  /** Name each unit's log lines with its model (set when several models may be served). */
  labelLogs: boolean;
  /** How long a reload waits for a new engine (default {@link REPLACEMENT_READY_MS}). */
  reloadReadyMs?: number;
}

/** Where a unit is in its life: serving (reachable by name) or retired (finishing its streams, then stopped). */
export type UnitState = { kind: "serving" } | { kind: "retired"; since: number } | { kind: "stopped" };

/** A model's own engine, supervisor and request path, and the route context requests for it use. */
export class ModelUnit {
  /**
   * This model's request path: its request table and output processor; it applies each outcome — events to the
   * writers and metrics, then the aborts, after the whole step.
   */
  readonly requests: ModelRequests;
  /** This model's request table (what gauges and the drain read). */
  readonly registry: RequestRegistry;
  readonly supervisor: EngineSupervisor;
  readonly steps: StepObserver;
  /** The context every route handler gets for this model's requests. */
  readonly ctx: RouteContext;
  /** Lifecycle: serving → retired (reload removed or replaced it) → stopped (its engine is down). */
  state: UnitState = { kind: "serving" };
  /** Chat template of this model's current engine; null until one reported ready. */
  private template: ChatTemplate | null = null;
  /** Parsing and guidance for this model (`tool_parser auto` resolved on each engine ready). */
  private agents: AgentSettings;
  /** Whether `tool_parser auto`'s outcome was logged (at the first engine ready). */
  private autoAnnounced = false;
  /** The format tools were last injected in (null = not injected; undefined = no engine ready yet), to log a change only. */
  private injectedAs: ToolParserName | null | undefined = undefined;

  constructor(
    readonly spec: ModelSpec,
    set: ModelSet,
    shared: ModelSetShared,
  ) {
    const { metrics } = shared;
    // `model_name`, not `model`: engine log lines already carry `model` (the file path).
    const log = shared.labelLogs ? shared.log.child({ model_name: spec.name }) : shared.log;
    this.agents = resolveAgentSettings(spec.agents, null, pickToolParser);
    this.steps = new StepObserver(metrics, spec.name);
    const requests: ModelRequests = new ModelRequests(
      (msg) => this.supervisor.engine.send(msg),
      requestObserver(metrics, log, () => requests.counts().waiting, spec.name),
      () => this.steps.lastStep,
    );
    this.requests = requests;
    this.registry = requests.table;
    this.supervisor = new EngineSupervisor(
      {
        engine: spec.engine,
        ...(spec.engineCommand ?? shared.engineCommand ? { engineCommand: spec.engineCommand ?? shared.engineCommand } : {}),
        stallMs: shared.stallMs,
        pingIntervalMs: shared.pingIntervalMs,
        readyStalenessMs: shared.readyStalenessMs,
        isolatedPromptTtlMs: shared.isolatedPromptTtlMs ?? ISOLATED_PROMPT_TTL_MS,
        onEngineReady: (s) => this.setTemplate(s.template, log),
      },
      requests,
      this.steps,
      metrics,
      log,
    );
    const supervisor = this.supervisor;
    this.ctx = {
      model: {
        name: spec.name,
        aliases: spec.aliases ?? [],
        created: set.startedAt,
        served: () => set.names(),
        agents: () => this.agents,
        requests,
        maxQueuedRequests: spec.maxQueuedRequests,
        maxUnreadBytes: shared.maxUnreadBytes ?? MAX_UNREAD_BYTES,
        isKnownCulprit: (prompt: string, guide?: GuideSpec) => supervisor.isKnownCulprit(prompt, guide),
      },
      engine: () => this.readyEngine(set),
      unavailable: () => this.unavailable(set),
      rejected: (reason) => {
        metrics.requestsRejected.inc({ reason });
        metrics.ovmsRejected.inc({ name: spec.name });
      },
      ttftPhase: (phase, seconds) => metrics.ttftPhase.observe({ phase }, seconds),
      log,
    };
  }

  /** This model's engine reported ready and answered a ping recently, and the server is not stopping. */
  isReady(set: ModelSet): boolean {
    return this.supervisor.isReady && set.stopping === null;
  }

  /** This model's engine as a route needs it while it is ready (and the server is not stopping), else null. */
  private readyEngine(set: ModelSet): ReadyEngine | null {
    const ready = this.supervisor.engine.ready;
    if (!this.isReady(set) || !ready || !this.template) return null;
    const tokenizer = this.supervisor.tokenizer;
    return {
      template: this.template,
      capabilities: ready.capabilities,
      maxModelLen: ready.limits.maxModelLen,
      maxNumSeqs: ready.limits.maxNumSeqs,
      vocabSize: ready.model.vocabSize,
      engineName: ready.engine,
      tokenize: (text, addSpecialTokens) => tokenizer.tokenize(text, addSpecialTokens),
    };
  }

  /** The 503 to answer while this model is not ready: loading, restarting after an engine fault, or shutting down. */
  unavailable(set: ModelSet) {
    if (set.stopping !== null) return shuttingDown();
    return this.supervisor.unavailableReason === "restarting" ? engineRestarting() : notReady();
  }

  /** OVMS's state of this model's version: AVAILABLE, LOADING (first load or a restart), UNLOADING (retired), END. */
  ovmsState(): "AVAILABLE" | "LOADING" | "UNLOADING" | "END" {
    if (this.state.kind === "stopped") return "END";
    if (this.state.kind === "retired") return "UNLOADING";
    return this.supervisor.isReady ? "AVAILABLE" : "LOADING";
  }

  private setTemplate(t: ChatTemplate | null, log: Logger): void {
    const before = this.agents.toolParser;
    this.agents = resolveAgentSettings(this.spec.agents ?? NO_AGENT_FLAGS, t?.source ?? null, pickToolParser);
    this.template = t === null ? null : this.withTools(t, log);
    if (this.template?.toolPrompt) this.agents = { ...this.agents, toolsInjected: true };
    // Said at the first engine ready, and again only when a new engine's template changes the outcome.
    const first = !this.autoAnnounced;
    if (t) this.autoAnnounced = true;
    if (t && this.spec.agents.toolParser === "auto" && (first || before !== this.agents.toolParser)) {
      if (this.agents.toolParser) log.info({ event: "tool_parser_resolved", toolParser: this.agents.toolParser }, `--tool_parser auto: the model's template uses ${this.agents.toolParser}`);
      else log.warn({ event: "tool_parser_unresolved" }, "--tool_parser auto: the model's chat template shows no tool-call format Keel knows; requests with tools will be refused (name a format, e.g. --tool_parser hermes3, to have the tools written into the system message)");
    }
  }

  /**
   * The template requests render with: where it cannot show tools and a tool parser is set, one that writes the
   * tools and the parser's call format into the messages (tool-prompt.ts). Logged at the first engine ready and when
   * a new engine's template changes the outcome.
   */
  private withTools(t: ChatTemplate, log: Logger): ChatTemplate {
    const format = this.agents.toolParser;
    const support = format === null ? null : t.toolSupport();
    const injected = format !== null && support !== null && needsToolInjection(support) ? format : null;
    if (injected !== this.injectedAs) {
      if (injected !== null) {
        log.info({ event: "tools_injected", model: this.spec.name, toolParser: injected, support }, `model ${this.spec.name}: the chat template does not show tools; tool definitions and the ${injected} call format are written into the system message`);
      } else if (format !== null) {
        log.info({ event: "tools_in_template", model: this.spec.name, toolParser: format }, `model ${this.spec.name}: the chat template shows tools; they are rendered by the template`);
        // The template teaches the model its own call format: a parser for another one reads its calls as text.
        const own = pickToolParser(t.source);
        if (own !== null && own !== format) log.warn({ event: "tool_parser_mismatch", model: this.spec.name, toolParser: format, templateFormat: own }, `model ${this.spec.name}: its chat template writes ${own} tool calls, but --tool_parser is ${format}: its calls will come back as text (serve it with --tool_parser ${own} or auto)`);
      }
    }
    this.injectedAs = injected;
    return injected === null ? t : t.withToolPrompt(injected);
  }
}

/** A model as `ops10`'s gauges and `/v1/config` read it. */
export interface ServedModelView {
  name: string;
  state: "AVAILABLE" | "LOADING" | "UNLOADING" | "END";
  registry: RequestRegistry;
  supervisor: EngineSupervisor;
  steps: StepObserver;
  spec: ModelSpec;
}

/** What a reload changed. */
export interface ReloadSummary {
  added: string[];
  removed: string[];
  replaced: string[];
  unchanged: string[];
}

/** Every model the gateway serves, by name, plus the retired units still finishing their streams. */
export class ModelSet {
  /** When the server started (unix seconds): the `created` of every model object. */
  readonly startedAt = Math.floor(Date.now() / 1000);
  /** Serving units by name, in config order (the first is the default for requests that name no valid model). */
  private readonly serving = new Map<string, ModelUnit>();
  /** Units taken out by a reload, finishing their in-flight requests before their engine stops. */
  private readonly retired = new Set<ModelUnit>();
  /** Set once the server drains or closes: every model answers 503 and readiness turns 503. */
  stopping: "draining" | "closing" | null = null;
  /** Reloads run one after another (each sees the state the previous one left). */
  private reloadChain: Promise<unknown> = Promise.resolve();
  /** Periodic check that stops retired units whose registries emptied (null when none is retired). */
  private retireTimer: NodeJS.Timeout | null = null;

  constructor(private readonly shared: ModelSetShared) {}

  /** Add a unit for each spec and start its engine (at server start). */
  startAll(specs: readonly ModelSpec[]): void {
    for (const spec of specs) {
      const unit = new ModelUnit(spec, this, this.shared);
      this.serving.set(spec.name, unit);
      unit.supervisor.start();
    }
  }

  /** Served names, in config order. */
  names(): string[] {
    return [...this.serving.keys()];
  }

  /** The serving unit of `name`, or undefined. */
  get(name: string): ModelUnit | undefined {
    return this.serving.get(name);
  }

  /** The first serving unit (the model of a single-model server). */
  first(): ModelUnit {
    const u = this.serving.values().next().value;
    if (!u) throw new Error("no model is served");
    return u;
  }

  /** Serving and retired units (every engine this gateway runs). */
  all(): ModelUnit[] {
    return [...this.serving.values(), ...this.retired];
  }

  /** Serving units. */
  servingUnits(): ModelUnit[] {
    return [...this.serving.values()];
  }

  /**
   * The route context for a request body: the named model's when the body names a served one, else the first
   * model's (its handler validates the body as before and answers 404 `model_not_found` naming the served models).
   */
  contextFor(body: unknown): RouteContext {
    const model = body !== null && typeof body === "object" ? (body as { model?: unknown }).model : undefined;
    const unit = typeof model === "string" ? this.lookup(model) : undefined;
    return (unit ?? this.first()).ctx;
  }

  /** The serving unit a request's `model` names: by served name first, else by alias; undefined for none. */
  lookup(name: string): ModelUnit | undefined {
    return this.serving.get(name) ?? this.servingUnits().find((u) => answersTo(u.ctx.model, name));
  }

  /** Every model with its registry and supervisor (serving ones first, then retired ones still finishing). */
  list(): ServedModelView[] {
    return this.all().map((u) => ({ name: u.spec.name, state: u.ovmsState(), registry: u.registry, supervisor: u.supervisor, steps: u.steps, spec: u.spec }));
  }

  /** Requests in flight over every unit. */
  get inFlight(): number {
    let n = 0;
    for (const u of this.all()) n += u.registry.size;
    return n;
  }

  /**
   * Apply a new list of models (a reload): added ones start, removed ones are retired (their streams finish; new
   * requests 404), a changed one gets a new unit that replaces the old one by name once its engine is ready, while the
   * old one finishes its streams. Resolves when every new engine reported ready.
   */
  apply(specs: readonly ModelSpec[]): Promise<ReloadSummary> {
    const run = this.reloadChain.then(() => this.applyNow(specs));
    this.reloadChain = run.catch(() => undefined);
    return run;
  }

  private async applyNow(specs: readonly ModelSpec[]): Promise<ReloadSummary> {
    const summary: ReloadSummary = { added: [], removed: [], replaced: [], unchanged: [] };
    const wanted = new Map(specs.map((s) => [s.name, s]));
    const waits: Promise<void>[] = [];
    // 1. Removed models: out of the name map at once (new requests 404), their engines finish what they hold.
    for (const [name, unit] of this.serving) {
      if (wanted.has(name)) continue;
      this.serving.delete(name);
      this.retire(unit);
      summary.removed.push(name);
    }
    // 2. Added and changed models: a new unit each. An added one is served at once (LOADING until ready); a changed
    //    one replaces the old unit by name only when its engine is ready, so requests never see a loading engine.
    const order: string[] = [];
    for (const spec of specs) {
      order.push(spec.name);
      const old = this.serving.get(spec.name);
      if (old && sameSpec(old.spec, spec)) {
        summary.unchanged.push(spec.name);
        continue;
      }
      const unit = new ModelUnit(spec, this, this.shared);
      unit.supervisor.start();
      if (!old) {
        this.serving.set(spec.name, unit);
        summary.added.push(spec.name);
        // Served (LOADING) whether or not it is ready in time; the answer waits for it within the bound.
        waits.push(readyWithin(unit, this.shared.reloadReadyMs ?? REPLACEMENT_READY_MS).then(() => undefined));
      } else {
        summary.replaced.push(spec.name);
        waits.push(
          readyWithin(unit, this.shared.reloadReadyMs ?? REPLACEMENT_READY_MS).then((ready) => {
            // Replaced only if the new engine came up and the old unit is still the one serving (and not stopping).
            if (!ready || this.serving.get(spec.name) !== old || this.stopping !== null) {
              if (!ready) this.shared.log.error({ event: "model_replacement_failed", model: spec.name, waitedMs: this.shared.reloadReadyMs ?? REPLACEMENT_READY_MS }, `model ${spec.name}: the new engine did not become ready; the old one keeps serving`);
              this.retire(unit);
              return;
            }
            this.serving.set(spec.name, unit);
            this.retire(old);
          }),
        );
      }
    }
    await Promise.all(waits);
    // 3. Keep config order (the first model is the default for bodies that name none).
    const byName = new Map(this.serving);
    this.serving.clear();
    for (const name of order) {
      const u = byName.get(name);
      if (u) this.serving.set(name, u);
    }
    this.shared.log.info({ event: "config_reloaded", ...summary }, "configuration reloaded");
    return summary;
  }

  /** Take a unit out of service: it finishes its in-flight requests, then its engine stops. */
  private retire(unit: ModelUnit): void {
    unit.state = { kind: "retired", since: Date.now() };
    this.retired.add(unit);
    this.shared.log.info({ event: "model_retiring", model: unit.spec.name, inFlight: unit.registry.size }, `model ${unit.spec.name}: old engine finishing its requests`);
    // The registry has no "emptied" event; a short periodic check stops units whose last request ended.
    this.retireTimer ??= setInterval(() => this.stopEmptyRetired(), 100);
  }

  /** 1. Stop each retired unit with nothing in flight; 2. stop checking once none is left. */
  private stopEmptyRetired(): void {
    for (const unit of this.retired) {
      if (unit.registry.size > 0) continue;
      this.retired.delete(unit);
      void unit.supervisor.stop().then(() => {
        unit.state = { kind: "stopped" };
        this.shared.log.info({ event: "model_stopped", model: unit.spec.name }, `model ${unit.spec.name}: old engine stopped`);
      });
    }
    if (this.retired.size === 0 && this.retireTimer) {
      clearInterval(this.retireTimer);
      this.retireTimer = null;
    }
  }

  /** End every unit's requests with `message` (drain timeout); returns how many were ended. */
  endAll(message: string): number {
    let n = 0;
    for (const u of this.all()) n += u.requests.endAll(message);
    return n;
  }

  /** Stop every engine (serving and retired). */
  async stopAll(): Promise<void> {
    if (this.retireTimer) clearInterval(this.retireTimer);
    this.retireTimer = null;
    const units = this.all();
    this.retired.clear();
    await Promise.all(units.map((u) => u.supervisor.stop()));
  }
}

/** How long a reload waits for a new engine; a changed model's old engine keeps serving if the new one is not ready by then (ms). */
export const REPLACEMENT_READY_MS = 120_000;

/** True when the unit's engine reported ready within `ms`, false when it did not. */
function readyWithin(unit: ModelUnit, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<boolean>((r) => (timer = setTimeout(() => r(false), ms)));
  return Promise.race([unit.supervisor.firstReady.then(() => true), late]).finally(() => clearTimeout(timer));
}

/** Two specs start the same engine with the same parsers and limits. */
export function sameSpec(a: ModelSpec, b: ModelSpec): boolean {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canonical);
  if (v !== null && typeof v === "object") return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical((v as Record<string, unknown>)[k])]));
  return v;
}
