/**
 * Engine process entry point (spawned by the gateway; see docs/protocol.md).
 *
 * The engine runs in its own process because llama.cpp's GGML_ASSERT aborts the whole process, worker threads
 * included (docs/upstream.md). Channel: frames on fd 3 (a duplex pipe); stdout/stderr carry logs only.
 * Configuration: one JSON argument, the engine-neutral {@link EngineConfig} of protocol/engine-config.ts.
 *
 * Modes: `serve` (default) loads the model and runs the step loop; `validate` only loads the model and creates a
 * context, then exits 0 — the gateway runs it in a throwaway child at startup so a model that aborts llama.cpp is
 * reported clearly before anything is served.
 */
import net from "node:net";
import { encodeFrame, FrameDecoder } from "../protocol/framing.js";
import { PROTOCOL_VERSION, type EngineMessage } from "../protocol/messages.js";
import { parseGatewayMessage } from "../protocol/validate.js";
import type { ModelBackend } from "./backend.js";
import { FaultyBackend, faultSwitchesFrom } from "./faulty-backend.js";
import { LlamaAdapter, NoGpuBackendError } from "./llama/adapter.js";
import { parseEngineConfig, toAdapterOptions } from "./start-config.js";
import { StepLoop } from "./step-loop.js";
import { shouldWarmUp, warmUp, WARMUP_BUDGET_MS } from "./warmup.js";
import { DEFAULT_MAX_NGRAM_SIZE, DEFAULT_NUM_ASSISTANT_TOKENS } from "./speculation/ngram.js";

function logLine(level: string, msg: string, extra: Record<string, unknown> = {}): void {
  process.stderr.write(JSON.stringify({ level, time: Date.now(), component: "engine", pid: process.pid, msg, ...extra }) + "\n");
}

/** The event of the fatal line a gateway recognises as "the GPU asked for is not there" (cli.ts validateModel). */
const NO_GPU_EVENT = "no_gpu_backend";

/** Fractions of the model load between two `loading` messages (the gateway logs at most every 10%). */
const LOAD_PROGRESS_STEP = 0.01;

