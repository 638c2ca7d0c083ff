/**
 * `POST /v3/chat/completions` (and its `/v3/v1`, `/v1` aliases): OpenAI chat completions, unary and streaming.
 *
 * Disconnects are detected from the response's `close` event in every phase (queued, prefill, decode), not from
 * a failed write (Ollama #11889): the handler cancels the request in the registry, which sends one abort; the
 * engine applies it at its next step boundary. Nothing is written after close.
 *
 * Streaming follows OpenAI: `chat.completion.chunk` events, a first chunk with the assistant role, a final chunk
 * with `finish_reason`, an optional usage chunk (`stream_options.include_usage`), then `data: [DONE]`. An error
 * after streaming began is a final `data: {"error":…}` event and the stream closes without `[DONE]`.
 * Headers are sent when the engine admits the request, so a refusal before that is a plain JSON 4xx.
 */
import { randomBytes, randomUUID } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { SamplingParams } from "../protocol/messages.js";
import type { ChatRequest } from "./chat-request.js";
import { parseChatRequest } from "./chat-request.js";
import type { ChatTemplate } from "./chat-template.js";
import { contextLengthExceeded, engineError, engineFault, modelNotFound, queueFull, toErrorBody, type KeelHttpError } from "./errors.js";
import type { FinishReason } from "./lifecycle.js";
import type { RequestRegistry, RequestSink, Usage } from "./registry.js";
import { StopMatcher } from "./stop-strings.js";
import type { Logger } from "pino";

/** Default bytes of stream output a client may leave unread before it is treated as gone (per stream). */
export const MAX_UNREAD_BYTES = 1024 * 1024;

/** What the chat route needs from the server. */
export interface ChatRouteContext {
  registry: RequestRegistry;
  /** Served model name. */
  modelName: string;
  /** Chat template of the current engine, or null while no engine is ready. */
  template(): ChatTemplate | null;
  isReady(): boolean;
  /** Sequence capacity (tokens) of the current engine, or null while none is ready. */
  maxModelLen(): number | null;
  /** The 503 to answer while not ready: loading, restarting after an engine fault, or shutting down. */
  unavailable(): KeelHttpError;
  /** True when this rendered prompt was isolated as one that crashes the engine (answered without the engine). */
  isKnownCulprit(prompt: string): boolean;
  /** Sequences of the current engine (0 while none is ready). */
  maxNumSeqs(): number;
  /** Bytes of stream output a client may leave unread in the server's buffer before it is treated as gone. */
  maxUnreadBytes: number;
  /** Bound of the waiting queue; a request beyond it gets 429 at once. */
  maxQueuedRequests: number;
  onRejected(reason: "queue_full" | "not_ready"): void;
  log: Logger;
  onDisconnect(phase: "queued" | "prefill" | "decode"): void;
}

/** OpenAI finish_reason for an engine finish reason that reaches a client. */
function openaiFinishReason(r: FinishReason): "stop" | "length" {
  return r === "length" ? "length" : "stop";
}

function usageBody(u: Usage): { prompt_tokens: number; completion_tokens: number; total_tokens: number } {
  return { prompt_tokens: u.promptTokens, completion_tokens: u.completionTokens, total_tokens: u.promptTokens + u.completionTokens };
}

