import { afterEach, describe, expect, it, vi } from "vitest";
import { drainOnSignals, ShutdownSignals, type Drainable } from "./shutdown.js";

describe("ShutdownSignals", () => {
  it("a signal repeated within 100 ms (npm forwarding the terminal's Ctrl-C) counts once", () => {
    const s = new ShutdownSignals(100);
    expect(s.receive(1000)).toBe("drain");
    expect(s.receive(1003)).toBe("same");
    expect(s.receive(1099)).toBe("same");
    expect(s.count).toBe(1);
  });

  it("a later signal means hurry", () => {
    const s = new ShutdownSignals(100);
    expect(s.receive(1000)).toBe("drain");
    expect(s.receive(1100)).toBe("hurry");
    expect(s.receive(5000)).toBe("hurry");
    expect(s.count).toBe(3);
  });
});

describe("drainOnSignals", () => {
  afterEach(() => vi.useRealTimers());

  /** A gateway whose drain ends when the test says, and the signal handlers it registered. */
  function setup() {
    const calls: string[] = [];
    let endDrain!: () => void;
    const log = { info: (f: { event: string }) => void calls.push(f.event), error: (f: { err: string }) => void calls.push(`error ${f.err}`) };
    const gw = {
      log,
      drain: (ms: number) => {
        calls.push(`drain ${ms}`);
        return new Promise<void>((resolve) => (endDrain = resolve));
      },
      hurryDrain: () => void calls.push("hurry"),
    } as unknown as Drainable;
    const handlers = new Map<string, () => void>();
    const drained = drainOnSignals(gw, 5000, (s, h) => void handlers.set(s, h));
    return { calls, handlers, drained, endDrain: () => endDrain() };
  }

  it("the first signal drains with the shutdown timeout; the promise settles once the drain has ended", async () => {
    const { calls, handlers, drained, endDrain } = setup();
    expect([...handlers.keys()]).toEqual(["SIGTERM", "SIGINT"]);
    let settled = false;
    void drained.then(() => (settled = true));
    handlers.get("SIGTERM")!();
    expect(calls).toEqual(["shutdown", "drain 5000"]);
    await Promise.resolve();
    expect(settled).toBe(false);
    endDrain();
    await drained;
    expect(settled).toBe(true);
  });

  it("the same signal delivered twice is counted once; a later distinct one hurries the drain", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(1000);
    const { calls, handlers, drained, endDrain } = setup();
    handlers.get("SIGINT")!();
    vi.setSystemTime(1003);
    handlers.get("SIGINT")!();
    expect(calls).toEqual(["shutdown", "drain 5000", "shutdown_signal_repeated"]);
    // Past the 100 ms in which a repeat is the same signal.
    vi.setSystemTime(1200);
    handlers.get("SIGTERM")!();
    expect(calls.slice(3)).toEqual(["shutdown", "hurry"]);
    endDrain();
    await drained;
  });
});
