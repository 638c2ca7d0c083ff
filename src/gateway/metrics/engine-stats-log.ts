/**
 * The periodic engine line (vLLM's "Avg prompt throughput … Running … Waiting … KV cache usage" line): every interval
 * (5 s by default) one INFO line per model that was busy — a request running or waiting now, or tokens processed since
 * the last line — and nothing while idle. It is built from what the gateway already records: the tokens its step
 * observer saw (metrics-observer.ts `processed`), the request table's counts, and the KV usage the gauges report.
 */
import type { Logger } from "pino";
import type { ProcessedTokens } from "./metrics-observer.js";

/** The default interval between two lines (ms), as vLLM's. */
export const ENGINE_STATS_INTERVAL_MS = 5000;

/** One served model as the engine line reads it. */
export interface EngineStatsSource {
  /** Served model name. */
  modelName: string;
  /** Its tokens processed so far (a live, cumulative record; the line takes differences, keyed by this object). */
  processed: Readonly<ProcessedTokens>;
  /** Requests waiting for a sequence and requests holding one, now. */
  counts(): { waiting: number; running: number };
  /** KV cells held by live requests over the KV budget, now (0..1). */
  kvUsage(): number;
}

/** What one line says (its JSON fields besides `event` and `model`). */
export interface EngineStats {
  /** Prompt tokens prefilled per second over the interval (prefix-cache hits excluded). */
  promptTokPerS: number;
  /** Tokens generated per second over the interval. */
  genTokPerS: number;
  running: number;
  waiting: number;
  /** KV usage now, in percent. */
  kvUsagePct: number;
  /** Admitted prompt tokens reused from the prefix cache over the interval, in percent; null when none was admitted. */
  prefixCacheHitPct: number | null;
  /** The interval the rates are over (s). */
  intervalS: number;
}

/** Rounded to one decimal. */
const r1 = (x: number): number => Math.round(x * 10) / 10;

/** Remembers each model's totals at the last tick and logs the busy ones' differences. */
export class EngineStatsLog {
  /** Per model (keyed by its `processed` record, so a replaced engine's unit starts afresh): totals at the last tick. */
  private readonly last = new WeakMap<object, ProcessedTokens>();
  /** When the last tick ran (ms); a model first seen at a tick is counted from here. */
  private lastTickAt: number;

  constructor(
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {
    this.lastTickAt = now();
  }

  /** One tick: log a line for each model busy since the last tick; returns what was logged, by model. */
  tick(sources: readonly EngineStatsSource[]): Map<string, EngineStats> {
    const at = this.now();
    const seconds = Math.max(0.001, (at - this.lastTickAt) / 1000);
    this.lastTickAt = at;
    const logged = new Map<string, EngineStats>();
    for (const s of sources) {
      const before = this.last.get(s.processed) ?? { promptTokens: 0, cachedTokens: 0, generatedTokens: 0 };
      const now = { ...s.processed };
      this.last.set(s.processed, now);
      const prompt = now.promptTokens - before.promptTokens;
      const cached = now.cachedTokens - before.cachedTokens;
      const generated = now.generatedTokens - before.generatedTokens;
      const { waiting, running } = s.counts();
      if (waiting + running === 0 && prompt + cached + generated === 0) continue; // idle: silent
      const stats: EngineStats = {
        promptTokPerS: r1(prompt / seconds),
        genTokPerS: r1(generated / seconds),
        running,
        waiting,
        kvUsagePct: r1(s.kvUsage() * 100),
        prefixCacheHitPct: prompt + cached > 0 ? r1((cached / (prompt + cached)) * 100) : null,
        intervalS: r1(seconds),
      };
      logged.set(s.modelName, stats);
      const hit = stats.prefixCacheHitPct === null ? "-" : `${stats.prefixCacheHitPct}%`;
      this.log.info(
        { event: "engine_stats", model: s.modelName, ...stats },
        `${s.modelName}: prompt ${stats.promptTokPerS} tok/s, generation ${stats.genTokPerS} tok/s, running ${running}, waiting ${waiting}, KV cache ${stats.kvUsagePct}%, prefix cache hits ${hit}`,
      );
    }
    return logged;
  }
}

/** How the line is scheduled: `every(ms, fn)` runs `fn` every `ms` and returns what stops it. */
export interface Ticker {
  every(ms: number, fn: () => void): () => void;
}

/** The real ticker: an unref'd interval (it never holds the process up). */
export const INTERVAL_TICKER: Ticker = {
  every(ms, fn) {
    const t = setInterval(fn, ms);
    t.unref();
    return () => clearInterval(t);
  },
};

/** Start the periodic engine line over `sources()` (read at each tick); returns what stops it. */
export function startEngineStatsLog(log: Logger, sources: () => readonly EngineStatsSource[], opts: { intervalMs?: number; ticker?: Ticker; now?: () => number } = {}): () => void {
  const stats = new EngineStatsLog(log, opts.now);
  return (opts.ticker ?? INTERVAL_TICKER).every(opts.intervalMs ?? ENGINE_STATS_INTERVAL_MS, () => {
    try {
      stats.tick(sources());
    } catch {
      /* a log line must never take the gateway down */
    }
  });
}
