import { describe, expect, it } from "vitest";
import { admit, cancel, finish, firstToken, initial, phaseOf, type CancelCause, type FinishReason, type Lifecycle } from "./lifecycle.js";

const queued: Lifecycle = { state: "queued" };
const prefill: Lifecycle = { state: "prefill" };
const decode: Lifecycle = { state: "decode" };
const cancellingDisconnect: Lifecycle = { state: "cancelling", phase: "prefill", cause: "client_disconnect" };
const cancellingStop: Lifecycle = { state: "cancelling", phase: "decode", cause: "stop_string" };
const cancellingShutdown: Lifecycle = { state: "cancelling", phase: "queued", cause: "shutdown" };
const cancellingInternal: Lifecycle = { state: "cancelling", phase: "decode", cause: "internal_error" };
const finished: Lifecycle = { state: "finished", reason: "length" };

const states: [string, Lifecycle][] = [
  ["queued", queued],
  ["prefill", prefill],
  ["decode", decode],
  ["cancelling(client_disconnect)", cancellingDisconnect],
  ["cancelling(stop_string)", cancellingStop],
  ["cancelling(shutdown)", cancellingShutdown],
  ["cancelling(internal_error)", cancellingInternal],
  ["finished", finished],
];

const reasons: FinishReason[] = ["stop", "length", "abort", "error"];
const causes: CancelCause[] = ["client_disconnect", "stop_string", "shutdown", "internal_error"];
/** What a cancelled request reports when the engine confirms its release. */
const cancelledReason = (cause: CancelCause): FinishReason => (cause === "stop_string" ? "stop" : cause === "internal_error" ? "error" : "abort");

describe("lifecycle", () => {
  it("starts queued", () => {
    expect(initial).toEqual({ state: "queued" });
  });

  const admitTable: Record<string, Lifecycle | null> = {
    queued: prefill,
    prefill: null,
    decode: null,
    "cancelling(client_disconnect)": null,
    "cancelling(stop_string)": null,
    "cancelling(shutdown)": { state: "cancelling", phase: "prefill", cause: "shutdown" },
    "cancelling(internal_error)": null,
    finished: null,
  };
  it.each(states)("admit from %s", (name, s) => {
    expect(admit(s)).toEqual(admitTable[name]);
  });

  const firstTokenTable: Record<string, Lifecycle | null> = {
    queued: decode,
    prefill: decode,
    decode: null,
    "cancelling(client_disconnect)": null,
    "cancelling(stop_string)": null,
    "cancelling(shutdown)": null,
    "cancelling(internal_error)": null,
    finished: null,
  };
  it.each(states)("firstToken from %s", (name, s) => {
    expect(firstToken(s)).toEqual(firstTokenTable[name]);
  });

  it.each(states)("cancel from %s, for every cause", (_name, s) => {
    for (const cause of causes) {
      const next = cancel(s, cause);
      if (s.state === "queued" || s.state === "prefill" || s.state === "decode") {
        expect(next).toEqual({ state: "cancelling", phase: s.state, cause });
      } else {
        expect(next).toBeNull();
      }
    }
  });

  it.each(states)("finish from %s, for every reason", (_name, s) => {
    for (const reason of reasons) {
      const next = finish(s, reason);
      if (s.state === "finished") expect(next).toBeNull();
      else if (s.state === "cancelling") expect(next).toEqual({ state: "finished", reason: cancelledReason(s.cause) });
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
    "cancelling(client_disconnect)": "prefill",
    "cancelling(stop_string)": "decode",
    "cancelling(shutdown)": "queued",
    "cancelling(internal_error)": "decode",
    finished: null,
  };
  it.each(states)("phaseOf %s", (name, s) => {
    expect(phaseOf(s)).toBe(phaseTable[name]);
  });

  it("does not mutate the state it is given", () => {
    const s: Lifecycle = { state: "queued" };
    admit(s);
    firstToken(s);
    cancel(s, "shutdown");
    finish(s, "stop");
    expect(s).toEqual({ state: "queued" });
  });
});
