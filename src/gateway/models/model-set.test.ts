import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import pino from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { NO_AGENT_FLAGS } from "./agent-config.js";
import { Metrics } from "../metrics/metrics.js";
import { ModelSet, sameSpec, type ModelSpec } from "./model-set.js";
import { checkModelName } from "../http/route-context.js";

const FAKE = fileURLToPath(new URL("../../../test/support/fake-engine.mjs", import.meta.url));
const engine = { modelPath: "/fake.gguf", maxNumSeqs: 3, maxNumBatchedTokens: 32, maxModelLen: 128, prefixCaching: true, threads: 1, flashAttention: false, kvCacheType: "f16" as const, device: "cpu" as const };
const spec = (name: string, maxNumSeqs = 3): ModelSpec => ({ name, engine: { ...engine, maxNumSeqs }, agents: NO_AGENT_FLAGS, maxQueuedRequests: 8 });
const params = { maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: false };
const sink = { onAdmitted: () => undefined, onOutput: () => undefined, onFinish: () => undefined };

let current: ModelSet | null = null;
afterEach(async () => {
  await current?.stopAll();
  current = null;
});

/** A model set over the fake engine (test/support/fake-engine.mjs), and a way to wait for a log event. */
/**
 * Engine command: the fake engine, except for the model file /never.gguf, whose engine starts and never reports ready.
 */
const HANGS_ON_NEVER = `const c = JSON.parse(process.argv.at(-1)); if (c.modelPath === "/never.gguf") setInterval(() => {}, 1000); else import(${JSON.stringify(new URL("../../../test/support/fake-engine.mjs", import.meta.url).href)});`;

function makeSet(reloadReadyMs?: number) {
  const waiters: { event: string; resolve: (j: Record<string, unknown>) => void }[] = [];
  const log = pino({ level: "info" }, {
    write(line: string) {
      const j = JSON.parse(line) as Record<string, unknown>;
      for (const w of waiters.filter((x) => x.event === j["event"])) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve(j);
      }
    },
  });
  const next = (event: string) => new Promise<Record<string, unknown>>((resolve) => waiters.push({ event, resolve }));
  const metrics = new Metrics({ counts: () => ({ waiting: 0, running: 0 }), activeSequences: () => 0, cachedSequences: () => 0, lastStepAgeSeconds: () => 0 });
  const engineCommand = reloadReadyMs === undefined ? { command: process.execPath, args: [FAKE] } : { command: process.execPath, args: ["-e", HANGS_ON_NEVER] };
  const set = new ModelSet({ engineCommand, stallMs: 30_000, pingIntervalMs: 50, readyStalenessMs: 5_000, metrics, log, labelLogs: true, ...(reloadReadyMs !== undefined ? { reloadReadyMs } : {}) });
  current = set;
  return { set, next };
}

