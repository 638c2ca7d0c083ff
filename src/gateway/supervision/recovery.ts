/**
 * Recovery: every verdict about an engine death in one place. It decides; it never acts:
 *   - {@link deathVerdict}: why the engine died and whether the requests it held can be blamed for it;
 *   - {@link exitDecision}: what an exit means — the shutdown's, the failed-start cut-off ({@link MAX_FAILED_STARTS}:
 *     the waiting requests are failed), or a restart whose requests are resumed;
 *   - {@link SuspectTests}: group testing of the suspects once deaths repeat (which suspects are resubmitted as the
 *     next test, who is charged with a death, who is the culprit);
 *   - {@link IsolatedPrompts}: the memory of prompts isolated as engine killers, refused at admission for a while.
 * The request table (requests/registry.ts) applies the decisions through the lifecycle's named transitions
 * (requests/lifecycle.ts: `recovering`, `suspect`, `isolate`); the supervisor feeds the exits in.
 */
import { createHash } from "node:crypto";
import type { GuideSpec } from "../../protocol/messages.js";

/** Engine processes in a row that die before reporting ready, after which waiting requests are failed. */
export const MAX_FAILED_STARTS = 5;

/** Default time a prompt isolated as an engine killer stays refused (ms). */
export const ISOLATED_PROMPT_TTL_MS = 10 * 60_000;

/** Deaths after which a request that died alone is isolated as the engine's killer (failed with `engine_fault`). */
export const FAULT_THRESHOLD = 2;

/** Signals that come from outside the engine's own code (an operator, an OOM killer, a shutdown). */
const EXTERNAL_SIGNALS = new Set<string>(["SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"]);

/** How an engine process ended. */
export interface EngineExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** Set when the engine client killed the process because it broke the protocol (engine-client.ts). */
  fault?: { kind: "protocol"; message: string } | null;
}

/** The most the watchdog's stall limit grows to, as a multiple of `--engine_stall_timeout` (see {@link stallLimitMs}). */
export const MAX_STALL_BACKOFF = 2;

/**
 * How long the watchdog waits for a step (or a ping answer) before it kills the engine: `--engine_stall_timeout`,
 * doubled after a watchdog kill that no step followed (up to {@link MAX_STALL_BACKOFF} times). A CPU so
 * overloaded that one prefill step outlasts the limit gets a longer try at the same step (stalls are blamed, so
 * without it such a request would be isolated as a culprit); a step resets the streak. Kept small because a request
 * that truly wedges the engine keeps every other request waiting for these limits until it is isolated.
 * @param stallMs - the configured limit (ms).
 * @param streak - watchdog kills since the last step.
 */
export function stallLimitMs(stallMs: number, streak: number): number {
  return stallMs * Math.min(MAX_STALL_BACKOFF, 2 ** Math.max(0, streak));
}

/** Why an engine process died, for the restart metric, and whether the requests it held can be charged with it. */
export interface DeathVerdict {
  reason: "watchdog" | "protocol" | "signal" | "exit";
  /**
   * True when a request in the batch can have caused the death: the engine aborted or crashed by itself (SIGABRT
   * from a GGML_ASSERT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, or a non-zero exit after an uncaught error), or the
   * watchdog killed it because a step with requests in it never ended (`stalled`: a request such as a grammar whose
   * matching explodes can wedge the engine; blamed, it is isolated after {@link FAULT_THRESHOLD} such deaths instead
   * of being resumed into the same stall forever — the stall limit backs off meanwhile, see {@link stallLimitMs}, so a
   * step that is merely slow finishes on the next try). False for the watchdog's kill of an engine that stopped
   * answering while idle or never became ready, for signals sent from outside (SIGKILL — what an OOM killer sends —, SIGTERM, SIGINT,
   * SIGHUP, SIGQUIT), for the kill of an engine that sent a frame breaking the protocol (`protocol`: an engine
   * bug, not a request's), and for a clean exit: no request can earn a refusal from those.
   */
  blame: boolean;
}

/**
 * Whether, and why, the watchdog killed the engine: `stalled` — requests were in it and no step came;
 * `unresponsive` — no answer to pings while idle, or never ready.
 */
export type WatchdogKill = "none" | "stalled" | "unresponsive";

/** Classify an engine exit (see {@link DeathVerdict}). */
export function deathVerdict(exit: EngineExit, byWatchdog: WatchdogKill): DeathVerdict {
  if (byWatchdog !== "none") return { reason: "watchdog", blame: byWatchdog === "stalled" };
  if (exit.fault) return { reason: "protocol", blame: false };
  if (exit.signal) return { reason: "signal", blame: !EXTERNAL_SIGNALS.has(exit.signal) };
  return { reason: "exit", blame: exit.code !== 0 && exit.code !== null };
}

