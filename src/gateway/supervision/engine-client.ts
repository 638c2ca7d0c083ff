/**
 * The gateway's side of the engine channel: spawns the engine process, frames messages on its fd 3, checks every
 * frame against the protocol's schema, answers for its health (ready + recent pong), and restarts it with bounded
 * exponential backoff when it dies.
 *
 * It never interprets engine state; it forwards typed messages to a listener (the request registry). A frame that
 * does not decode or does not validate is an engine fault, not a gateway crash (design rule "contained errors"): the
 * client logs it, counts it and kills that engine (SIGKILL), whose exit then takes the path of any other engine death
 * (restart, resume), with the fault named in the exit it reports.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import type { Duplex } from "node:stream";
import { encodeFrame, FrameDecoder } from "../../protocol/framing.js";
import { parseEngineMessage } from "../../protocol/engine-validator.js";
import { PROTOCOL_VERSION, type EngineMessage, type GatewayMessage, type ReadyMessage } from "../../protocol/messages.js";
import type { EngineCommand, EngineConfig } from "../../protocol/engine-config.js";

/** Path of the compiled engine entry point. */
export const ENGINE_MAIN = fileURLToPath(new URL("../../engine/main.js", import.meta.url));

/** The default engine command: this package's llama.cpp engine (`node dist/engine/main.js`). */
export const DEFAULT_ENGINE_COMMAND: EngineCommand = { command: process.execPath, args: [ENGINE_MAIN] };

/** Spawn an engine process: `command ...args <config JSON>` (docs/protocol.md, Starting an engine). */
export function spawnEngine(command: EngineCommand, config: EngineConfig, stdio: ("ignore" | "pipe")[], detached: boolean): ChildProcess {
  return spawn(command.command, [...command.args, JSON.stringify(config)], {
    stdio,
    detached,
    ...(command.env ? { env: { ...process.env, ...command.env } } : {}),
  });
}

/**
 * Why the client itself killed an engine process: it broke the protocol — a frame that did not decode (framing.ts)
 * or did not validate (engine-validator.ts). A protocol bug is the engine's, never a request's.
 */
export interface EngineFault {
  kind: "protocol";
  /** What was wrong with the frame, e.g. `invalid step message: outputs.0.text is required`. */
  message: string;
}

/** How an engine process ended. */
export interface EngineExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** Set when the client killed the process for a fault (then `signal` is SIGKILL); null for any other death. */
  fault: EngineFault | null;
}

/** Callbacks of the engine client. */
export interface EngineListener {
  onReady(msg: ReadyMessage): void;
  onMessage(msg: EngineMessage): void;
  /** The engine process exited (code/signal, and the fault when the client killed it for one); every request it held is gone. */
  onExit(info: EngineExit): void;
  onLog(line: string, stream: "stdout" | "stderr"): void;
}

/** Options of the client. */
export interface EngineClientOptions {
  config: Omit<EngineConfig, "mode">;
  /** How to run the engine (default {@link DEFAULT_ENGINE_COMMAND}). */
  command?: EngineCommand;
  /** Ping period (ms) and how stale the last pong may be before the engine counts as not ready (ms). */
  pingIntervalMs: number;
  readyStalenessMs: number;
  /** Restart backoff bounds (ms). */
  restartMinMs: number;
  restartMaxMs: number;
}

export class EngineClient {
  /** The running engine process, or null between a death and the restart. */
  private child: ChildProcess | null = null;
  /** Duplex pipe on the child's fd 3. */
  private channel: Duplex | null = null;
  /** Whether this turn's messages are held for one write at the turn's end (see send). */
  private corked = false;
  /** Last `ready` of the current process; null until it arrives. */
  ready: ReadyMessage | null = null;
  /** When the last pong arrived (ms since epoch). */
  private lastPongAt = 0;
  private pingTimer: NodeJS.Timeout | null = null;
  private restartTimer: NodeJS.Timeout | null = null;
  /** Consecutive deaths without a ready in between (drives the backoff). */
  private consecutiveFailures = 0;
  /** Set by stop(): no more restarts. */
  private stopping = false;
  /**
   * Engine processes started or scheduled to start (1 = no restart yet). Counted when a restart is scheduled, not
   * when it spawns, so that from the moment of a death the gateway says "restarting", not "still loading".
   */
  starts = 0;
  /** When the current engine process was spawned (ms since epoch). */
  startedAt = 0;
  /** Engine processes killed for a protocol fault since the client was created. */
  protocolFaults = 0;

  constructor(
    private readonly opts: EngineClientOptions,
    private readonly listener: EngineListener,
  ) {}

  /** Start the engine process. */
  start(): void {
    this.stopping = false;
    this.starts += 1;
    this.spawnEngine();
    this.pingTimer = setInterval(() => this.send({ v: PROTOCOL_VERSION, type: "ping", nonce: Date.now() }), this.opts.pingIntervalMs);
    this.pingTimer.unref();
  }

  /** Engine reported ready and answered a ping recently. */
  get isReady(): boolean {
    return this.ready !== null && Date.now() - this.lastPongAt <= this.opts.readyStalenessMs;
  }

  /** PID of the current engine process. */
  get pid(): number | null {
    return this.child?.pid ?? null;
  }

  /** Engine processes that exited in a row without reporting ready. */
  get failedStarts(): number {
    return this.consecutiveFailures;
  }

  /** When the engine last answered a ping (ms since epoch). */
  get lastPong(): number {
    return this.lastPongAt;
  }

