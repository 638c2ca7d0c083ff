/**
 * The one generation pipeline every generating route (chat, completions, responses) runs after validating its
 * body: admission (readiness, the queue bound counting every choice, the isolated-prompt memory, engine
 * capabilities), one engine request per choice under a {@link GenerationSession} opened in the model's request
 * path, and an {@link Encoder} that turns the session's events into the API's wire shape through the one
 * {@link ResponseWriter}.
 *
 * Hops of one request: route (api/*.ts: parse) → runGeneration (admit, open) → the model's request path
 * (model-requests.ts) → table.submit → engine → output processor (table + session) → this request's events →
 * encoder → writer; then the step's aborts. Nothing here decides an abort: a client that left is reported as data.
 */
import { randomInt } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { SamplingParams } from "../../protocol/messages.js";
import { childSeed } from "../api/sampling.js";
import { contextLengthFor, engineFault, invalidValue, queueFull, type KeelHttpError } from "../http/errors.js";
import { toErrorBody } from "../http/error-envelope.js";
import type { GenerationFields } from "../api/chat-request.js";
import type { RouteContext } from "../http/route-context.js";
import { GenerationSession } from "./session/session.js";
import type { SessionEvent } from "./session/events.js";
import { ResponseWriter } from "../http/sse.js";
import { receivedAt } from "../http/received-at.js";
import type { OutputParser } from "../parsers/types.js";

/** A validated generation request, in the protocol's terms. */
export interface GenerationPlan {
  /** Response id (`chatcmpl-…`, `cmpl-…`, `resp_…`); children are `<id>-<i>` when n > 1. */
  id: string;
  /** Rendered prompt texts (one for chat and responses; completions accepts several → `n` choices each). */
  prompts: readonly string[];
  /** Choices per prompt. */
  n: number;
  stream: boolean;
  /** Sampling parameters; `seed` absent = random per request. */
  params: Omit<SamplingParams, "seed"> & { seed?: number };
  stop: readonly string[];
  includeStopStr: boolean;
  /** Per-choice output parser (chat with reasoning / tool parsing); absent = the text is the content. */
  parser?: () => OutputParser;
  /** The request field that holds the prompt when it is not `messages`: a too-long prompt's 400 names it. */
  promptField?: "prompt" | "input";
}

/** The part of a plan that chat and completions build alike from their shared request fields. */
export function generationOptions(body: GenerationFields, maxTokens: number | null): Pick<GenerationPlan, "n" | "stream" | "params" | "stop" | "includeStopStr"> {
  return {
    n: body.n,
    stream: body.stream,
    params: {
      maxTokens,
      temperature: body.temperature,
      topP: body.topP,
      topK: body.topK,
      ignoreEos: body.ignoreEos,
      ...(body.seed !== undefined ? { seed: body.seed } : {}),
      ...body.sampling,
      ...(body.logprobs !== null ? { logprobs: body.logprobs } : {}),
    },
    stop: body.stop,
    includeStopStr: body.includeStopStr,
  };
}

/** Turns session events into one API's wire shape. */
export interface Encoder {
  /** Streaming: write what `ev` means to the stream (headers are already sent). */
  stream(ev: Exclude<SessionEvent, { type: "failed" }>, w: ResponseWriter): void;
  /** Streaming: the request failed after the stream began; write the final error event(s). */
  streamError(err: KeelHttpError, w: ResponseWriter): void;
  /** Whether `data: [DONE]` follows the error event (Responses API, as OVMS) or the stream just ends (chat). */
  doneAfterError?: boolean;
  /** Whether a finished stream ends with `data: [DONE]` (OpenAI, OVMS; the default) or just ends (Anthropic). */
  doneAtEnd?: boolean;
  /** The JSON body of an error answered before streaming began; absent = the OpenAI envelope. */
  errorBody?(err: KeelHttpError): unknown;
  /** Unary: the JSON body for the finished request. */
  unary(ev: Extract<SessionEvent, { type: "finished" }>): unknown;
}

/** Child ids of a request: the id itself for one choice, `<id>-<i>` for several (i = choice index). */
export function childIds(id: string, choices: number): string[] {
  return choices === 1 ? [id] : Array.from({ length: choices }, (_, i) => `${id}-${i}`);
}

/**
 * Refuse at the door what cannot run now: not ready (503), the queue bound (429, counting all `n` choices;
 * requests the engine will admit into free sequences at its next step are not "waiting"), an isolated prompt.
 */
export function admissionError(ctx: RouteContext, plan: Pick<GenerationPlan, "n" | "prompts"> & Partial<Pick<GenerationPlan, "params">>): KeelHttpError | null {
  const engine = ctx.engine();
  if (!engine) {
    ctx.rejected("not_ready");
    return ctx.unavailable();
  }
  const { maxQueuedRequests } = ctx.model;
  const { waiting, running } = ctx.model.requests.counts();
  const freeSequences = Math.max(0, engine.maxNumSeqs - running);
  const choices = plan.n * plan.prompts.length;
  // More choices than the server can ever hold at once (every sequence plus the whole queue) is a 400, not a 429
  // that a retry could never get past.
  if (choices > engine.maxNumSeqs + maxQueuedRequests) {
    return invalidValue(
      "n",
      `Invalid value for 'n': this request needs ${choices} sequences (n × prompts), more than the server can hold at once (${engine.maxNumSeqs} sequences + ${maxQueuedRequests} queued).`,
    );
  }
  if (waiting + choices - freeSequences > maxQueuedRequests) {
    ctx.rejected("queue_full");
    return queueFull();
  }
  // A prompt already isolated as an engine killer is refused here, so a client resending it cannot keep
  // restarting the engine (and pausing everyone else).
  if (plan.prompts.some((p) => ctx.model.isKnownCulprit(p, plan.params?.guide))) {
    return engineFault("This request crashed the engine before and was isolated; it is refused without running it.");
  }
  return null;
}