/**
 * What an engine exit means for the requests the gateway holds:
 *   shutdown      — the gateway stopped the engine: every request ends with `shutting_down`;
 *   unrecoverable — the engine died {@link MAX_FAILED_STARTS} times in a row before it was ready: nobody will be
 *                   resumed, so every waiting request is failed (`engine_fault`, with `description`);
 *   restart       — the engine is restarted; its requests are kept and resumed (`verdict` says whom to charge).
 */
export type ExitDecision =
  | { kind: "shutdown" }
  | { kind: "unrecoverable"; verdict: DeathVerdict; failedStarts: number; description: string }
  | { kind: "restart"; verdict: DeathVerdict; description: string };

/** Decide what an engine exit means (see {@link ExitDecision}). */
export function exitDecision(input: { stopping: boolean; failedStarts: number; exit: EngineExit; byWatchdog: WatchdogKill }): ExitDecision {
  if (input.stopping) return { kind: "shutdown" };
  const { exit } = input;
  const verdict = deathVerdict(exit, input.byWatchdog);
  // An engine that keeps dying before it is ready will not resume anyone: what waits is ended, clearly.
  if (input.failedStarts >= MAX_FAILED_STARTS) {
    return { kind: "unrecoverable", verdict, failedStarts: input.failedStarts, description: `the engine failed to start ${input.failedStarts} times in a row` };
  }
  return { kind: "restart", verdict, description: `the engine process exited (${exit.signal ?? `code ${exit.code}`})` };
}

/** A live request as recovery sees it at an engine death: its id and the deaths it is suspected of. */
export interface DeathRecord {
  id: string;
  deaths: number;
}

/**
 * Group testing of suspects (it stays correct when several requests kill the engine). A suspect is a request that
 * was in flight at a death once deaths repeat; suspects are held back (lifecycle state `suspect`) until they are
 * tested in a group of their own, never resumed beside another test, so one culprit cannot frame another request.
 * The plan of the tests is ordered data: `pool` (the suspects under test; when `poolGuilty` it is known to hold a
 * culprit and is tested half at a time, else it is tested whole), `deferred` (suspects tested after the pool) and
 * `group` (the suspects in flight as the current test). A group that dies narrows the pool to its members in flight;
 * a group that ends cleanly clears its members; when the pool empties, the deferred suspects become the next pool.
 * All empty when no bisection runs.
 */
export class SuspectTests {
  /** The suspects under test, in order. */
  private pool: string[] = [];
  /** The pool died as a whole (it holds a culprit), so halving it finds one. */
  private poolGuilty = false;
  /** Suspects not in the pool, tested after it (a group of their own), in order. */
  private deferred: string[] = [];
  /** The suspects resubmitted as the current test (a subset of `pool`). */
  private readonly group = new Set<string>();

  constructor(
    /** Deaths after which a request that died alone is the culprit. */
    readonly faultThreshold = FAULT_THRESHOLD,
  ) {}

  /** True while a bisection runs (some suspect is waiting for, or under, a test). */
  get running(): boolean {
    return this.pool.length > 0 || this.deferred.length > 0;
  }

  /** True when `id` is a suspect (under test or waiting for one). */
  isSuspect(id: string): boolean {
    return this.pool.includes(id) || this.deferred.includes(id);
  }

  /**
   * Whether a death counts against request `id`. A death Keel caused itself (the watchdog's kill) or one from outside
   * is nobody's fault; while a bisection runs, the death is charged to the test group only: requests in flight beside
   * it become suspects, uncharged.
   */
  charged(id: string, blame: boolean): boolean {
    return blame && (!this.running || this.group.has(id));
  }

  /**
   * The engine died holding `died` (already charged, see {@link charged}). Updates the test plan and returns the
   * culprit, if the death isolates one: a lone member of the test that died with nothing else in flight, after
   * {@link faultThreshold} deaths.
   */
  afterDeath(died: readonly DeathRecord[], blame: boolean): { culprit: string | null } {
    if (!blame) {
      // Nobody's fault: the running test proves nothing and is run again (its members are still in the pool).
      this.group.clear();
      return { culprit: null };
    }
    if (!this.running) {
      // Start a bisection when deaths repeat: everyone in flight is a suspect, and one of them is guilty.
      if (died.some((d) => d.deaths >= this.faultThreshold)) this.startPool(died.map((d) => d.id), true);
      return { culprit: null };
    }
    // 1. Who was in flight: members of the test, and others (in flight beside it, so possibly a culprit too).
    const members = died.filter((d) => this.group.has(d.id));
    const others = died.filter((d) => !this.group.has(d.id)).map((d) => d.id);
    this.group.clear();
    this.deferred.push(...others.filter((id) => !this.deferred.includes(id)));
    if (members.length === 0) return { culprit: null };
    // 2. A lone member that died with nothing else in flight is a culprit (after repeated deaths).
    const lone = members.length === 1 && others.length === 0 ? members[0]! : null;
    if (lone && lone.deaths >= this.faultThreshold) {
      // The rest of the pool is no longer known to hold a culprit: it is tested again with the deferred suspects.
      this.startPool([...this.pool.filter((id) => id !== lone.id), ...this.deferred], false);
      return { culprit: lone.id };
    }
    // 3. Otherwise narrow to the members in flight; the rest of the pool waits, still suspect, with the deferred.
    const memberIds = members.map((d) => d.id);
    const rest = this.pool.filter((id) => !memberIds.includes(id));
    this.deferred = [...rest, ...this.deferred.filter((id) => !rest.includes(id))];
    // Known guilty only if nothing else was in flight: with others beside it, the culprit may be among them.
    this.pool = memberIds;
    this.poolGuilty = others.length === 0;
    return { culprit: null };
  }