describe("ModelSet: one engine per model, reloads", () => {
  it("routes a body to its model's context, and to the first model's when it names no served model", async () => {
    const { set } = makeSet();
    set.startAll([spec("a"), spec("b")]);
    await Promise.all(set.servingUnits().map((u) => u.supervisor.firstReady));
    expect(set.contextFor({ model: "b" }).model.name).toBe("b");
    expect(set.contextFor({ model: "a" }).model.name).toBe("a");
    expect(set.contextFor({ model: "zzz" }).model.name).toBe("a");
    expect(set.contextFor(undefined).model.name).toBe("a");
    expect(set.contextFor({ model: "b" }).model.served()).toEqual(["a", "b"]);
    expect(set.get("a")!.supervisor.engine.pid).not.toBe(set.get("b")!.supervisor.engine.pid);
  });

  it("an alias (the catalogue name given to --model_path) routes to its model and passes its name check; it is not listed", async () => {
    const { set } = makeSet();
    set.startAll([spec("a"), { ...spec("Qwen2.5-Coder-0.5B-Instruct"), aliases: ["qwen2.5-coder-0.5b-instruct"] }]);
    await Promise.all(set.servingUnits().map((u) => u.supervisor.firstReady));
    const ctx = set.contextFor({ model: "qwen2.5-coder-0.5b-instruct" });
    expect(ctx.model.name).toBe("Qwen2.5-Coder-0.5B-Instruct");
    expect(() => checkModelName(ctx.model, "qwen2.5-coder-0.5b-instruct")).not.toThrow();
    expect(() => checkModelName(ctx.model, "Qwen2.5-Coder-0.5B-Instruct")).not.toThrow();
    expect(() => checkModelName(ctx.model, "QWEN2.5-CODER-0.5B-INSTRUCT")).toThrow(/does not exist\. Served models: "a", "Qwen2\.5-Coder-0\.5B-Instruct"/);
    expect(() => checkModelName(set.contextFor({ model: "a" }).model, "qwen2.5-coder-0.5b-instruct")).toThrow(/does not exist/);
    expect(ctx.model.served()).toEqual(["a", "Qwen2.5-Coder-0.5B-Instruct"]);
  });

  it("a model with its own engine command (--engine per model) runs it; the others run the set's command", async () => {
    const { set } = makeSet();
    const own = { command: process.execPath, args: [FAKE], env: { KEEL_ENGINE_MARK: "own-engine" } };
    set.startAll([{ ...spec("ov"), engineCommand: own, engineName: "openvino" }, spec("ll")]);
    await Promise.all(set.servingUnits().map((u) => u.supervisor.firstReady));
    const environ = (name: string): string[] => readFileSync(`/proc/${set.get(name)!.supervisor.engine.pid}/environ`, "utf8").split("\0");
    expect(environ("ov")).toContain("KEEL_ENGINE_MARK=own-engine");
    expect(environ("ll")).not.toContain("KEEL_ENGINE_MARK=own-engine");
    // The command is part of the spec: a reload that changes it replaces the engine.
    expect(sameSpec({ ...spec("ov"), engineCommand: own }, spec("ov"))).toBe(false);
  });

  it("a reload: unchanged kept, changed replaced once its engine is ready (the old one keeps its request), added started, removed retired", async () => {
    const { set, next } = makeSet();
    set.startAll([spec("a"), spec("b"), spec("gone")]);
    await Promise.all(set.servingUnits().map((u) => u.supervisor.firstReady));
    const [a, oldB, gone] = [set.get("a")!, set.get("b")!, set.get("gone")!];
    // 1. A request in flight on b's engine and one on the removed model's (the fake engine holds them).
    expect(oldB.registry.submit("r-b", { text: "hello" }, params)).toBe(true);
    expect(gone.registry.submit("r-gone", { text: "hello" }, params)).toBe(true);
    const summary = await set.apply([spec("a"), spec("b", 2), spec("c")]);
    expect(summary).toEqual({ added: ["c"], removed: ["gone"], replaced: ["b"], unchanged: ["a"] });
    // 2. New requests go to the new engines; the old ones are retired but still hold their requests.
    expect(set.names()).toEqual(["a", "b", "c"]);
    expect(set.get("a")).toBe(a);
    const newB = set.get("b")!;
    expect(newB).not.toBe(oldB);
    expect(newB.supervisor.isReady).toBe(true);
    expect(newB.supervisor.limits?.maxNumSeqs).toBe(2);
    expect(set.get("gone")).toBeUndefined();
    expect([oldB.state.kind, gone.state.kind]).toEqual(["retired", "retired"]);
    expect(oldB.registry.size).toBe(1);
    expect(set.list().map((m) => [m.name, m.state])).toEqual([["a", "AVAILABLE"], ["b", "AVAILABLE"], ["c", "AVAILABLE"], ["gone", "UNLOADING"], ["b", "UNLOADING"]]);
    // 3. When a retired engine's last request ends, that engine stops.
    const stopped = next("model_stopped");
    oldB.registry.handleEngineExit("finished by the test");
    expect((await stopped)["model"]).toBe("b");
    expect(oldB.state.kind).toBe("stopped");
    expect(gone.state.kind).toBe("retired");
    const goneStopped = next("model_stopped");
    gone.registry.handleEngineExit("finished by the test");
    expect((await goneStopped)["model"]).toBe("gone");
    expect(set.list().map((m) => m.name)).toEqual(["a", "b", "c"]);
  });

  it("two reloads sent together apply in order: the last one's settings win and the middle engine is retired", async () => {
    const { set } = makeSet();
    set.startAll([spec("a")]);
    await set.get("a")!.supervisor.firstReady;
    const [first, second] = await Promise.all([set.apply([spec("a", 2)]), set.apply([spec("a", 1)])]);
    expect(first.replaced).toEqual(["a"]);
    expect(second.replaced).toEqual(["a"]);
    expect(set.get("a")!.supervisor.limits?.maxNumSeqs).toBe(1);
    expect(set.names()).toEqual(["a"]);
  });

  it("a changed model whose new engine never becomes ready: the old engine keeps serving, the new one is retired", async () => {
    const { set, next } = makeSet(500);
    set.startAll([spec("a")]);
    const old = set.get("a")!;
    await old.supervisor.firstReady;
    const failed = next("model_replacement_failed");
    const summary = await set.apply([{ ...spec("a"), engine: { ...engine, modelPath: "/never.gguf" } }]);
    expect(summary.replaced).toEqual(["a"]);
    expect((await failed)["model"]).toBe("a");
    expect(set.get("a")).toBe(old);
    expect(old.state.kind).toBe("serving");
    expect(set.list().map((m) => [m.name, m.state])).toEqual([["a", "AVAILABLE"], ["a", "UNLOADING"]]);
  });

  it("sameSpec compares settings, not key order", () => {
    const a = spec("a");
    const reordered = { maxQueuedRequests: a.maxQueuedRequests, agents: a.agents, engine: a.engine, name: a.name };
    expect(sameSpec(a, reordered)).toBe(true);
    expect(sameSpec(a, spec("a", 2))).toBe(false);
  });
});

describe("ModelUnit: tools a template cannot show", () => {
  it("with --tool_parser, a template without tools (the fake engine's ChatML) gets them injected, logged with the model and format", async () => {
    const { set, next } = makeSet();
    const injected = next("tools_injected");
    set.startAll([{ ...spec("a"), agents: { ...NO_AGENT_FLAGS, toolParser: "hermes3" } }, spec("b")]);
    await Promise.all(set.servingUnits().map((u) => u.supervisor.firstReady));
    expect(await injected).toMatchObject({ model: "a", toolParser: "hermes3", support: { tools: false, toolCalls: false, systemRole: true } });
    const a = set.get("a")!.ctx;
    expect(a.engine()!.template.toolPrompt?.format).toBe("hermes3");
    expect(a.model.agents().toolsInjected).toBe(true);
    // Without a tool parser nothing is injected (tools are refused instead).
    const b = set.get("b")!.ctx;
    expect(b.engine()!.template.toolPrompt).toBeNull();
    expect(b.model.agents().toolsInjected).toBeUndefined();
  });
});
