import { describe, expect, it } from "vitest";
import {
  admit,
  cancel,
  deathsOf,
  engineDied,
  finish,
  firstToken,
  FORGIVE_AFTER_TOKENS,
  generated,
  heldByEngine,
  initial,
  isolate,
  phaseOf,
  resubmit,
  suspect,
  type CancelCause,
  type FinishReason,
  type Lifecycle,
} from "./lifecycle.js";

// One example of every state; live states carry a non-zero death count so that a transition that drops it shows.
const queued: Lifecycle = { state: "queued", deaths: 1 };
const prefill: Lifecycle = { state: "prefill", deaths: 1 };
const decode: Lifecycle = { state: "decode", deaths: 1, sinceSubmit: 2 };
const recovering: Lifecycle = { state: "recovering", phase: "prefill", deaths: 2 };
const suspected: Lifecycle = { state: "suspect", phase: "decode", deaths: 3 };
const cancellingDisconnect: Lifecycle = { state: "cancelling", phase: "prefill", cause: "client_disconnect" };
const cancellingStop: Lifecycle = { state: "cancelling", phase: "decode", cause: "stop_string" };
const cancellingShutdown: Lifecycle = { state: "cancelling", phase: "queued", cause: "shutdown" };
const cancellingInternal: Lifecycle = { state: "cancelling", phase: "decode", cause: "internal_error" };
const finished: Lifecycle = { state: "finished", reason: "length" };

const states: [string, Lifecycle][] = [
  ["queued", queued],
  ["prefill", prefill],
  ["decode", decode],
  ["recovering", recovering],
  ["suspect", suspected],
  ["cancelling(client_disconnect)", cancellingDisconnect],
  ["cancelling(stop_string)", cancellingStop],
  ["cancelling(shutdown)", cancellingShutdown],
  ["cancelling(internal_error)", cancellingInternal],
  ["finished", finished],
];

const reasons: FinishReason[] = ["stop", "length", "abort", "error"];
const causes: CancelCause[] = ["client_disconnect", "stop_string", "shutdown", "internal_error", "sibling_failed", "guide_unsatisfiable"];
/** What a cancelled request reports when it is released (written out, not computed by the module). */
const cancelledReason: Record<CancelCause, FinishReason> = { client_disconnect: "abort", stop_string: "stop", shutdown: "abort", internal_error: "error", sibling_failed: "abort", guide_unsatisfiable: "error" };
const cancelling = new Set(["cancelling(client_disconnect)", "cancelling(stop_string)", "cancelling(shutdown)", "cancelling(internal_error)"]);

/** Expected result per state name; names not listed expect null. */
function table(t: Record<string, Lifecycle | null>): (name: string) => Lifecycle | null {
  return (name) => t[name] ?? null;
}