  /** Kill the engine process (watchdog); the exit handler restarts it. */
  kill(): void {
    this.child?.kill("SIGKILL");
  }

  /**
   * Send a message; returns false (and drops it) when no engine is connected. Messages are written once per
   * event-loop turn: requests that arrived together (a burst of clients, read in one poll) reach the engine in one
   * write, so its next step boundary admits them all instead of starting a prefill with the first alone.
   */
  send(msg: GatewayMessage): boolean {
    const channel = this.channel;
    if (!channel || channel.destroyed || !this.ready) return false;
    if (!this.corked) {
      this.corked = true;
      channel.cork();
      setImmediate(() => {
        this.corked = false;
        channel.uncork();
      });
    }
    channel.write(encodeFrame(msg));
    return true;
  }

  /** Ask the engine to shut down and wait for it to exit (kills it after `timeoutMs`). */
  async stop(timeoutMs = 5000): Promise<void> {
    this.stopping = true;
    if (this.pingTimer) clearInterval(this.pingTimer);
    if (this.restartTimer) clearTimeout(this.restartTimer);
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    if (this.channel && !this.channel.destroyed) this.channel.write(encodeFrame({ v: PROTOCOL_VERSION, type: "shutdown" }));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    await exited;
    clearTimeout(timer);
  }

  private spawnEngine(): void {
    this.startedAt = Date.now();
    this.ready = null;
    const config: EngineConfig = { ...this.opts.config, mode: "serve", generation: this.starts };
    // Own process group: a terminal's Ctrl-C reaches only the gateway, which then stops the engine in order.
    // If the gateway dies, the engine sees its channel close and exits by itself.
    const child = spawnEngine(this.opts.command ?? DEFAULT_ENGINE_COMMAND, config, ["ignore", "pipe", "pipe", "pipe"], true);
    this.child = child;
    const channel = child.stdio[3] as Duplex;
    this.channel = channel;
    const decoder = new FrameDecoder();
    /** The fault this process was killed for; once set, its later frames are ignored (design rule "late events"). */
    let fault: EngineFault | null = null;
    channel.on("data", (chunk: Buffer) => {
      if (fault) return;
      for (const frame of decoder.push(chunk)) {
        const parsed = "error" in frame ? { ok: false as const, error: `bad frame: ${frame.error}` } : parseEngineMessage(frame.message);
        const problem = parsed.ok ? this.sequenceProblem(parsed.message) : parsed.error;
        if (problem !== null || !parsed.ok) {
          const why = problem ?? "invalid frame";
          fault = { kind: "protocol", message: why };
          this.protocolFaults += 1;
          this.listener.onLog(`engine broke the protocol (${why}); killing it to restart and resume`, "stderr");
          child.kill("SIGKILL");
          return;
        }
        try {
          this.handle(parsed.message);
        } catch (err) {
          // A bug in handling one message must not take the gateway down.
          this.listener.onLog(`error while handling an engine message: ${(err as Error)?.stack ?? String(err)}`, "stderr");
        }
      }
    });
    channel.on("error", () => undefined); // the exit handler does the bookkeeping
    for (const [stream, name] of [[child.stdout, "stdout"], [child.stderr, "stderr"]] as const) {
      let buf = "";
      stream?.setEncoding("utf8");
      stream?.on("data", (d: string) => {
        buf += d;
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (line.trim()) this.listener.onLog(line, name);
        }
      });
    }
    child.on("error", (err) => this.listener.onLog(`engine process error: ${err.message}`, "stderr"));
    child.on("exit", (code, signal) => {
      if (this.child !== child) return;
      // Only a process that never reported ready is a failed start: the death of a serving engine is not.
      const failedStart = this.ready === null;
      this.child = null;
      this.channel = null;
      this.ready = null;
      // Schedule the restart before anything else can go wrong in the listener.
      if (!this.stopping) {
        const delay = Math.min(this.opts.restartMaxMs, this.opts.restartMinMs * 2 ** this.consecutiveFailures);
        if (failedStart) this.consecutiveFailures += 1;
        this.starts += 1;
        this.restartTimer = setTimeout(() => this.spawnEngine(), delay);
        this.restartTimer.unref();
      }
      try {
        this.listener.onExit({ code, signal, fault });
      } catch (err) {
        this.listener.onLog(`error while handling the engine's exit: ${(err as Error)?.stack ?? String(err)}`, "stderr");
      }
    });
  }

  /**
   * What a frame that is valid on its own breaks in the current process's sequence, or null: a second `ready`
   * (it would replace the limits and template the gateway serves with), or a step that reports one request twice
   * (its tokens would be applied twice). The schema cannot say either.
   */
  private sequenceProblem(msg: EngineMessage): string | null {
    if (msg.type === "ready" && this.ready !== null) return "a second ready message from an engine that is already ready";
    if (msg.type === "step") {
      const seen = new Set<string>();
      for (const o of msg.outputs) {
        if (seen.has(o.id)) return `step ${msg.step} reports request ${JSON.stringify(o.id)} twice`;
        seen.add(o.id);
      }
    }
    return null;
  }

  /** One valid message of the current process (its protocol version checked by the validator). */
  private handle(msg: EngineMessage): void {
    if (msg.type === "ready") {
      this.ready = msg;
      this.lastPongAt = Date.now();
      this.consecutiveFailures = 0;
      this.listener.onReady(msg);
      return;
    }
    if (msg.type === "pong") this.lastPongAt = Date.now();
    this.listener.onMessage(msg);
  }
}