/** Run one validated generation request to its end. The reply is hijacked: the writer owns the response. */
export function runGeneration(ctx: RouteContext, req: FastifyRequest, reply: FastifyReply, plan: GenerationPlan, encoder: Encoder): void {
  const refused = admissionError(ctx, plan);
  if (refused) {
    if (refused.status === 503 || refused.status === 429) void reply.header("retry-after", "1");
    throw refused;
  }
  const log = ctx.log.child({ requestId: plan.id });
  // Choice index = prompt index × n + i (OpenAI's order for a prompt list with n > 1).
  const ids = childIds(plan.id, plan.n * plan.prompts.length);
  const promptOf = ids.map((_, c) => Math.floor(c / plan.n));
  // randomInt draws from Node's cached entropy pool (randomBytes(4) was a getrandom call per request: ~0.1 ms here).
  const seed = plan.params.seed ?? randomInt(0, 0x1_0000_0000);
  const session = new GenerationSession({
    childIds: ids,
    promptOf,
    stop: plan.stop,
    includeStopStr: plan.includeStopStr,
    logprobs: plan.params.logprobs != null,
    ...(plan.params.minTokens ? { minTokens: plan.params.minTokens } : {}),
    ...(plan.parser ? { parser: plan.parser } : {}),
  });
  reply.hijack();
  const socket = req.raw.socket;
  const writer = new ResponseWriter(reply.raw, {
    requestId: plan.id,
    maxUnreadBytes: ctx.model.maxUnreadBytes,
    log,
    // The request's socket, not the response's: a pipelined response has no socket until the one before it ends.
    isSocketGone: () => req.raw.destroyed || socket === null || socket.destroyed,
    socket,
  });

  const emit = (ev: SessionEvent): void => {
    if (ev.type === "failed") {
      const error = plan.promptField ? contextLengthFor(ev.error, plan.promptField) : ev.error;
      if (writer.streaming) {
        encoder.streamError(error, writer);
        writer.endStream(encoder.doneAfterError ?? false);
      } else writer.json(error.status, encoder.errorBody ? encoder.errorBody(error) : toErrorBody(error));
      return;
    }
    if (plan.stream) {
      if (ev.type === "started") writer.startStream();
      encoder.stream(ev, writer);
      if (ev.type === "finished") writer.endStream(encoder.doneAtEnd ?? true);
    } else if (ev.type === "finished") {
      writer.json(200, encoder.unary(ev));
    }
  };

  // 1. Open the request: one engine request per choice. The model's request path hands this writer the request's
  //    events after each step, then applies the step's aborts.
  const children = ids.map((id, c) => ({ id, prompt: { text: plan.prompts[promptOf[c]!]! }, params: { ...plan.params, seed: childSeed(seed, c % plan.n) } }));
  const unavailable = (): KeelHttpError => {
    // The engine went away between the readiness check and now: the siblings already submitted are released.
    ctx.rejected("not_ready");
    return ctx.unavailable();
  };
  // The first token's timeline (keel_request_ttft_phase_seconds): the receive time, the add's write, and the first
  // delivery that carries output (a delta), read against the step message it came in.
  const submittedAt = performance.now();
  const received = receivedAt(req.raw, submittedAt);
  let firstDelivered = false;
  const deliver = (events: readonly SessionEvent[]): void => {
    writer.batch(() => events.forEach(emit));
    if (firstDelivered || !plan.stream || !events.some((ev) => ev.type === "delta")) return;
    firstDelivered = true;
    const readAt = ctx.model.requests.stepReadAt;
    ctx.ttftPhase("accept", (submittedAt - received) / 1000);
    ctx.ttftPhase("engine", Math.max(0, readAt - submittedAt) / 1000);
    ctx.ttftPhase("deliver", Math.max(0, performance.now() - readAt) / 1000);
  };
  // The request's lifecycle lines are DEBUG (accepted, then each child's queued, prefill, first token, end); its one
  // INFO line is the terminal record the output processor makes when it forgets the request (request-record.ts).
  log.debug({ event: "accepted", stream: plan.stream, n: plan.n, maxTokens: plan.params.maxTokens, temperature: plan.params.temperature, guided: plan.params.guide !== undefined, parsed: plan.parser !== undefined }, "request accepted");
  if (!ctx.model.requests.open(plan.id, session, children, deliver, unavailable, req.routeOptions.url ?? req.url)) return;

  // 2. The client leaving is an input of the request path: it releases every child still in the engine (vLLM
  //    #14326). The disconnect is counted once they are all released, in the furthest phase they had reached.
  writer.onGone(() => ctx.model.requests.clientGone(plan.id));
}
