import { describe, expect, it } from "vitest";
import { LoadProgressLines } from "./load-progress.js";

/** Feed `reports` ([ms since start, progress]) and return the progress values that were logged, as whole percent. */
function logged(lines: LoadProgressLines, clock: { t: number }, reports: [number, number][]): number[] {
  const out: number[] = [];
  for (const [at, p] of reports) {
    clock.t = at;
    if (lines.take(p)) out.push(Math.floor(p * 100));
  }
  return out;
}

describe("load progress lines", () => {
  it("a load that takes milliseconds: its first report and 100%, not ten lines", () => {
    const clock = { t: 0 };
    const lines = new LoadProgressLines({ now: () => clock.t });
    expect(logged(lines, clock, [[0, 0.31], [1, 0.4], [2, 0.5], [5, 0.7], [8, 0.9], [10, 1]])).toEqual([31, 100]);
  });

  it("a slow load: a new tenth at most once a second, rising, and 100% at once", () => {
    const clock = { t: 0 };
    const lines = new LoadProgressLines({ now: () => clock.t });
    const reports: [number, number][] = [[0, 0.05], [400, 0.12], [1100, 0.25], [1200, 0.31], [2500, 0.33], [2600, 0.47], [2700, 0.99], [2701, 1]];
    expect(logged(lines, clock, reports)).toEqual([5, 25, 33, 100]);
  });

  it("without edges (the model check has its own start and end lines): only the middle of a slow load", () => {
    const clock = { t: 0 };
    const lines = new LoadProgressLines({ edges: false, now: () => clock.t });
    expect(logged(lines, clock, [[0, 0.1], [500, 0.2], [1000, 0.4], [1500, 0.45], [2100, 0.6], [2200, 1]])).toEqual([40, 60]);
    lines.reset();
    expect(logged(lines, clock, [[3000, 0.1], [3010, 1]])).toEqual([]);
  });

  it("reset starts a new load (an engine restart logs its load again)", () => {
    const clock = { t: 0 };
    const lines = new LoadProgressLines({ now: () => clock.t });
    expect(logged(lines, clock, [[0, 0], [5, 1]])).toEqual([0, 100]);
    expect(logged(lines, clock, [[9000, 0.5], [9001, 1]])).toEqual([]);
    lines.reset();
    expect(logged(lines, clock, [[9002, 0.2], [9003, 1]])).toEqual([20, 100]);
  });
});
