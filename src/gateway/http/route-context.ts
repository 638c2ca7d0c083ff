/**
 * What an API route needs from the server: the model it serves (name, request path, parsing settings, queue bound,
 * the isolated-prompt memory), its ready engine or none, the rejection metric and the log. One per served model
 * (models/model-set.ts).
 */
import type { FastifyReply } from "fastify";
import type { Logger } from "pino";
import type { EngineCapabilities, GuideSpec } from "../../protocol/messages.js";
import type { AgentSettings } from "../models/agent-config.js";
import type { ChatMessage, ChatTemplate } from "../models/chat-template.js";
import { contextLengthExceeded, modelNotFound, type KeelHttpError } from "./errors.js";
import type { ModelRequests } from "../requests/model-requests.js";
import type { ToolSpec } from "../tools.js";

/** Default bytes of stream output a client may leave unread before it is treated as gone (per stream). */
export const MAX_UNREAD_BYTES = 1024 * 1024;

/** The model a route serves, as far as it does not depend on its engine. */
export interface RouteModel {
  /** Served model name. */
  name: string;
  /** Other names requests may use for this model (the catalogue name given to `--model_path`); not listed in `/models`. */
  aliases: readonly string[];
  /** When the server started (unix seconds), the `created` of the model object. */
  created: number;
  /** Every served model's name (for `/models` and the 404 `model_not_found` answer). */
  served(): string[];
  /** Tool/reasoning parsing and guidance for the model (`auto` resolved from its current template). */
  agents(): AgentSettings;
  /** This model's request path (requests/model-requests.ts): where a generation is opened and its client's leaving reported. */
  requests: ModelRequests;
  /** Bound of the waiting queue; a request beyond it gets 429 at once. */
  maxQueuedRequests: number;
  /** Bytes of stream output a client may leave unread in the server's buffer before it is treated as gone. */
  maxUnreadBytes: number;
  /**
   * True when this rendered prompt, with this guide, was isolated as one that crashes the engine (recovery's memory:
   * answered without the engine). The same messages without that guide are another request.
   */
  isKnownCulprit(prompt: string, guide?: GuideSpec): boolean;
}

/** The model's engine while it is ready: its template, capabilities and limits, and its tokenizer. */
export interface ReadyEngine {
  template: ChatTemplate;
  capabilities: EngineCapabilities;
  /** Sequence capacity (tokens). */
  maxModelLen: number;
  /** Sequences. */
  maxNumSeqs: number;
  /** Vocabulary size of the model. */
  vocabSize: number;
  /** The engine's name and version as its `ready` said (e.g. `openvino-genai@2026.4.1`), for 400s naming it. */
  engineName?: string;
  /** Tokenize text (`/v3/tokenize`); rejects when the engine goes away or refuses. */
  tokenize(text: string, addSpecialTokens: boolean): Promise<number[]>;
}

/**
 * The phases of a streamed request's time to first token (keel_request_ttft_phase_seconds): `accept` = HTTP request
 * received → its add written to the engine; `engine` = add written → the step message with the first token read
 * back; `deliver` = that message read → the first token written to the client.
 */
export type TtftPhase = "accept" | "engine" | "deliver";

/** What a route needs: the model, its ready engine or none, the rejection metric, and the log. */
export interface RouteContext {
  model: RouteModel;
  /** The ready engine, or null while there is none (loading, restarting after a fault, or shutting down). */
  engine(): ReadyEngine | null;
  /** The 503 to answer while there is no ready engine. */
  unavailable(): KeelHttpError;
  /** A request refused at the door, counted by reason. */
  rejected(reason: "queue_full" | "not_ready"): void;
  /** One request's time in one phase of its first token (seconds). */
  ttftPhase(phase: TtftPhase, seconds: number): void;
  log: Logger;
}

/**
 * The ready engine as a route needs it, or the 503 (with Retry-After) to answer while there is none: loading,
 * restarting or shutting down. Counted as a `not_ready` rejection.
 */
export function readyEngine(ctx: RouteContext, reply: FastifyReply): ReadyEngine {
  const engine = ctx.engine();
  if (!engine) {
    ctx.rejected("not_ready");
    void reply.header("retry-after", "1");
    throw ctx.unavailable();
  }
  return engine;
}

/**
 * Render chat messages into the prompt text with the model's template. Every message renders to at least one token,
 * so more messages than the context holds is refused before rendering (400 context_length_exceeded).
 */
export function renderMessages(engine: ReadyEngine, messages: ChatMessage[], kwargs?: Record<string, unknown>, tools?: readonly ToolSpec[]): string {
  const capacity = engine.maxModelLen;
  if (messages.length >= capacity) throw contextLengthExceeded(capacity, messages.length, undefined, messages.length);
  return engine.template.render(messages, { addGenerationPrompt: true, ...(kwargs ? { kwargs } : {}), ...(tools ? { tools } : {}) });
}

/**
 * The one model-name check of every route that takes `model`: `requested` must be this route's model, by its served
 * name or an alias; else 404 `model_not_found` naming the served models.
 */
export function checkModelName(model: RouteModel, requested: string): void {
  if (requested !== model.name && !model.aliases.includes(requested)) throw modelNotFound(requested, model.served());
}

/** Whether `name` is the served name or an alias of `model` (the router's lookup: models/model-set.ts). */
export function answersTo(model: Pick<RouteModel, "name" | "aliases">, name: string): boolean {
  return name === model.name || model.aliases.includes(name);
}
