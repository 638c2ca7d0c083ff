/**
 * Wire-level conformance suite for engine executables (docs/protocol.md). It drives ANY engine over the protocol
 * — spawned as `command ...args <config JSON>` with the channel on fd 3 — and checks what a gateway relies on:
 * ready, request lifecycle, aborts at each phase, pings during steps, malformed input, refusals, step accounting,
 * exact continuation, log probabilities, guided generation (or its refusal without `grammars`) and shutdown. The llama.cpp engine runs it in
 * llama-engine.conformance.test.ts; another engine (e.g. the OpenVINO worker) adds its own one-line test file.
 *
 * Requirements on the engine under test (its `start()` arranges them): it serves text prompts; its limits leave
 * room for a prompt of several hundred tokens (maxModelLen ≥ 1024) and make a prefill of that prompt span many
 * steps (maxNumBatchedTokens ≤ 16) with at least 4 sequences; runs are reproducible (no prefix-reuse numerics).
 */
import type { EngineConfig } from "../../src/protocol/engine-config.js";
import { spawn, type ChildProcess } from "node:child_process";
import type { Duplex } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseEngineMessage } from "../../src/protocol/engine-validator.js";
import { encodeFrame, FrameDecoder } from "../../src/protocol/framing.js";
import {
  ENGINE_ERROR_CODES,
  PROTOCOL_VERSION,
  type AddMessage,
  type EngineCapabilities,
  type EngineMessage,
  type ReadyMessage,
  type RequestErrorMessage,
  type RequestOutput,
  type GuideSpec,
  type SamplingParams,
  type StepMessage,
  type TokenizedMessage,
} from "../../src/protocol/messages.js";

/** How to start the engine under test. */
export interface EngineLaunch {
  command: string;
  args: string[];
  /** The engine's start configuration, passed as its last argument (JSON): the engine-neutral one every engine takes. */
  config: EngineConfig;
  env?: Record<string, string>;
}

/**
 * The start configuration every engine runs the suite with (the header's requirements): 4 sequences, an 8-token step
 * budget so a prefill spans many steps, 2048 tokens per sequence, prefix caching off so reruns are bit-identical.
 */
export function conformanceConfig(modelPath: string): EngineConfig {
  return { mode: "serve", modelPath, maxNumSeqs: 4, maxNumBatchedTokens: 8, maxModelLen: 2048, prefixCaching: false, threads: 1, flashAttention: false, kvCacheType: "f16", device: "cpu" };
}

/**
 * Longest wait for any single expected message (the whole suite stays well under 30 s on a tiny model); a deadline,
 * not a sleep: a loaded 2-core host took the OpenVINO worker past 10 s to ready (its load plus the warm-up step).
 */
const WAIT_MS = 30_000;

/** A running engine process and everything it said. */
export class EngineProcess {
  /** Every message received, in order. */
  readonly messages: EngineMessage[] = [];
  /** stderr lines, for failure diagnostics. */
  readonly stderr: string[] = [];
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private readonly channel: Duplex;
  private waiters: (() => void)[] = [];

  constructor(readonly child: ChildProcess) {
    this.channel = child.stdio[3] as Duplex;
    const decoder = new FrameDecoder();
    this.channel.on("data", (chunk: Buffer) => {
      for (const frame of decoder.push(chunk)) {
        if ("error" in frame) throw new Error(`engine sent a bad frame: ${frame.error}`);
        // Every frame must validate against the protocol's schema, as the gateway checks it (a failure is a fault).
        const parsed = parseEngineMessage(frame.message);
        if (!parsed.ok) throw new Error(`engine sent a message the protocol schema rejects: ${parsed.error}`);
        this.messages.push(parsed.message);
      }
      for (const w of this.waiters.splice(0)) w();
    });
    this.channel.on("error", () => undefined);
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (d: string) => this.stderr.push(...d.split("\n").filter(Boolean)));
    this.exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  }

  send(msg: Record<string, unknown>): void {
    this.channel.write(encodeFrame(msg));
  }

  writeRaw(bytes: Buffer): void {
    this.channel.write(bytes);
  }

  /** Resolve with the first message from index `from` on that matches; reject after WAIT_MS. */
  async waitFor<T extends EngineMessage>(match: (m: EngineMessage) => m is T, from?: number): Promise<T>;
  async waitFor(match: (m: EngineMessage) => boolean, from?: number): Promise<EngineMessage>;
  async waitFor(match: (m: EngineMessage) => boolean, from = 0): Promise<EngineMessage> {
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
      const found = this.messages.slice(from).find(match);
      if (found) return found;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no matching engine message within ${WAIT_MS} ms; stderr tail: ${this.stderr.slice(-5).join(" | ")}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Every output entry for `id`, in order. */
  outputsOf(id: string): RequestOutput[] {
    return this.steps().flatMap((m) => m.outputs.filter((o) => o.id === id));
  }

  steps(): StepMessage[] {
    return this.messages.filter((m): m is StepMessage => m.type === "step");
  }

  /** Wait for the step carrying `id`'s finish; returns all of `id`'s outputs. */
  async finished(id: string): Promise<RequestOutput[]> {
    await this.waitFor((m) => m.type === "step" && m.outputs.some((o) => o.id === id && o.finish !== undefined));
    return this.outputsOf(id);
  }

  /** Wait for a request_error for `id`. */
  refused(id: string): Promise<RequestErrorMessage> {
    return this.waitFor((m): m is RequestErrorMessage => m.type === "request_error" && m.id === id);
  }
}

