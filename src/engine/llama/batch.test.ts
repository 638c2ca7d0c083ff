import { describe, expect, it } from "vitest";
import { decodeBatch, DecodePace, SYNC_PREFILL_MAX_MS } from "./batch.js";
import { NativeCallGuard, type Internals } from "./internals.js";

/** A native context that records where each batch was decoded: "sync" (this thread) or "worker". */
function fakeNative() {
  const ran: ("sync" | "worker")[] = [];
  let added = 0;
  const native = {
    ctx: {
      initBatch: () => void (added = 0),
      addToBatch: () => Uint32Array.of(added++),
      decodeBatch: async () => void ran.push("worker"),
    },
    decodeSync: () => void ran.push("sync"),
    disposeGuard: { createPreventDisposalHandle: () => ({ dispose() {} }) },
  } as unknown as Internals;
  return { native, ran };
}

const prefill = (n: number) => ({ slot: 0, pos: 0, tokens: Array.from({ length: n }, (_, i) => i + 1), wantsLogits: true });
const decodeOne = (slot: number) => ({ slot, pos: 10, tokens: [7], wantsLogits: true });

describe("where a batch is decoded (decodeBatch with a DecodePace)", () => {
  it("a decode step runs on this thread; the first prefill goes to a worker, later ones that the pace says are quick run here", async () => {
    const { native, ran } = fakeNative();
    const guard = new NativeCallGuard();
    const pace = new DecodePace();
    await decodeBatch(native, guard, 512, [decodeOne(0), decodeOne(1)], pace);
    expect(ran).toEqual(["sync"]);
    expect(pace.msPerToken).toBeNull(); // decode steps do not set the prefill pace
    await decodeBatch(native, guard, 512, [prefill(40)], pace);
    expect(ran).toEqual(["sync", "worker"]);
    expect(pace.msPerToken).not.toBeNull();
    // The fake decodes instantly: a prefill with a decode token beside it is quick now.
    await decodeBatch(native, guard, 512, [decodeOne(1), prefill(40)], pace);
    expect(ran).toEqual(["sync", "worker", "sync"]);
  });

  it("a prefill the pace says is long goes to a worker (the engine keeps answering pings)", async () => {
    const { native, ran } = fakeNative();
    const pace = new DecodePace();
    pace.record(100, 100 * 1); // 1 ms per token
    await decodeBatch(native, new NativeCallGuard(), 512, [prefill(SYNC_PREFILL_MAX_MS * 2)], pace);
    expect(ran).toEqual(["worker"]);
    pace.record(100, 100 * 1);
    await decodeBatch(native, new NativeCallGuard(), 512, [prefill(SYNC_PREFILL_MAX_MS)], pace);
    expect(ran).toEqual(["worker", "sync"]);
  });

  it("without Keel's addon every batch goes to a worker", async () => {
    const { native, ran } = fakeNative();
    const plain = { ...native, decodeSync: null } as Internals;
    const pace = new DecodePace();
    pace.record(10, 0.01);
    await decodeBatch(plain, new NativeCallGuard(), 512, [decodeOne(0)], pace);
    await decodeBatch(plain, new NativeCallGuard(), 512, [prefill(4)], pace);
    expect(ran).toEqual(["worker", "worker"]);
  });
});

describe("host work alongside a decode (a GPU computes while the loop sends the last step's message)", () => {
  /** A native context with Keel's queued decode: records queue, wait and what ran between them. */
  function queuingNative() {
    const log: string[] = [];
    let added = 0;
    let finishWorker: (() => void) | null = null;
    const native = {
      ctx: {
        initBatch: () => void (added = 0),
        addToBatch: () => Uint32Array.of(added++),
        decodeBatch: () => new Promise<void>((resolve) => (log.push("worker start"), (finishWorker = () => (log.push("worker end"), resolve())))),
      },
      decodeSync: (_ctx: unknown, wait?: boolean) => void log.push(wait === false ? "queue" : "decode and wait"),
      synchronize: () => void log.push("wait"),
      disposeGuard: { createPreventDisposalHandle: () => ({ dispose() {} }) },
    } as unknown as Internals;
    return { native, log, finish: () => finishWorker!() };
  }

  it("a decode step is queued, the host work runs, then the wait; without host work it decodes and waits in one call", async () => {
    const { native, log } = queuingNative();
    const guard = new NativeCallGuard();
    await decodeBatch(native, guard, 512, [decodeOne(0)], new DecodePace(), () => void log.push(`alongside (decoding: ${guard.decoding})`));
    expect(log).toEqual(["queue", "alongside (decoding: true)", "wait"]);
    log.length = 0;
    await decodeBatch(native, guard, 512, [decodeOne(0)], new DecodePace());
    expect(log).toEqual(["decode and wait"]);
  });

  it("a prefill on a worker: the host work runs while it decodes; if that work throws, the decode still settles first", async () => {
    const { native, log, finish } = queuingNative();
    const guard = new NativeCallGuard();
    let settled = false;
    const done = decodeBatch(native, guard, 512, [prefill(40)], new DecodePace(), () => {
      log.push("alongside");
      throw new Error("frame write failed");
    }).finally(() => (settled = true));
    const outcome = expect(done).rejects.toThrow("frame write failed");
    for (let i = 0; i < 10; i++) await new Promise<void>((r) => setImmediate(r));
    expect(settled).toBe(false); // the worker still decodes: nothing may touch the context yet
    expect(guard.decoding).toBe(true);
    finish();
    await outcome;
    expect(log).toEqual(["worker start", "alongside", "worker end"]);
    expect(guard.decoding).toBe(false);
  });

  it("the wait runs even when the host work throws (a queued decode is never left behind)", async () => {
    const { native, log } = queuingNative();
    const guard = new NativeCallGuard();
    await expect(decodeBatch(native, guard, 512, [decodeOne(0)], new DecodePace(), () => { throw new Error("boom"); })).rejects.toThrow("boom");
    expect(log).toEqual(["queue", "wait"]);
    expect(guard.decoding).toBe(false);
  });
});

describe("DecodePace", () => {
  it("is quick only once measured, and only for batches expected within SYNC_PREFILL_MAX_MS", () => {
    const pace = new DecodePace();
    expect(pace.quick(1)).toBe(false);
    pace.record(50, 5); // 0.1 ms per token
    expect(pace.quick(SYNC_PREFILL_MAX_MS * 10)).toBe(true);
    expect(pace.quick(SYNC_PREFILL_MAX_MS * 10 + 1)).toBe(false);
  });
});