describe("lifecycle", () => {
  it("starts queued with no deaths", () => {
    expect(initial).toEqual({ state: "queued", deaths: 0 });
  });

  // A request cancelled while queued whose admission is reported afterwards was in prefill when cancelled.
  const admitTo = table({ queued: { state: "prefill", deaths: 1 }, "cancelling(shutdown)": { state: "cancelling", phase: "prefill", cause: "shutdown" } });
  it.each(states)("admit from %s", (name, s) => {
    expect(admit(s)).toEqual(admitTo(name));
  });

  const firstTokenTo = table({ queued: { state: "decode", deaths: 1, sinceSubmit: 0 }, prefill: { state: "decode", deaths: 1, sinceSubmit: 0 } });
  it.each(states)("firstToken from %s", (name, s) => {
    expect(firstToken(s)).toEqual(firstTokenTo(name));
  });

  const generatedTo = table({
    queued: { state: "decode", deaths: 1, sinceSubmit: 3 },
    prefill: { state: "decode", deaths: 1, sinceSubmit: 3 },
    decode: { state: "decode", deaths: 1, sinceSubmit: 5 },
  });
  it.each(states)("generated(3) from %s", (name, s) => {
    expect(generated(s, 3)).toEqual(generatedTo(name));
  });

  it("progress forgives earlier deaths only once FORGIVE_AFTER_TOKENS tokens came since the last submission", () => {
    expect(FORGIVE_AFTER_TOKENS).toBe(8);
    const almost = generated({ state: "prefill", deaths: 3 }, 7);
    expect(almost).toEqual({ state: "decode", deaths: 3, sinceSubmit: 7 });
    expect(generated(almost!, 1)).toEqual({ state: "decode", deaths: 0, sinceSubmit: 8 });
    // In one output as well.
    expect(generated({ state: "queued", deaths: 2 }, 8)).toEqual({ state: "decode", deaths: 0, sinceSubmit: 8 });
    // Progress counted before a death does not count after the resubmission.
    const died = engineDied({ state: "decode", deaths: 1, sinceSubmit: 7 }, true)!;
    const again = resubmit(died)!;
    expect(generated(generated(again, 0)!, 1)).toEqual({ state: "decode", deaths: 2, sinceSubmit: 1 });
  });

  const diedBlamed = table({
    queued: { state: "recovering", phase: "queued", deaths: 2 },
    prefill: { state: "recovering", phase: "prefill", deaths: 2 },
    decode: { state: "recovering", phase: "decode", deaths: 2 },
    "cancelling(client_disconnect)": { state: "finished", reason: "abort" },
    "cancelling(stop_string)": { state: "finished", reason: "stop" },
    "cancelling(shutdown)": { state: "finished", reason: "abort" },
    "cancelling(internal_error)": { state: "finished", reason: "error" },
  });
  it.each(states)("engineDied (blamed) from %s", (name, s) => {
    expect(engineDied(s, true)).toEqual(diedBlamed(name));
  });

  const diedUnblamed = table({
    queued: { state: "recovering", phase: "queued", deaths: 1 },
    prefill: { state: "recovering", phase: "prefill", deaths: 1 },
    decode: { state: "recovering", phase: "decode", deaths: 1 },
    "cancelling(client_disconnect)": { state: "finished", reason: "abort" },
    "cancelling(stop_string)": { state: "finished", reason: "stop" },
    "cancelling(shutdown)": { state: "finished", reason: "abort" },
    "cancelling(internal_error)": { state: "finished", reason: "error" },
  });
  it.each(states)("engineDied (not blamed) from %s keeps the death count", (name, s) => {
    expect(engineDied(s, false)).toEqual(diedUnblamed(name));
  });

  const suspectTo = table({ recovering: { state: "suspect", phase: "prefill", deaths: 2 } });
  it.each(states)("suspect from %s", (name, s) => {
    expect(suspect(s)).toEqual(suspectTo(name));
  });

  const resubmitTo = table({ recovering: { state: "queued", deaths: 2 }, suspect: { state: "queued", deaths: 3 } });
  it.each(states)("resubmit from %s", (name, s) => {
    expect(resubmit(s)).toEqual(resubmitTo(name));
  });

  const isolateTo = table({ recovering: { state: "finished", reason: "error" }, suspect: { state: "finished", reason: "error" } });
  it.each(states)("isolate from %s", (name, s) => {
    expect(isolate(s)).toEqual(isolateTo(name));
  });

  it.each(states)("cancel from %s, for every cause", (name, s) => {
    for (const cause of causes) {
      const next = cancel(s, cause);
      if (name === "queued" || name === "prefill" || name === "decode") expect(next).toEqual({ state: "cancelling", phase: name, cause });
      // No engine holds a recovering or suspect request: a cancel releases it at once, as its cause says.
      else if (name === "recovering" || name === "suspect") expect(next).toEqual({ state: "finished", reason: cancelledReason[cause] });
      else expect(next).toBeNull();
    }
  });

  it.each(states)("finish from %s, for every reason", (name, s) => {
    for (const reason of reasons) {
      const next = finish(s, reason);
      if (name === "finished") expect(next).toBeNull();
      else if (s.state === "cancelling") expect(next).toEqual({ state: "finished", reason: cancelledReason[s.cause] });
      else expect(next).toEqual({ state: "finished", reason });
    }
  });

  it("finish of a cancelling request gives abort, or stop for a stop string, whatever the engine says", () => {
    expect(finish(cancellingDisconnect, "length")).toEqual({ state: "finished", reason: "abort" });
    expect(finish(cancellingShutdown, "error")).toEqual({ state: "finished", reason: "abort" });
    expect(finish(cancellingStop, "abort")).toEqual({ state: "finished", reason: "stop" });
    expect(finish(cancellingStop, "length")).toEqual({ state: "finished", reason: "stop" });
  });

  it("finish of a request cancelled for an internal error gives error", () => {
    for (const reason of reasons) expect(finish(cancellingInternal, reason)).toEqual({ state: "finished", reason: "error" });
  });

  const phaseTable: Record<string, string | null> = {
    queued: "queued",
    prefill: "prefill",
    decode: "decode",
    recovering: "prefill",
    suspect: "decode",
    "cancelling(client_disconnect)": "prefill",
    "cancelling(stop_string)": "decode",
    "cancelling(shutdown)": "queued",
    "cancelling(internal_error)": "decode",
    finished: null,
  };
  it.each(states)("phaseOf %s", (name, s) => {
    expect(phaseOf(s)).toBe(phaseTable[name]);
  });

  it.each(states)("heldByEngine and deathsOf for %s", (name, s) => {
    const held = name === "queued" || name === "prefill" || name === "decode" || cancelling.has(name);
    expect(heldByEngine(s)).toBe(held);
    const deaths: Record<string, number> = { queued: 1, prefill: 1, decode: 1, recovering: 2, suspect: 3 };
    expect(deathsOf(s)).toBe(deaths[name] ?? 0);
  });

  it("does not mutate the state it is given", () => {
    const s: Lifecycle = { state: "decode", deaths: 1, sinceSubmit: 7 };
    const r: Lifecycle = { state: "recovering", phase: "decode", deaths: 2 };
    admit(s);
    firstToken(s);
    generated(s, 9);
    engineDied(s, true);
    cancel(s, "shutdown");
    finish(s, "stop");
    resubmit(r);
    isolate(r);
    cancel(r, "client_disconnect");
    suspect(r);
    expect(s).toEqual({ state: "decode", deaths: 1, sinceSubmit: 7 });
    expect(r).toEqual({ state: "recovering", phase: "decode", deaths: 2 });
  });
});