export function launch(l: EngineLaunch): EngineProcess {
  const child = spawn(l.command, [...l.args, JSON.stringify(l.config)], {
    stdio: ["ignore", "pipe", "pipe", "pipe"],
    env: { ...process.env, ...l.env },
  });
  child.stdout?.resume();
  return new EngineProcess(child);
}

export const isReady = (m: EngineMessage): m is ReadyMessage => m.type === "ready";

/** Define the conformance suite for one engine. */
export function defineEngineConformance(name: string, start: () => EngineLaunch | Promise<EngineLaunch>): void {
  describe(`engine conformance: ${name}`, () => {
    let engine: EngineProcess;
    let ready: ReadyMessage;
    let seq = 0;
    /** A fresh request id (never reused, as the gateway guarantees). */
    const nextId = (tag: string): string => `${tag}-${++seq}`;
    const params = (p: Partial<SamplingParams> = {}): SamplingParams => ({ maxTokens: 8, temperature: 0, topP: 1, topK: -1, seed: 1, ignoreEos: true, ...p });
    const add = (id: string, text: string, p: Partial<SamplingParams> = {}, extra: Partial<AddMessage> = {}): void =>
      engine.send({ v: PROTOCOL_VERSION, type: "add", id, prompt: { text }, params: params(p), ...extra });
    const abort = (...ids: string[]): void => engine.send({ v: PROTOCOL_VERSION, type: "abort", ids });
    const tokensOf = (outs: RequestOutput[]): number[] => outs.flatMap((o) => o.tokens);
    /** A prompt whose prefill spans many steps at the engine's token budget. */
    const longPrompt = "the river in the morning carries queues and servers past the old mill; ".repeat(40);
    /** Start `n` requests that decode until aborted (ignore_eos, no max_tokens). */
    const startBusy = async (n: number): Promise<string[]> => {
      const ids = Array.from({ length: n }, () => nextId("busy"));
      for (const id of ids) add(id, "busy work", { maxTokens: null });
      for (const id of ids) await engine.waitFor((m) => m.type === "step" && m.outputs.some((o) => o.id === id && o.tokens.length > 0));
      return ids;
    };

    beforeAll(async () => {
      engine = launch(await start());
      ready = await engine.waitFor(isReady);
    });

    afterAll(async () => {
      if (engine.child.exitCode === null && engine.child.signalCode === null) engine.child.kill("SIGKILL");
      await engine.exited;
    });

    it("ready: protocol version, pid, model metadata, limits and capabilities", () => {
      expect(ready.v).toBe(PROTOCOL_VERSION);
      // The engine's own pid (a launcher such as a shell or `uv run` may sit between us and it).
      expect(Number.isInteger(ready.pid) && ready.pid > 0).toBe(true);
      expect(typeof ready.engine).toBe("string");
      expect(ready.model.vocabSize).toBeGreaterThan(0);
      expect(ready.model.trainContextSize).toBeGreaterThan(0);
      expect(typeof ready.model.architecture).toBe("string");
      const l = ready.limits;
      for (const v of [l.maxNumSeqs, l.maxNumBatchedTokens, l.maxModelLen]) expect(Number.isInteger(v) && v > 0).toBe(true);
      expect(l.maxNumBatchedTokens).toBeGreaterThanOrEqual(l.maxNumSeqs);
      // The suite's own requirements on the configuration it was given (see the header).
      expect(l.maxNumSeqs).toBeGreaterThanOrEqual(4);
      expect(l.maxNumBatchedTokens).toBeLessThanOrEqual(16);
      expect(l.maxModelLen).toBeGreaterThanOrEqual(1024);
      const c = ready.capabilities;
      for (const k of ["exactSeededResume", "extendedSampling", "grammars", "sharedPrefill"] as const) expect(typeof c[k]).toBe("boolean");
      expect(Number.isInteger(c.maxTopLogprobs) && c.maxTopLogprobs >= -1).toBe(true);
    });

    it("add → admitted once → tokens → exactly one finish, with consistent counts", async () => {
      const id = nextId("plain");
      add(id, "hello there", { maxTokens: 6 });
      const outs = await engine.finished(id);
      const admitted = outs.filter((o) => o.admitted);
      expect(admitted).toHaveLength(1);
      expect(admitted[0]!.admitted!.promptTokens.length).toBeGreaterThan(0);
      expect(outs.indexOf(admitted[0]!)).toBe(0);
      const fins = outs.filter((o) => o.finish);
      expect(fins).toHaveLength(1);
      expect(outs.at(-1)!.finish).toBeDefined();
      expect(fins[0]!.finish!.reason).toBe("length");
      expect(tokensOf(outs)).toHaveLength(6);
      expect(fins[0]!.finish!.completionTokens).toBe(6);
      expect(fins[0]!.finish!.promptTokens).toBe(admitted[0]!.admitted!.promptTokens.length);
      for (const o of outs) expect(o.tokens.every((t) => Number.isInteger(t) && t >= 0 && t < ready.model.vocabSize)).toBe(true);
    });

    it("abort while queued: finish abort without admission", async () => {
      const busy = await startBusy(ready.limits.maxNumSeqs);
      const id = nextId("queued");
      const from = engine.messages.length;
      add(id, "waiting for a slot");
      // The next step message after the add shows it waiting (every slot is taken by a decoding request).
      await engine.waitFor((m) => m.type === "step" && m.stats.waiting >= 1, from);
      abort(id);
      const outs = await engine.finished(id);
      expect(outs).toHaveLength(1);
      expect(outs[0]!.admitted).toBeUndefined();
      expect(outs[0]!.finish!.reason).toBe("abort");
      expect(outs[0]!.finish!.completionTokens).toBe(0);
      abort(...busy);
      for (const b of busy) expect((await engine.finished(b)).at(-1)!.finish!.reason).toBe("abort");
    });

    it("abort during prefill: finish abort, no token generated", async () => {
      // Decoding neighbours shrink the prefill's share of the step budget, so the prefill spans many steps.
      const busy = await startBusy(ready.limits.maxNumSeqs - 1);
      const id = nextId("prefill");
      add(id, longPrompt, { maxTokens: 4 });
      const admitted = await engine.waitFor((m) => m.type === "step" && m.outputs.some((o) => o.id === id && o.admitted !== undefined));
      const promptLength = (admitted as StepMessage).outputs.find((o) => o.id === id)!.admitted!.promptTokens.length;
      expect(promptLength).toBeGreaterThan(20 * ready.limits.maxNumBatchedTokens);
      abort(id);
      const outs = await engine.finished(id);
      expect(outs.at(-1)!.finish!.reason).toBe("abort");
      expect(tokensOf(outs)).toEqual([]);
      expect(outs.at(-1)!.finish!.completionTokens).toBe(0);
      abort(...busy);
      for (const b of busy) await engine.finished(b);
    });

    it("abort during decode: finish abort after some tokens; ping answered while steps run", async () => {
      const [id] = await startBusy(1);
      const nonce = 4242;
      const from = engine.messages.length;
      engine.send({ v: PROTOCOL_VERSION, type: "ping", nonce });
      const pong = await engine.waitFor((m) => m.type === "pong" && m.nonce === nonce, from);
      expect(pong.type === "pong" && Number.isInteger(pong.step)).toBe(true);
      // Steps went on around the pong: the request decodes more tokens after it, and it finishes only on our abort.
      const pongAt = engine.messages.indexOf(pong);
      await engine.waitFor((m) => m.type === "step" && m.outputs.some((o) => o.id === id && o.tokens.length > 0), pongAt + 1);
      expect(engine.outputsOf(id!).some((o) => o.finish)).toBe(false);
      abort(id!);
      const outs = await engine.finished(id!);
      const fin = outs.at(-1)!.finish!;
      expect(fin.reason).toBe("abort");
      expect(fin.completionTokens).toBeGreaterThan(0);
      expect(fin.completionTokens).toBe(tokensOf(outs).length);
    });

    it("malformed frames get protocol_error and the engine keeps serving", async () => {
      const from = engine.messages.length;
      const junk = Buffer.from("{not json", "utf8");
      const frame = Buffer.alloc(4 + junk.length);
      frame.writeUInt32BE(junk.length, 0);
      junk.copy(frame, 4);
      engine.writeRaw(frame);
      engine.send({ v: PROTOCOL_VERSION, type: "reboot" });
      engine.send({ v: PROTOCOL_VERSION + 1, type: "ping", nonce: 1 });
      engine.send({ v: PROTOCOL_VERSION, type: "add", prompt: { text: "no id" }, params: params() });
      const id = nextId("after-junk");
      add(id, "still here", { maxTokens: 2 });
      expect((await engine.finished(id)).at(-1)!.finish!.reason).toBe("length");
      // One protocol_error per bad frame (they precede the good add, and frames are handled in order).
      const errors = engine.messages.slice(from).filter((m) => m.type === "protocol_error");
      expect(errors).toHaveLength(4);
      for (const m of errors) expect(m.type === "protocol_error" && m.message.length > 0).toBe(true);
    });

    it("invalid params → request_error invalid_params for that id only", async () => {
      const bad: [string, Partial<SamplingParams>][] = [
        ["temperature", { temperature: 5 }],
        ["repetition", { repetitionPenalty: 0 }],
        ["minTokens", { maxTokens: 2, minTokens: 3 }],
        ["bias", { logitBias: [[ready.model.vocabSize, 1]] }],
      ];
      const ids = bad.map(([tag]) => nextId(`bad-${tag}`));
      const ok = nextId("valid-neighbour");
      bad.forEach(([, p], i) => add(ids[i]!, "x", p));
      add(ok, "a valid request after the bad ones", { maxTokens: 2 });
      for (const id of ids) {
        const err = await engine.refused(id);
        expect(err.code).toBe("invalid_params");
        expect(ENGINE_ERROR_CODES).toContain(err.code);
        expect(err.message.length).toBeGreaterThan(0);
      }
      // A bad value names its field (the client is told its own); an engine that applies no logit bias at all refuses
      // the field without naming it (the gateway refuses that before, from the capabilities).
      const appliesBias = ready.capabilities.extendedSampling || (ready.capabilities.samplingFields ?? []).includes("logitBias");
      expect((await engine.refused(ids[3]!)).param).toBe(appliesBias ? "logitBias" : undefined);
      expect((await engine.finished(ok)).at(-1)!.finish!.reason).toBe("length");
      for (const id of ids) expect(engine.outputsOf(id)).toEqual([]);
    });

    it("a duplicate live id is refused; the live request is unaffected; an unknown-id abort is ignored", async () => {
      const [id] = await startBusy(1);
      add(id!, "same id again", { maxTokens: 2 });
      const err = await engine.refused(id!);
      expect(err.code).toBe("duplicate_id");
      abort("never-seen-id");
      abort(id!);
      const outs = await engine.finished(id!);
      expect(outs.filter((o) => o.finish)).toHaveLength(1);
      expect(outs.at(-1)!.finish!.reason).toBe("abort");
      // A later request completes: the unknown abort was applied (at a boundary) and ignored.
      const later = nextId("later");
      add(later, "after the unknown abort", { maxTokens: 2 });
      await engine.finished(later);
      expect(engine.messages.some((m) => JSON.stringify(m).includes("never-seen-id"))).toBe(false);
    });

    it("a continuation add with `generated` continues token-identically (greedy, and seeded with penalties)", async () => {
      const penalised = ready.capabilities.extendedSampling ? { presencePenalty: 1.5, frequencyPenalty: 0.5 } : {};
      const variants: Partial<SamplingParams>[] = [
        { temperature: 0 },
        { temperature: 0, ...penalised },
        ready.capabilities.extendedSampling
          ? { temperature: 0.9, topP: 0.95, seed: 77, presencePenalty: 1.5, frequencyPenalty: 1, repetitionPenalty: 1.5, minP: 0.02, logitBias: [[1, 2]], minTokens: 4 }
          : { temperature: 0.9, topP: 0.95, seed: 77 },
      ];
      for (const v of variants) {
        const p = { ...v, maxTokens: 14, ignoreEos: false };
        const full = nextId("full");
        add(full, "once upon a time", p);
        const whole = tokensOf(await engine.finished(full));
        expect(whole.length).toBeGreaterThan(5);
        for (const cut of [1, 3, 7]) {
          const cont = nextId("cont");
          add(cont, "once upon a time", p, { generated: whole.slice(0, cut) });
          const outs = await engine.finished(cont);
          const rest = tokensOf(outs);
          // Plain greedy resume is exact on every engine (the lifecycle's resume relies on it); sampled and penalised
          // continuations only where the engine says so.
          const plainGreedy = Object.keys(v).length === 1 && v.temperature === 0;
          if (ready.capabilities.exactSeededResume || plainGreedy) expect(rest, `resumed after ${cut} (${JSON.stringify(v)})`).toEqual(whole.slice(cut));
          expect(outs.at(-1)!.finish!.completionTokens).toBe(rest.length);
          expect(outs[0]!.admitted!.promptTokens.length + cut).toBe(outs.at(-1)!.finish!.promptTokens);
        }
      }
    });

    it("stop_token_ids, min_tokens and logit_bias act on what is sampled (or are refused when the engine does not apply them)", async () => {
      /** Whether the engine applies an extended sampling field: all with extendedSampling, else those it lists. */
      const applies = (f: NonNullable<EngineCapabilities["samplingFields"]>[number]): boolean =>
        ready.capabilities.extendedSampling || (ready.capabilities.samplingFields ?? []).includes(f);
      const probe = nextId("probe");
      add(probe, "stop here", { maxTokens: 4 });
      const probeTokens = tokensOf(await engine.finished(probe));
      const first = probeTokens[0];
      const stop = nextId("stop-token");
      add(stop, "stop here", { maxTokens: 4, stopTokenIds: [first!] });
      if (!applies("stopTokenIds")) {
        expect((await engine.refused(stop)).code).toBe("invalid_params");
      } else {
        // The greedy first token is a stop token: the request ends at once, reporting the token without text.
        const stopped = await engine.finished(stop);
        expect(tokensOf(stopped)).toEqual([first]);
        expect(stopped.map((o) => o.text).join("")).toBe("");
        expect(stopped.at(-1)!.finish).toMatchObject({ reason: "stop", completionTokens: 1 });
      }
      // With min_tokens 3 the stop token is banned for the first three tokens.
      const gated = nextId("min-tokens");
      add(gated, "stop here", { maxTokens: 6, stopTokenIds: [first!], minTokens: 3 });
      if (!applies("stopTokenIds") || !applies("minTokens")) {
        expect((await engine.refused(gated)).code).toBe("invalid_params");
      } else {
        const gatedTokens = tokensOf(await engine.finished(gated));
        expect(gatedTokens.length).toBeGreaterThanOrEqual(3);
        expect(gatedTokens.slice(0, 3)).not.toContain(first);
      }
      // logit_bias -100 bans the greedy choice; +100 forces another token.
      const banned = nextId("bias-ban");
      add(banned, "stop here", { maxTokens: 4, logitBias: [[first!, -100]] });
      if (!applies("logitBias")) {
        expect((await engine.refused(banned)).code).toBe("invalid_params");
        return;
      }
      expect(tokensOf(await engine.finished(banned))).not.toContain(first);
      const forced = nextId("bias-force");
      // A token the model generated under ignore_eos (so not an end-of-generation token, which stays banned).
      const other = probeTokens.find((t) => t !== first) ?? (first! + 1) % ready.model.vocabSize;
      add(forced, "stop here", { maxTokens: 3, logitBias: [[other, 100]] });
      expect(tokensOf(await engine.finished(forced))).toEqual([other, other, other]);
    });

    it("logprobs: one entry per token, the sampled token first for greedy, top sorted, probabilities ≤ 1; over the cap refused", async () => {
      const max = ready.capabilities.maxTopLogprobs;
      const id = nextId("logprobs");
      const n = Math.min(3, Math.max(0, max));
      // No bias of any kind (ignore_eos would ban EOG): greedy then takes the raw distribution's top token.
      add(id, "how likely is this", { maxTokens: 5, logprobs: n, ignoreEos: false });
      if (max < 0) {
        expect((await engine.refused(id)).code).toBe("invalid_params");
        return;
      }
      const outs = await engine.finished(id);
      for (const o of outs) {
        expect((o.logprobs ?? []).length).toBe(o.tokens.length);
        o.tokens.forEach((tok, i) => {
          const lp = o.logprobs![i]!;
          expect(lp.token).toBe(tok);
          expect(lp.logprob).toBeLessThanOrEqual(0);
          expect(lp.top).toHaveLength(n);
          for (let k = 1; k < lp.top.length; k++) expect(lp.top[k]!.logprob).toBeLessThanOrEqual(lp.top[k - 1]!.logprob);
          if (n > 0) {
            expect(lp.top[0]!.token).toBe(tok);
            expect(lp.top[0]!.logprob).toBe(lp.logprob);
          }
          expect(lp.top.reduce((a, t) => a + Math.exp(t.logprob), 0)).toBeLessThanOrEqual(1 + 1e-5);
        });
      }
      const over = nextId("logprobs-over");
      add(over, "too many", { logprobs: max + 1 });
      expect((await engine.refused(over)).code).toBe("invalid_params");
    });

    // ---- Guided generation (params.guide; capabilities.grammars). Random weights: only the grammar decides shape.
    const guideRule = (grammar: string, then: "free" | "end" = "end", rule = "root"): GuideSpec => ({ grammar, start: { kind: "rule", rule, then } });
    const textOf = (outs: RequestOutput[]): string => outs.map((o) => o.text).join("");
    const droppedOf = (outs: RequestOutput[]): string[] => outs.flatMap((o) => (o.guideDropped !== undefined ? [o.guideDropped] : []));
    /** The one token id of `text` in the engine's vocabulary (asked over the wire). */
    const oneToken = async (text: string): Promise<number> => {
      const id = nextId("tok");
      const from = engine.messages.length;
      engine.send({ v: PROTOCOL_VERSION, type: "tokenize", id, text, addSpecialTokens: false });
      const answer = await engine.waitFor((m): m is TokenizedMessage => m.type === "tokenized" && m.id === id, from);
      expect("tokens" in answer && answer.tokens).toHaveLength(1);
      return (answer as { tokens: number[] }).tokens[0]!;
    };
    /** The token ids of `text` in the engine's vocabulary (asked over the wire). */
    const tokensOfText = async (text: string): Promise<number[]> => {
      const id = nextId("toks");
      const from = engine.messages.length;
      engine.send({ v: PROTOCOL_VERSION, type: "tokenize", id, text, addSpecialTokens: false });
      const answer = await engine.waitFor((m): m is TokenizedMessage => m.type === "tokenized" && m.id === id, from);
      return (answer as { tokens: number[] }).tokens;
    };
    /** Whether the engine applies `logitBias` (the OpenVINO engine does not: its guide tests reach a phase by resuming). */
    const appliesLogitBias = (): boolean => ready.capabilities.extendedSampling || (ready.capabilities.samplingFields ?? []).includes("logitBias");
    /** Without grammars an engine must refuse a guide (invalid_params) instead of ignoring it. */
    const refusedWithoutGrammars = async (id: string): Promise<boolean> => {
      if (ready.capabilities.grammars) return false;
      expect((await engine.refused(id)).code).toBe("invalid_params");
      return true;
    };

    it('guide: a start rule `"yes" | "no"` then:end yields exactly one of them and finishes "stop", greedy or sampled', async () => {
      const ids = [0, 1.5, 1.5].map((temperature, i) => {
        const id = nextId("guide-yes-no");
        add(id, "answer me", { guide: guideRule('root ::= "yes" | "no"'), temperature, seed: 20 + i, maxTokens: 8, ignoreEos: false });
        return id;
      });
      for (const id of ids) {
        if (await refusedWithoutGrammars(id)) continue;
        const outs = await engine.finished(id);
        expect(["yes", "no"]).toContain(textOf(outs));
        expect(outs.at(-1)!.finish!.reason).toBe("stop");
        expect(droppedOf(outs)).toEqual([]);
      }
    });

    it("guide: a start rule then:free yields the rule's text first, then free text", async () => {
      const id = nextId("guide-free");
      add(id, "greet", { guide: guideRule('root ::= "hello"', "free"), maxTokens: 10, ignoreEos: false });
      if (await refusedWithoutGrammars(id)) return;
      const text = textOf(await engine.finished(id));
      expect(text.startsWith("hello")).toBe(true);
      expect(text.length).toBeGreaterThan(5);
    });

    it("guide: a json-ish rule constrains sampled output to /^\\{[a-z]{1,8}\\}$/", async () => {
      const ids = [1, 2, 3].map((seed) => {
        const id = nextId("guide-json");
        add(id, "json please", { guide: guideRule('root ::= "{" [a-z]{1,8} "}"'), temperature: 1.2, seed, maxTokens: 16, ignoreEos: false });
        return id;
      });
      for (const id of ids) {
        if (await refusedWithoutGrammars(id)) continue;
        const outs = await engine.finished(id);
        expect(textOf(outs)).toMatch(/^\{[a-z]{1,8}\}$/);
        expect(outs.at(-1)!.finish!.reason).toBe("stop");
      }
    });

    it("guide: reasoning — a gate rule opens reasoning, its close text starts reasoning.after", async () => {
      const id = nextId("guide-reasoning");
      const guide: GuideSpec = {
        grammar: 'gate ::= "<think>"\nans ::= "yes" | "no"',
        start: { kind: "rule", rule: "gate", then: "end" },
        reasoning: { open: "<think>", close: ">", after: { kind: "rule", rule: "ans", then: "end" } },
      };
      if (appliesLogitBias()) {
        // Reasoning is unconstrained: a +100 bias on ">" makes greedy close it at once, whatever the weights.
        const close = await oneToken(">");
        add(id, "think first", { guide, logitBias: [[close, 100]], maxTokens: 16, ignoreEos: false });
      } else {
        // Without logit bias: resumed right after the close marker, the answer rule applies.
        add(id, "think first", { guide, maxTokens: 16, ignoreEos: false }, { generated: await tokensOfText("<think>>") });
      }
      if (await refusedWithoutGrammars(id)) return;
      const outs = await engine.finished(id);
      expect(textOf(outs)).toMatch(appliesLogitBias() ? /^<think>>(yes|no)$/ : /^(yes|no)$/);
      expect(outs.at(-1)!.finish!.reason).toBe("stop");
    });

    it("guide: a resumed guided request (`generated`) continues exactly", async () => {
      const guide: GuideSpec = { grammar: 'root ::= "hi"\nobj ::= "{" [a-z]{1,4} "}"', start: { kind: "rule", rule: "root", then: "free" }, triggers: [{ text: "{", rule: "obj" }] };
      if (!appliesLogitBias()) {
        // Resumed inside the triggered rule (after the start rule ended and "{" fired): the rule continues there.
        const cont = nextId("guide-cont");
        add(cont, "resume me", { guide, temperature: 1.3, seed: 9, maxTokens: 16, ignoreEos: false }, { generated: await tokensOfText("hi{ab") });
        if (await refusedWithoutGrammars(cont)) return;
        expect("hi{ab" + textOf(await engine.finished(cont))).toMatch(/^hi\{[a-z]{2,4}\}/);
        return;
      }
      const brace = await oneToken("{");
      const p: Partial<SamplingParams> = { guide, temperature: 1.3, seed: 9, maxTokens: 16, logitBias: [[brace, 100]] };
      const full = nextId("guide-full");
      add(full, "resume me", p);
      if (await refusedWithoutGrammars(full)) return;
      const outs = await engine.finished(full);
      const whole = tokensOf(outs);
      // Phases changed many times: the rule, then free "{" (forced) triggering the object rule, again and again.
      expect(textOf(outs)).toMatch(/^hi(\{[a-z]{1,4}\}){2,}/);
      for (const cut of [1, 3, 8]) {
        const cont = nextId("guide-cont");
        add(cont, "resume me", p, { generated: whole.slice(0, cut) });
        const rest = tokensOf(await engine.finished(cont));
        if (ready.capabilities.exactSeededResume) expect(rest, `resumed after ${cut}`).toEqual(whole.slice(cut));
      }
    });

    it("guide: a grammar that does not compile is refused (invalid_params), never run unconstrained", async () => {
      const id = nextId("guide-bad-grammar");
      add(id, "anything", { guide: guideRule("root ::= [a-"), maxTokens: 5 });
      expect((await engine.refused(id)).code).toBe("invalid_params");
    });

    it("guide: ping answered while guided requests decode", async () => {
      const ids = [nextId("guide-busy"), nextId("guide-busy")];
      for (const id of ids) add(id, "busy and guided", { guide: guideRule("root ::= [a-z ]*"), maxTokens: null, temperature: 1, seed: 4, ignoreEos: false });
      if (await refusedWithoutGrammars(ids[0]!)) return;
      for (const id of ids) await engine.waitFor((m) => m.type === "step" && m.outputs.some((o) => o.id === id && o.tokens.length > 0));
      const from = engine.messages.length;
      engine.send({ v: PROTOCOL_VERSION, type: "ping", nonce: 777 });
      const pong = await engine.waitFor((m) => m.type === "pong" && m.nonce === 777, from);
      await engine.waitFor((m) => m.type === "step" && m.outputs.some((o) => o.id === ids[0] && o.tokens.length > 0), engine.messages.indexOf(pong) + 1);
      abort(...ids);
      for (const id of ids) {
        const outs = await engine.finished(id);
        expect(outs.at(-1)!.finish!.reason).toBe("abort");
        expect(textOf(outs)).toMatch(/^[a-z ]*$/);
      }
    });

    it("guide: an invalid guide shape → request_error invalid_params", async () => {
      const bad: unknown[] = [
        { grammar: "", start: { kind: "free" } },
        { grammar: "root ::= [a-z]", start: { kind: "rule", rule: "not a name", then: "end" } },
        { grammar: "root ::= [a-z]", start: { kind: "free" }, triggers: [{ text: "", rule: "root" }] },
        { grammar: "root ::= [a-z]", start: { kind: "rule", rule: "root" } },
      ];
      const ids = bad.map(() => nextId("guide-invalid"));
      bad.forEach((guide, i) => engine.send({ v: PROTOCOL_VERSION, type: "add", id: ids[i], prompt: { text: "x" }, params: { ...params(), guide } }));
      const ok = nextId("guide-valid-after");
      add(ok, "a valid request after the bad guides", { maxTokens: 2 });
      for (const id of ids) expect((await engine.refused(id)).code).toBe("invalid_params");
      expect((await engine.finished(ok)).at(-1)!.finish!.reason).toBe("length");
    });

    it("step accounting: one step message per step, counter monotonic, one entry per id per step, nothing after a finish", () => {
      const steps = engine.steps();
      expect(steps.length).toBeGreaterThan(10);
      let prev = 0;
      for (const m of steps) {
        // A step that decoded increments the counter; one that only applied aborts repeats it.
        expect(m.step).toBe(m.batchTokens > 0 ? prev + 1 : prev);
        prev = m.step;
        const ids = m.outputs.map((o) => o.id);
        expect(new Set(ids).size).toBe(ids.length);
      }
      const finishedAt = new Map<string, number>();
      steps.forEach((m, i) => {
        for (const o of m.outputs) {
          expect(finishedAt.has(o.id), `${o.id} mentioned after its finish`).toBe(false);
          if (o.finish) finishedAt.set(o.id, i);
        }
      });
      // A refused add never appears in a step (a duplicate_id refusal names a live id: that one does).
      const refused = engine.messages.filter((m): m is RequestErrorMessage => m.type === "request_error" && m.code !== "duplicate_id");
      expect(refused.length).toBeGreaterThan(0);
      for (const r of refused) expect(engine.outputsOf(r.id)).toEqual([]);
    });

    it("shutdown → the engine exits with status 0", async () => {
      engine.send({ v: PROTOCOL_VERSION, type: "shutdown" });
      const exit = await Promise.race([engine.exited, new Promise<null>((r) => setTimeout(() => r(null), WAIT_MS))]);
      expect(exit).toEqual({ code: 0, signal: null });
    });
  });
}
