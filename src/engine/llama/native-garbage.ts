/**
 * Native memory that node-llama-cpp frees only when V8 collects a wrapper. A native sampler (`AddonSampler`) holds a
 * candidates buffer of the vocabulary's size (12 bytes a token: 1.8 MB for Qwen's 151,936 tokens) that its
 * `dispose()` does not free: the C++ destructor frees it when V8 finalizes the JS wrapper. V8 does not know about that
 * memory, and a request's sampler lives long enough to reach the old generation, so the wrappers of finished requests
 * wait for the next full collection — which a small JS heap seldom needs. The engine's RSS then climbs by the
 * vocabulary's size per request between collections (300 requests on Qwen2.5-Coder-0.5B: +518 MB; issue #22's soak:
 * the engine's RSS rising for minutes, then falling at a full collection). docs/upstream.md.
 *
 * This ledger counts the bytes disposed objects still hold and asks V8 for a full collection once they pass a
 * threshold (between steps: the collection runs in a setImmediate, never inside a decode).
 */
import v8 from "node:v8";
import vm from "node:vm";

/** Bytes of a native sampler's candidates buffer per vocabulary token (`sizeof(llama_token_data)`: id, logit, p). */
export const CANDIDATE_BYTES_PER_TOKEN = 12;

/** Disposed-but-uncollected native bytes that trigger a full collection (a few ms on the engine's small heap). */
export const DEFAULT_GARBAGE_THRESHOLD_BYTES = 64 * 1024 * 1024;

/** V8's full collection, exposed at run time (the engine is not started with --expose-gc), or null if refused. */
export function fullCollection(): (() => void) | null {
  const exposed = (globalThis as { gc?: () => void }).gc;
  if (typeof exposed === "function") return exposed;
  try {
    v8.setFlagsFromString("--expose-gc");
    const gc = vm.runInNewContext("gc") as unknown;
    return typeof gc === "function" ? (gc as () => void) : null;
  } catch {
    return null;
  }
}

export class NativeGarbage {
  /** Bytes held by disposed native objects since the last collection. */
  #pending = 0;
  #scheduled = false;
  /** Full collections asked for so far. */
  collections = 0;

  constructor(
    private readonly thresholdBytes = DEFAULT_GARBAGE_THRESHOLD_BYTES,
    private readonly collect: (() => void) | null = fullCollection(),
  ) {}

  /** Bytes held by disposed native objects that no collection has reclaimed yet. */
  get pendingBytes(): number {
    return this.#pending;
  }

  /** `bytes` of native memory now wait for V8 to collect their wrapper; past the threshold, a collection is scheduled. */
  released(bytes: number): void {
    this.#pending += bytes;
    if (this.#pending < this.thresholdBytes || this.#scheduled || this.collect === null) return;
    this.#scheduled = true;
    setImmediate(() => {
      this.#scheduled = false;
      this.#pending = 0;
      this.collections += 1;
      this.collect!();
    });
  }
}