  /**
   * The suspects to resubmit as the next test ([] while a test is in flight). `waiting(id)`: the suspect still waits
   * for its test (suspects that are gone — finished, cancelled — are forgotten). The caller reports each one it
   * resubmitted with {@link testing}.
   */
  nextTest(waiting: (id: string) => boolean): string[] {
    if (this.group.size > 0) return [];
    // 1. Forget suspects that are gone; the pool empties into the deferred suspects.
    this.pool = this.pool.filter(waiting);
    this.deferred = this.deferred.filter(waiting);
    if (this.pool.length === 0) this.startPool(this.deferred, false);
    // 2. A guilty pool is halved; one not known to be guilty is tested whole (no death if it is clean).
    return this.poolGuilty ? this.pool.slice(0, Math.ceil(this.pool.length / 2)) : [...this.pool];
  }

  /** Suspect `id` was resubmitted as part of the current test. */
  testing(id: string): void {
    this.group.add(id);
  }

  /**
   * Request `id` ended (finished, cancelled, isolated): it is no suspect any more. Returns true when it was the last
   * member of the current test in flight — the test ended without killing the engine, so the next test may start.
   */
  ended(id: string): boolean {
    this.pool = this.pool.filter((x) => x !== id);
    this.deferred = this.deferred.filter((x) => x !== id);
    return this.group.delete(id) && this.group.size === 0;
  }

  /** Make `ids` the pool under test (guilty: it died as a whole), with nothing deferred. */
  private startPool(ids: string[], guilty: boolean): void {
    this.pool = ids;
    this.poolGuilty = guilty;
    this.deferred = [];
    this.group.clear();
  }
}

/**
 * What identifies an isolated request: its rendered prompt and, when it had one, its guide (a grammar can be what
 * kills the engine — then a plain request with the same messages is innocent and must not be refused). Hashed, so a
 * large guide costs the memory nothing.
 */
export function isolationKey(prompt: string, guide?: GuideSpec): string {
  if (guide === undefined) return prompt;
  return `guided:${createHash("sha256").update(prompt).update("\u0000").update(JSON.stringify(guide)).digest("hex")}`;
}

/**
 * Memory of prompts isolated as engine killers, so that a client resending one is refused at admission without
 * another crash. A refusal must be earned and must not last forever: an entry expires `ttlMs` after it was isolated
 * (the engine may have been fixed, or the crash may have had another cause), and the memory is bounded (oldest
 * first out).
 */
export class IsolatedPrompts {
  /** Isolated prompt → when it was isolated (ms since epoch); insertion-ordered, oldest first. */
  private readonly isolatedAt = new Map<string, number>();

  constructor(
    /** How long a prompt stays refused after its isolation (ms). */
    private readonly ttlMs: number,
    /** Most prompts remembered. */
    private readonly capacity = 1000,
  ) {}

  /** Remember `prompt` as isolated at `now`. */
  add(prompt: string, now = Date.now()): void {
    this.isolatedAt.delete(prompt);
    this.isolatedAt.set(prompt, now);
    while (this.isolatedAt.size > this.capacity) this.isolatedAt.delete(this.isolatedAt.keys().next().value as string);
  }

  /** True when `prompt` was isolated less than `ttlMs` ago. An expired entry is forgotten. */
  has(prompt: string, now = Date.now()): boolean {
    const at = this.isolatedAt.get(prompt);
    if (at === undefined) return false;
    if (now - at < this.ttlMs) return true;
    this.isolatedAt.delete(prompt);
    return false;
  }

  /** Prompts remembered (expired ones included until looked up). */
  get size(): number {
    return this.isolatedAt.size;
  }

  /** Remember the requests isolated as culprits (only prompts given as text identify a request at admission). */
  addCulprits(culprits: readonly { prompt: { text: string } | { tokens: number[] }; params: { guide?: GuideSpec } }[], now = Date.now()): void {
    for (const c of culprits) if ("text" in c.prompt) this.add(isolationKey(c.prompt.text, c.params.guide), now);
  }

  /** True when this rendered prompt, with this guide, was isolated recently (refused without the engine). */
  isKnownCulprit(prompt: string, guide?: GuideSpec, now = Date.now()): boolean {
    return this.has(isolationKey(prompt, guide), now);
  }
}