/** Handle one chat completion request. */
export async function handleChat(ctx: ChatRouteContext, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  const body: ChatRequest = parseChatRequest(req.body);
  if (body.model !== ctx.modelName) throw modelNotFound(body.model);
  const template = ctx.template();
  if (!ctx.isReady() || !template) {
    ctx.onRejected("not_ready");
    void reply.header("retry-after", "1");
    throw ctx.unavailable();
  }
  // 429 at the door (TGI's router): the queue is bounded, so saturation answers at once instead of piling up.
  // Requests that the engine will admit into free sequences at its next step are not "waiting" for this bound.
  const { waiting, running } = ctx.registry.counts();
  const freeSequences = Math.max(0, ctx.maxNumSeqs() - running);
  if (waiting - freeSequences >= ctx.maxQueuedRequests) {
    ctx.onRejected("queue_full");
    void reply.header("retry-after", "1");
    throw queueFull();
  }
  // Every message renders to at least one token, so this many messages cannot fit; refuse before rendering.
  const capacity = ctx.maxModelLen();
  if (capacity !== null && body.messages.length >= capacity) {
    throw contextLengthExceeded(capacity, body.messages.length);
  }
  const prompt = template.render(body.messages, { addGenerationPrompt: true });
  // A prompt already isolated as an engine killer is refused here, so a client resending it cannot keep
  // restarting the engine (and pausing everyone else).
  if (ctx.isKnownCulprit(prompt)) {
    throw engineFault("This request crashed the engine before and was isolated; it is refused without running it.");
  }
  const params: SamplingParams = {
    maxTokens: body.maxTokens ?? null,
    temperature: body.temperature,
    topP: body.topP,
    topK: body.topK,
    seed: body.seed ?? randomBytes(4).readUInt32LE(0),
    ignoreEos: body.ignoreEos,
  };
  const id = `chatcmpl-${randomUUID().replaceAll("-", "")}`;
  const created = Math.floor(Date.now() / 1000);
  const log = ctx.log.child({ requestId: id });
  const res = reply.raw;
  const stop = new StopMatcher(body.stop);
  /** Set once the response is complete or the client left; nothing is written after that. */
  let closed = false;
  let completionTokens = 0;
  let promptTokens = 0;

  reply.hijack();

  // --- output helpers (streaming) ---
  let headersSent = false;
  const chunk = (delta: Record<string, unknown>, finishReason: string | null): string =>
    `data: ${JSON.stringify({
      id,
      object: "chat.completion.chunk",
      created,
      model: ctx.modelName,
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
      ...(body.includeUsage ? { usage: null } : {}),
    })}\n\n`;
  const write = (s: string): void => {
    if (closed || res.destroyed) return;
    res.write(s);
    // Backpressure bound: a client that stops reading may hold at most maxUnreadBytes of unsent stream; past that
    // it is treated as gone (its request is aborted, its socket closed) instead of buffering without limit.
    if (res.writableLength > ctx.maxUnreadBytes) {
      log.warn({ event: "slow_client", unreadBytes: res.writableLength }, "client is not reading its stream; aborting it");
      res.destroy();
    }
  };
  const startStream = (): void => {
    if (headersSent || closed) return;
    headersSent = true;
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", "x-request-id": id });
    write(chunk({ role: "assistant", content: "" }, null));
  };
  const sendJson = (status: number, payload: unknown): void => {
    if (closed || res.destroyed) return;
    closed = true;
    const text = JSON.stringify(payload);
    res.writeHead(status, {
      "content-type": "application/json; charset=utf-8",
      "content-length": Buffer.byteLength(text),
      "x-request-id": id,
      ...(status === 503 ? { "retry-after": "1" } : {}),
    });
    res.end(text);
  };

  // --- unary accumulation ---
  let content = "";

  const finishResponse = (reason: "stop" | "length", usage: Usage): void => {
    if (closed) return;
    const tail = stop.flush();
    if (body.stream) {
      startStream();
      if (tail) write(chunk({ content: tail }, null));
      write(chunk({}, reason));
      if (body.includeUsage) {
        write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: ctx.modelName, choices: [], usage: usageBody(usage) })}\n\n`);
      }
      write("data: [DONE]\n\n");
      closed = true;
      res.end();
    } else {
      content += tail;
      sendJson(200, {
        id,
        object: "chat.completion",
        created,
        model: ctx.modelName,
        choices: [{ index: 0, message: { role: "assistant", content }, logprobs: null, finish_reason: reason }],
        usage: usageBody(usage),
      });
    }
    log.info({ event: "finished", finishReason: reason, promptTokens: usage.promptTokens, completionTokens: usage.completionTokens }, "request finished");
  };

  const failResponse = (err: KeelHttpError): void => {
    if (closed) return;
    if (headersSent) {
      write(`data: ${JSON.stringify(toErrorBody(err))}\n\n`);
      closed = true;
      res.end();
    } else {
      sendJson(err.status, toErrorBody(err));
    }
  };

  const sink: RequestSink = {
    onAdmitted() {
      if (body.stream) startStream();
    },
    onOutput(tokens, text) {
      completionTokens += tokens.length;
      if (closed) return;
      const r = stop.push(text);
      if (r.emit) {
        if (body.stream) {
          startStream();
          write(chunk({ content: r.emit }, null));
        } else content += r.emit;
      }
      if (r.stopped) {
        // A stop string ends the response now; the engine releases the sequence at its next step.
        ctx.registry.cancel(id, "stop_string");
        finishResponse("stop", { promptTokens, completionTokens });
      }
    },
    onFinish(reason, usage, error) {
      if (reason === "error") {
        failResponse(error?.httpError ?? engineError(error?.message));
        return;
      }
      finishResponse(openaiFinishReason(reason), usage);
    },
  };

  // Disconnect detection: the response closed before we ended it.
  const onClose = (): void => {
    if (closed) return;
    closed = true;
    const phase = ctx.registry.phase(id);
    if (phase) {
      ctx.onDisconnect(phase);
      log.info({ event: "client_disconnect", phase }, "client disconnected");
      ctx.registry.cancel(id, "client_disconnect");
    }
  };
  res.once("close", onClose);

  const accepted = ctx.registry.submit(id, { text: prompt }, params, {
    ...sink,
    onAdmitted() {
      promptTokens = ctx.registry.promptLength(id);
      sink.onAdmitted();
    },
  });
  if (!accepted) {
    ctx.onRejected("not_ready");
    failResponse(ctx.unavailable());
    return;
  }
  log.info({ event: "accepted", stream: body.stream, maxTokens: params.maxTokens, temperature: params.temperature }, "request accepted");
  // The client may have left while we parsed and rendered, before the close listener existed.
  if (res.destroyed || res.socket === null || res.socket.destroyed) onClose();
}
