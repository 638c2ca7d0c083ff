/**
 * Shutdown of a serving `keel serve`: the first SIGTERM/SIGINT drains (in-flight requests may finish within the
 * shutdown timeout); a second, distinct one stops waiting for them. The same for one model and for `--config_path`.
 *
 * @module
 */
import type { Gateway } from "../gateway/server.js";

/**
 * Counts shutdown signals. npm (`npm run serve`) forwards the terminal's Ctrl-C to Keel, which also receives it
 * from the terminal itself: two deliveries of one keystroke a few ms apart. A signal within `sameWithinMs` of the
 * previous one is the same signal; only a later one means "hurry".
 */
export class ShutdownSignals {
  /** Distinct signals seen. */
  count = 0;
  /** When the last distinct signal arrived (ms since epoch), or null. */
  private lastAt: number | null = null;

  constructor(private readonly sameWithinMs = 100) {}

  /** Record a signal delivered at `now`; returns "drain" for the first, "hurry" for a later distinct one, "same" for a duplicate. */
  receive(now = Date.now()): "drain" | "hurry" | "same" {
    if (this.lastAt !== null && now - this.lastAt < this.sameWithinMs) return "same";
    this.lastAt = now;
    this.count += 1;
    return this.count === 1 ? "drain" : "hurry";
  }
}

/** What the shutdown drives: the gateway's drain, its log, and where signals come from (the process). */
export type Drainable = Pick<Gateway, "drain" | "hurryDrain" | "log">;

/**
 * Drain `gw` on the first SIGTERM/SIGINT, hurry it on a later distinct one.
 * @returns a promise settled once the drain has ended (an error during it is logged): the caller then exits
 */
export function drainOnSignals(gw: Drainable, shutdownTimeoutMs: number, on: (signal: NodeJS.Signals, handler: () => void) => void = (s, h) => void process.on(s, h)): Promise<void> {
  return new Promise<void>((drained) => {
    const signals = new ShutdownSignals();
    const shutdown = (sig: NodeJS.Signals): void => {
      const meaning = signals.receive();
      if (meaning === "same") {
        gw.log.info({ event: "shutdown_signal_repeated", signal: sig }, "the same shutdown signal delivered twice (e.g. by npm and the terminal); counted once");
        return;
      }
      gw.log.info({ event: "shutdown", signal: sig, count: signals.count }, "shutting down");
      if (meaning === "hurry") return gw.hurryDrain(); // the drain already running stops waiting for in-flight requests
      gw.drain(shutdownTimeoutMs)
        .catch((err: unknown) => gw.log.error({ err: (err as Error)?.message }, "error during shutdown"))
        .finally(() => drained());
    };
    on("SIGTERM", () => shutdown("SIGTERM"));
    on("SIGINT", () => shutdown("SIGINT"));
  });
}