async function main(): Promise<void> {
  const startedAt = Date.now();
  const config = parseEngineConfig(process.argv[2]);
  // In serve mode the channel opens first, so that load progress reaches the gateway while llama.cpp loads.
  const channel = config.mode === "serve" ? new net.Socket({ fd: 3, readable: true, writable: true }) : null;
  const send = (msg: EngineMessage): void => {
    if (channel && !channel.destroyed) channel.write(encodeFrame(msg));
  };
  /** Last progress sent, so that a load reports at most every LOAD_PROGRESS_STEP. */
  let lastProgress = -1;
  /** True while the model loads: llama.cpp's warnings then are load noise (e.g. "control-looking token"), logged at debug. */
  let loading = true;
  /** When the phases of the load ended, in ms since the process started (the model check reports them). */
  const phases = { start: performance.now(), backend: 0, model: 0, context: 0 };
  let adapter: LlamaAdapter;
  // The load's first line at once: starting llama.cpp's backend takes a second or more before its first progress.
  if (channel) {
    send({ v: PROTOCOL_VERSION, type: "loading", progress: 0 });
    lastProgress = 0;
  }
  try {
    adapter = await LlamaAdapter.open({
      ...toAdapterOptions(config),
      log: (level, message) => {
        if (level === "error" || level === "fatal") logLine(level, message.trim(), { source: "llama.cpp" });
        else if (level === "warn") logLine(loading ? "debug" : "warn", message.trim(), { source: "llama.cpp" });
      },
      onBackendLoaded: () => (phases.backend = performance.now()),
      onLoadProgress: (progress) => {
        const loaded = progress >= 1 && phases.model === 0;
        if (loaded) phases.model = performance.now();
        if (progress - lastProgress < LOAD_PROGRESS_STEP && progress < 1) return;
        lastProgress = progress;
        const p = Math.min(1, Math.max(0, progress));
        // The model check has no channel: its progress goes to stdout, before the result line.
        if (channel) send({ v: PROTOCOL_VERSION, type: "loading", progress: p });
        else process.stdout.write(JSON.stringify({ loading: p }) + "\n");
        // Creating the context allocates the whole KV cache: seconds for a large one, said before it starts.
        if (loaded && channel) logLine("info", `model loaded; creating its context (KV cache for ${config.maxNumSeqs} sequences of ${config.maxModelLen} tokens)…`, { event: "creating_context" });
      },
    });
  } catch (err) {
    if (err instanceof NoGpuBackendError) {
      logLine("fatal", `a GPU was asked for (device "gpu") but ${err.message}`, { event: NO_GPU_EVENT });
      process.exit(3);
    }
    throw err;
  }
  loading = false;
  phases.context = performance.now();
  // One line when Keel's addon (one native call samples a step) is not in use, saying why.
  if (adapter.nativeAddon.kind !== "keel") logLine("info", `Keel's native addon is not in use (sampling takes one async native call per sequence per step): node-llama-cpp's own addon runs (${adapter.nativeAddon.reason})`, { event: "native_addon_fallback" });
  const backend = await adapter.backend();
  if (adapter.kvUnified) logLine("info", `KV cache: one buffer shared by the ${config.maxNumSeqs} sequences (--kv_unified true)`, { event: "kv_layout", kvUnified: true });
  if (config.mode === "validate") {
    const metadata = adapter.metadata();
    await adapter.dispose();
    const ms = (from: number, to: number): number | null => (from > 0 && to > 0 ? Math.round(to - from) : null);
    const timings = { startMs: Math.round(phases.start), backendMs: ms(phases.start, phases.backend), modelMs: ms(phases.backend, phases.model), contextMs: ms(phases.model, phases.context) };
    process.stdout.write(JSON.stringify({ ok: true, metadata, backend, timings }) + "\n");
    return;
  }
  if (!channel) throw new Error("serve mode without a channel");

  // Warm-up before ready (src/engine/warmup.ts): every batch shape once, on slots that are cleared again, so the
  // first requests pay no GPU pipeline compilation. On CPU only when asked (nothing to compile there).
  let warmupMs: number | undefined;
  if (shouldWarmUp(config.warmup ?? "auto", backend.gpu)) {
    const report = await warmUp(adapter, config, adapter.bosToken ?? 0);
    warmupMs = Math.round(report.ms);
    const cut = report.skipped > 0 ? `; ${report.skipped} more left out: the ${WARMUP_BUDGET_MS / 1000} s budget ran out, their first use compiles` : "";
    logLine(report.skipped > 0 ? "warn" : "info", `warm-up: ${report.shapes.length} batch shapes in ${warmupMs} ms${cut}`, { event: "warmup", ms: warmupMs, widths: report.shapes.map((s) => s.sequences * s.tokensPerSequence), skipped: report.skipped });
  }

  // Test-only fault injection wraps the adapter (docs/fault-injection.md); off unless KEEL_FAULT_INJECTION is set.
  const switches = faultSwitchesFrom(process.env);
  const faulty = switches
    ? new FaultyBackend(adapter, switches, (config.generation ?? 1) === 1, {
        injected: (fault, step) => logLine("warn", "fault injected", { fault, step }),
        abort: () => process.abort(),
      })
    : null;
  if (switches) logLine("warn", "fault injection is ON (test-only)", { faults: switches, generation: config.generation ?? 1 });
  const loopBackend: ModelBackend = faulty ?? adapter;
  const loop = new StepLoop(
    loopBackend,
    {
      maxNumSeqs: config.maxNumSeqs,
      maxNumBatchedTokens: config.maxNumBatchedTokens,
      maxModelLen: config.maxModelLen,
      prefixCaching: config.prefixCaching,
      partialTrim: adapter.supportsPartialTrim,
      ...(config.maxPromptLen !== undefined ? { maxPromptLen: config.maxPromptLen } : {}),
    },
    send,
    {
      onInvariantViolation: (v) => logLine("error", "scheduler invariant violated", { violations: v }),
      promptLookup: config.promptLookup ? { numAssistantTokens: DEFAULT_NUM_ASSISTANT_TOKENS, maxNgramSize: DEFAULT_MAX_NGRAM_SIZE } : null,
    },
  );

  const decoder = new FrameDecoder();
  channel.on("data", (chunk: Buffer) => {
    for (const frame of decoder.push(chunk)) {
      if ("error" in frame) {
        send({ v: PROTOCOL_VERSION, type: "protocol_error", message: frame.error });
        continue;
      }
      const parsed = parseGatewayMessage(frame.message);
      if (!parsed.ok) {
        // A sound add with unusable params refuses that request only; anything else is not a message.
        if ("refuse" in parsed) send({ v: PROTOCOL_VERSION, type: "request_error", id: parsed.refuse.id, code: parsed.refuse.code, message: parsed.error });
        else send({ v: PROTOCOL_VERSION, type: "protocol_error", message: parsed.error });
        continue;
      }
      const m = parsed.message;
      if (m.type === "ping") send({ v: PROTOCOL_VERSION, type: "pong", nonce: m.nonce, step: loop.steps });
      else if (m.type === "shutdown") loop.stop();
      else {
        if (m.type === "add") faulty?.noteAdd(m);
        loop.submit(m);
      }
    }
  });
  // The gateway is gone: nobody can read our output; stop at the next boundary — or exit anyway if the step in
  // flight never ends (a hung engine must not outlive its gateway).
  const orphaned = (): void => {
    loop.stop();
    setTimeout(() => process.exit(0), 5000).unref();
  };
  channel.on("close", orphaned);
  channel.on("error", orphaned);

  send({
    v: PROTOCOL_VERSION,
    type: "ready",
    pid: process.pid,
    model: adapter.metadata(),
    limits: { maxNumSeqs: config.maxNumSeqs, maxNumBatchedTokens: config.maxNumBatchedTokens, maxModelLen: config.maxModelLen },
    engine: "node-llama-cpp@3.21.1",
    // Truthful: resume is exact (per-position seeds, penalty state from ids; docs/protocol.md §6.3–6.4), raw
    // logprobs up to loop.maxTopLogprobs, the whole sampling set, guides (GBNF; resumed guides replay exactly);
    // no shared prefill (prefix cache only).
    capabilities: { exactSeededResume: true, maxTopLogprobs: loop.maxTopLogprobs, extendedSampling: true, grammars: loop.grammars, sharedPrefill: false, promptLookup: true },
    backend,
    loadMs: Date.now() - startedAt,
    ...(warmupMs !== undefined ? { warmupMs } : {}),
  });
  // Debug: the gateway logs its own "engine ready" line from `ready` (load time, backend, KV capacity).
  logLine("debug", "model loaded; step loop running", { model: config.modelPath, threads: config.threads, kvCacheType: config.kvCacheType, flashAttention: config.flashAttention, backend });
  await loop.run();
  await adapter.dispose();
  channel.end();
}


// Last resort inside the engine process: report, then exit non-zero so the gateway restarts the engine. The
// gateway process is never affected (docs/design-rules.md, "contained errors").
process.on("uncaughtException", (err) => {
  logLine("fatal", `uncaught exception in the engine: ${err?.stack ?? String(err)}`);
  process.exit(1);
});

main().then(
  () => {
    process.exitCode = 0;
  },
  (err: unknown) => {
    // Startup failed, or the step loop hit a bug: report and exit non-zero (the open channel would otherwise keep
    // a loop-less engine alive and answering pings); the gateway restarts the engine.
    logLine("fatal", `engine failed: ${(err as Error)?.message ?? String(err)}`);
    process.exit(1);
  },
);
