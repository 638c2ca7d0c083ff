import { fileURLToPath } from "node:url";
import pino from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { Metrics } from "../metrics/metrics.js";
import { StepObserver } from "../metrics/metrics-observer.js";
import { SinkTable } from "../../../test/support/table-sinks.js";
import { EngineSupervisor } from "./supervisor.js";

describe("EngineSupervisor with a fake engine (test/support/fake-engine.mjs)", () => {
  const FAKE = fileURLToPath(new URL("../../../test/support/fake-engine.mjs", import.meta.url));
  const config = { modelPath: "/fake.gguf", maxNumSeqs: 3, maxNumBatchedTokens: 32, maxModelLen: 128, prefixCaching: true, threads: 1, flashAttention: false, kvCacheType: "f16" as const, device: "cpu" as const };
  const params = { maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: false };
  let stop: (() => Promise<void>) | null = null;
  afterEach(async () => {
    await stop?.();
    stop = null;
  });

  function start(env: Record<string, string> = {}) {
    const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
    const steps = new StepObserver(metrics);
    const resumed: [string, number][] = [];
    /** Waiters for a log event of the supervisor (engine_ready, engine_exit): the test observes, never sleeps. */
    const waiters: { event: string; resolve: () => void }[] = [];
    const log = pino({ level: "info" }, {
      write(line: string) {
        const event = (JSON.parse(line) as { event?: string }).event;
        for (const w of waiters.filter((x) => x.event === event)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve();
        }
      },
    });
    const next = (event: string) => new Promise<void>((resolve) => waiters.push({ event, resolve }));
    const registry: SinkTable = new SinkTable((m) => sup.engine.send(m), { onResumed: (id, _g, deaths) => resumed.push([id, deaths]) });
    const sup: EngineSupervisor = new EngineSupervisor(
      {
        engine: config,
        engineCommand: { command: process.execPath, args: [FAKE], env: { FAKE_ENGINE: "1", ...env } },
        stallMs: 30_000,
        pingIntervalMs: 50,
        readyStalenessMs: 5_000,
        isolatedPromptTtlMs: 60_000,
      },
      registry,
      steps,
      metrics,
      log,
    );
    stop = () => sup.stop();
    return { sup, registry, resumed, metrics, next };
  }

  it("starts the engine through its command with the engine-neutral config, and reports loading until ready", async () => {
    const t = start();
    expect(t.sup.isReady).toBe(false);
    expect(t.sup.unavailableReason).toBe("loading");
    t.sup.start();
    await t.sup.firstReady;
    expect(t.sup.isReady).toBe(true);
    expect(t.sup.limits).toEqual({ maxNumSeqs: 3, maxNumBatchedTokens: 32, maxModelLen: 128 });
    expect(t.sup.template).not.toBeNull();
  });

  it("requests sent in one event-loop turn reach the engine in one read, however long the turn", async () => {
    // The engine answers each read that carried adds with one step, each request's text = the adds in that read.
    const t = start({ FAKE_ENGINE_CHUNK_STEPS: "1" });
    t.sup.start();
    await t.sup.firstReady;
    const texts = new Map<string, string>();
    let outputs = 0;
    let allOut: () => void = () => undefined;
    const done = new Promise<void>((resolve) => (allOut = resolve));
    const sink = (id: string) => ({
      onAdmitted: () => undefined,
      onOutput: (_tokens: number[], text: string) => {
        texts.set(id, text);
        if (++outputs === 3) allOut();
      },
      onFinish: () => undefined,
    });
    expect(t.registry.submit("r1", { text: "a" }, params, sink("r1"))).toBe(true);
    // The gateway still busy with the turn (parsing the burst's next requests): long enough for the engine to read
    // r1 alone if it had been written at once.
    const until = performance.now() + 30;
    while (performance.now() < until);
    expect(t.registry.submit("r2", { text: "b" }, params, sink("r2"))).toBe(true);
    expect(t.registry.submit("r3", { text: "c" }, params, sink("r3"))).toBe(true);
    await done;
    expect(Object.fromEntries(texts)).toEqual({ r1: "3", r2: "3", r3: "3" });
  });

  it("a SIGKILL from outside: restarting (not loading) at once, the request resumed with no death charged", async () => {
    const t = start();
    t.sup.start();
    await t.sup.firstReady;
    const s = { onAdmitted: () => undefined, onOutput: () => undefined, onFinish: () => undefined };
    expect(t.registry.submit("r1", { text: "hello" }, params, s)).toBe(true);
    const exited = t.next("engine_exit");
    process.kill(t.sup.engine.pid!, "SIGKILL");
    await exited;
    expect(t.sup.isReady).toBe(false);
    expect(t.sup.unavailableReason).toBe("restarting");
    expect(t.registry.recoveringCount).toBe(1);
    await t.next("engine_recovered");
    expect(t.resumed).toEqual([["r1", 0]]);
    expect(await t.metrics.registry.getSingleMetricAsString("keel_engine_restarts_total")).toContain('keel_engine_restarts_total{reason="signal"} 1');
  });

  it("a crash by the engine itself (SIGABRT) charges the requests in flight", async () => {
    const t = start();
    t.sup.start();
    await t.sup.firstReady;
    const s = { onAdmitted: () => undefined, onOutput: () => undefined, onFinish: () => undefined };
    t.registry.submit("r1", { text: "hello" }, params, s);
    const recovered = t.next("engine_recovered");
    process.kill(t.sup.engine.pid!, "SIGABRT");
    await recovered;
    expect(t.resumed).toEqual([["r1", 1]]);
  });
});
