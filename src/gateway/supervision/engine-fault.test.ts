/**
 * A malformed frame from an engine is an engine fault, not a gateway crash: the engine client kills that engine,
 * reports the fault in its exit, and the supervisor restarts it and resumes its requests with no blame on them. The
 * fake engine (test/support/fake-engine.mjs, FAKE_ENGINE_MALFORMED) breaks the protocol once, in its first process.
 */
import { fileURLToPath } from "node:url";
import pino from "pino";
import { afterEach, describe, expect, it } from "vitest";
import type { EngineMessage, ReadyMessage } from "../../protocol/messages.js";
import { PROTOCOL_VERSION } from "../../protocol/messages.js";
import { Metrics } from "../metrics/metrics.js";
import { StepObserver } from "../metrics/metrics-observer.js";
import { SinkTable } from "../../../test/support/table-sinks.js";
import { EngineClient, type EngineExit } from "./engine-client.js";
import { deathVerdict } from "./recovery.js";
import { EngineSupervisor } from "./supervisor.js";

const FAKE = fileURLToPath(new URL("../../../test/support/fake-engine.mjs", import.meta.url));
const config = { modelPath: "/fake.gguf", maxNumSeqs: 3, maxNumBatchedTokens: 32, maxModelLen: 128, prefixCaching: true, threads: 1, flashAttention: false, kvCacheType: "f16" as const, device: "cpu" as const };
const params = { maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: false };

let stop: (() => Promise<void>) | null = null;
afterEach(async () => {
  await stop?.();
  stop = null;
});

/** An engine client over the fake engine, recording what it reports; `next` waits for the next event of a kind. */
function client(malformed: string) {
  const readies: ReadyMessage[] = [];
  const messages: EngineMessage[] = [];
  const exits: EngineExit[] = [];
  const logs: string[] = [];
  const waiters: { kind: string; resolve: () => void }[] = [];
  const notify = (kind: string): void => {
    for (const w of waiters.filter((x) => x.kind === kind)) {
      waiters.splice(waiters.indexOf(w), 1);
      w.resolve();
    }
  };
  const engine = new EngineClient(
    { config, command: { command: process.execPath, args: [FAKE], env: { FAKE_ENGINE_MALFORMED: malformed } }, pingIntervalMs: 50, readyStalenessMs: 5_000, restartMinMs: 10, restartMaxMs: 100 },
    {
      onReady: (m) => (readies.push(m), notify("ready")),
      onMessage: (m) => messages.push(m),
      onExit: (e) => (exits.push(e), notify("exit")),
      onLog: (line) => logs.push(line),
    },
  );
  stop = () => engine.stop();
  const next = (kind: "ready" | "exit") => new Promise<void>((resolve) => waiters.push({ kind, resolve }));
  return { engine, readies, messages, exits, logs, next };
}

describe("EngineClient: a frame that breaks the protocol", () => {
  it.each([
    ["step", /^invalid step message: outputs\.0\.tokens\.0 must be >= 0$/],
    ["version", /^unsupported protocol version 2 \(expected 1\)$/],
    ["junk", /^bad frame: frame is not valid JSON/],
    ["ready2", /^a second ready message from an engine that is already ready$/],
    ["twice", /^step 1 reports request "r1" twice$/],
  ])("(%s) is logged, counted, and the engine killed and restarted, the frame never delivered", async (kind, why) => {
    const t = client(kind);
    const ready = t.next("ready");
    t.engine.start();
    await ready;
    const exited = t.next("exit");
    const restarted = exited.then(() => t.next("ready"));
    expect(t.engine.send({ v: PROTOCOL_VERSION, type: "add", id: "r1", prompt: { text: "hello" }, params })).toBe(true);
    await exited;
    expect(t.exits).toEqual([{ code: null, signal: "SIGKILL", fault: { kind: "protocol", message: expect.stringMatching(why) } }]);
    expect(t.engine.protocolFaults).toBe(1);
    expect(t.logs.filter((l) => l.includes("broke the protocol"))).toHaveLength(1);
    // The supervisor's classification of that exit: a protocol fault, charged to no request.
    expect(deathVerdict(t.exits[0]!, "none")).toEqual({ reason: "protocol", blame: false });
    await restarted;
    expect(t.readies).toHaveLength(2);
    expect(t.engine.isReady).toBe(true);
    expect(t.messages.every((m) => m.v === PROTOCOL_VERSION && m.type === "pong")).toBe(true);
  });
});

describe("EngineClient: failed starts", () => {
  it("count processes that died before they reported ready, not the death of an engine that was serving", async () => {
    const t = client("");
    const ready = t.next("ready");
    t.engine.start();
    await ready;
    const exited = t.next("exit");
    const again = exited.then(() => t.next("ready"));
    t.engine.kill();
    await exited;
    expect(t.engine.failedStarts).toBe(0);
    await again;
    expect(t.engine.failedStarts).toBe(0);
  });

  it("one more for each process in a row that exits before it is ready", async () => {
    const exits: EngineExit[] = [];
    const waiters: (() => void)[] = [];
    const engine = new EngineClient(
      { config, command: { command: process.execPath, args: ["-e", "process.exit(3)"] }, pingIntervalMs: 50, readyStalenessMs: 5_000, restartMinMs: 1, restartMaxMs: 5 },
      { onReady: () => undefined, onMessage: () => undefined, onExit: (e) => (exits.push(e), waiters.shift()?.()), onLog: () => undefined },
    );
    stop = () => engine.stop();
    const counts: number[] = [];
    engine.start();
    for (let i = 0; i < 3; i++) {
      await new Promise<void>((resolve) => waiters.push(resolve));
      counts.push(engine.failedStarts);
    }
    expect(counts).toEqual([1, 2, 3]);
    expect(exits.every((e) => e.code === 3 && e.fault === null)).toBe(true);
  });
});

describe("EngineSupervisor: an engine that breaks the protocol", () => {
  it("is restarted and its request resumed with no death charged to it", async () => {
    const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
    const resumed: [string, number][] = [];
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
      { engine: config, engineCommand: { command: process.execPath, args: [FAKE], env: { FAKE_ENGINE_MALFORMED: "step" } }, stallMs: 30_000, pingIntervalMs: 50, readyStalenessMs: 5_000, isolatedPromptTtlMs: 60_000 },
      registry,
      new StepObserver(metrics),
      metrics,
      log,
    );
    stop = () => sup.stop();
    sup.start();
    await sup.firstReady;
    const recovered = next("engine_recovered");
    const s = { onAdmitted: () => undefined, onOutput: () => undefined, onFinish: () => undefined };
    expect(registry.submit("r1", { text: "hello" }, params, s)).toBe(true);
    await recovered;
    expect(resumed).toEqual([["r1", 0]]);
    expect(sup.engine.protocolFaults).toBe(1);
    expect(sup.isReady).toBe(true);
    expect(await metrics.registry.getSingleMetricAsString("keel_engine_restarts_total")).toContain('keel_engine_restarts_total{reason="protocol"} 1');
  });
});
