/**
 * Engine step messages for the gateway's unit tests (output processor, request records): a step with the given outputs
 * and quiet stats, numbered in order, and one request's output with defaults for what a test leaves out.
 */
import { PROTOCOL_VERSION, type RequestOutput, type StepMessage } from "../../src/protocol/messages.js";

/** Step number of the last message built (the engine's counter only rises). */
let stepNo = 0;

/** A step message carrying `outputs`, the next step number, one batch token and idle stats. */
export const step = (...outputs: RequestOutput[]): StepMessage => ({
  v: PROTOCOL_VERSION,
  type: "step",
  step: ++stepNo,
  batchTokens: 1,
  outputs,
  stats: { waiting: 0, running: 0, activeSequences: 0, cachedSequences: 0, prefixCacheHitTokens: 0 },
});

/** One request's output: no tokens and no text unless `o` says otherwise. */
export const out = (id: string, o: Partial<RequestOutput> = {}): RequestOutput => ({ id, tokens: [], text: "", ...o });

/** The number of the last step built (a table's "current engine step"). */
export const currentStep = (): number => stepNo;
