/**
 * When the gateway received each HTTP request (performance.now() ms), stamped by the first hook every request runs
 * (app.ts): the start of a request's `accept` phase of the first token (keel_request_ttft_phase_seconds).
 */
import type { IncomingMessage } from "node:http";

/** Receive times by request; entries go with their requests. */
const stamps = new WeakMap<IncomingMessage, number>();

/** Record that `req` was received now. */
export function markReceived(req: IncomingMessage): void {
  stamps.set(req, performance.now());
}

/** When `req` was received (performance.now() ms), or `fallback` when it was never stamped. */
export function receivedAt(req: IncomingMessage, fallback: number): number {
  return stamps.get(req) ?? fallback;
}
