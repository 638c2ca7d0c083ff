/**
 * Which model-load progress reports become log lines. A load from the page cache takes milliseconds and would be ten
 * lines at once; a large model from a slow disk or onto a GPU takes minutes and must show it is moving. So: the
 * first report and 100% (when `edges` asks for them), and a new tenth only once a second has passed since the last line.
 *
 * @module
 */

/** Options of {@link LoadProgressLines}. */
export interface LoadProgressOptions {
  /** Log the first report and 100% whatever the time (default true); off where other lines say start and end. */
  edges?: boolean;
  /** Least time between two lines in the middle of a load (ms; default 1000). */
  minGapMs?: number;
  /** Clock in ms (default Date.now); tests inject one. */
  now?: () => number;
}

/** Decides, report by report, whether a load's progress is logged (one instance per load; {@link reset} for the next). */
export class LoadProgressLines {
  /** The tenth (0..10) last logged, -1 before the first report of this load. */
  private lastTenth = -1;
  /** When the last line was logged, or the load's first report came (ms). */
  private lastAt = -Infinity;
  private readonly edges: boolean;
  private readonly minGapMs: number;
  private readonly now: () => number;

  constructor(opts: LoadProgressOptions = {}) {
    this.edges = opts.edges ?? true;
    this.minGapMs = opts.minGapMs ?? 1000;
    this.now = opts.now ?? Date.now;
  }

  /** True when `progress` (0..1) is to be logged. */
  take(progress: number): boolean {
    const tenth = Math.min(10, Math.floor(progress * 10));
    const at = this.now();
    if (this.lastTenth < 0) {
      this.lastTenth = tenth;
      this.lastAt = at;
      return this.edges;
    }
    if (tenth <= this.lastTenth) return false;
    const due = tenth === 10 ? this.edges : at - this.lastAt >= this.minGapMs;
    if (due) {
      this.lastTenth = tenth;
      this.lastAt = at;
    }
    return due;
  }

  /** Forget the load: the next report is a new load's first. */
  reset(): void {
    this.lastTenth = -1;
    this.lastAt = -Infinity;
  }
}
