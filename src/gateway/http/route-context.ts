/**
 * What the API routes need from the server: the registry, readiness, the current engine's limits and
 * capabilities, and the metric/log hooks. Built once by the server (one object for every route).
 */
import type { FastifyReply } from "fastify";
import type { Logger } from "pino";
import type { EngineCapabilities, GuideSpec } from "../../protocol/messages.js";
import type { AgentSettings } from "../models/agent-config.js";
import type { ChatMessage, ChatTemplate } from "../models/chat-template.js";
import { contextLengthExceeded, type KeelHttpError } from "./errors.js";
import type { ServedModelView } from "../models/model-set.js";
import type { ModelRequests } from "../requests/model-requests.js";
import type { ToolSpec } from "../tools.js";

/** Default bytes of stream output a client may leave unread before it is treated as gone (per stream). */
export const MAX_UNREAD_BYTES = 1024 * 1024;

export interface RouteContext {
  /** This model's request path (requests/model-requests.ts): where a generation is opened and its client's leaving reported. */
  requests: ModelRequests;
  /** Served model name. */
  modelName: string;
  /** When the server started (unix seconds), the `created` of the model object. */
  modelCreated: number;
  /** Every served model's name (for `/models` and the 404 `model_not_found` answer). */
  servedModels(): string[];
  /**
   * Every model's engine with its registry and supervisor (serving ones, then retired ones still finishing): what
   * per-model gauges read (`model_name` label).
   */
  models(): ServedModelView[];
  /** Chat template of the current engine, or null while no engine is ready. */
  template(): ChatTemplate | null;
  isReady(): boolean;
  /** Sequence capacity (tokens) of the current engine, or null while none is ready. */
  maxModelLen(): number | null;
  /** Vocabulary size of the current engine's model (0 while none is ready). */
  vocabSize(): number;
  /** What the current engine can do, or null while none is ready. */
  capabilities(): EngineCapabilities | null;
  /** The 503 to answer while not ready: loading, restarting after an engine fault, or shutting down. */
  unavailable(): KeelHttpError;
  /**
   * True when this rendered prompt, with this guide, was isolated as one that crashes the engine (answered without
   * the engine). The same messages without that guide are another request.
   */
  isKnownCulprit(prompt: string, guide?: GuideSpec): boolean;
  /** Sequences of the current engine (0 while none is ready). */
  maxNumSeqs(): number;
  /** Bytes of stream output a client may leave unread in the server's buffer before it is treated as gone. */
  maxUnreadBytes: number;
  /** Bound of the waiting queue; a request beyond it gets 429 at once. */
  maxQueuedRequests: number;
  /**
   * Tokenize text with the current engine's tokenizer (`/v3/tokenize`); rejects when no engine is ready or the
   * engine refuses.
   */
  tokenize(text: string, addSpecialTokens: boolean): Promise<number[]>;
  onRejected(reason: "queue_full" | "not_ready"): void;
  /** Tool/reasoning parsing and guidance for the current engine's model (`auto` resolved from its template). */
  agents(): AgentSettings;
  log: Logger;
}

/**
 * The current engine as a route needs it, or the 503 (with Retry-After) to answer while there is none ready: loading,
 * restarting or shutting down. Counted as a `not_ready` rejection.
 */
export function readyEngine(ctx: RouteContext, reply: FastifyReply): { template: ChatTemplate; capabilities: EngineCapabilities } {
  const template = ctx.template();
  const capabilities = ctx.capabilities();
  if (!ctx.isReady() || !template || !capabilities) {
    ctx.onRejected("not_ready");
    void reply.header("retry-after", "1");
    throw ctx.unavailable();
  }
  return { template, capabilities };
}

/**
 * Render chat messages into the prompt text with the model's template. Every message renders to at least one token,
 * so more messages than the context holds is refused before rendering (400 context_length_exceeded).
 */
export function renderMessages(ctx: RouteContext, template: ChatTemplate, messages: ChatMessage[], kwargs?: Record<string, unknown>, tools?: readonly ToolSpec[]): string {
  const capacity = ctx.maxModelLen();
  if (capacity !== null && messages.length >= capacity) throw contextLengthExceeded(capacity, messages.length);
  return template.render(messages, { addGenerationPrompt: true, ...(kwargs ? { kwargs } : {}), ...(tools ? { tools } : {}) });
}
