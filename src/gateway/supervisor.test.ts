import { describe, expect, it } from "vitest";
import { deathVerdict } from "./supervisor.js";

describe("deathVerdict: whom an engine death can be charged to", () => {
  it("signals from outside (an OOM killer's SIGKILL, an operator's SIGTERM/SIGINT/SIGHUP/SIGQUIT) blame nobody", () => {
    for (const signal of ["SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"] as const) {
      expect([signal, deathVerdict({ code: null, signal }, false)]).toEqual([signal, { reason: "signal", blame: false }]);
    }
  });

  it("the engine crashing by itself (GGML abort, segfault, bus error, FPE, illegal instruction) can be a request's doing", () => {
    for (const signal of ["SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL"] as const) {
      expect([signal, deathVerdict({ code: null, signal }, false)]).toEqual([signal, { reason: "signal", blame: true }]);
    }
  });

  it("a non-zero exit (uncaught error) is blamable; a clean exit is not", () => {
    expect(deathVerdict({ code: 1, signal: null }, false)).toEqual({ reason: "exit", blame: true });
    expect(deathVerdict({ code: 0, signal: null }, false)).toEqual({ reason: "exit", blame: false });
  });

  it("the watchdog's own kill blames nobody, whatever the signal", () => {
    expect(deathVerdict({ code: null, signal: "SIGKILL" }, true)).toEqual({ reason: "watchdog", blame: false });
    expect(deathVerdict({ code: null, signal: "SIGABRT" }, true)).toEqual({ reason: "watchdog", blame: false });
  });
});
