/**
 * `POST …/completions`: OpenAI's (legacy) text completions. `prompt` is a string or an array of strings (one
 * choice per prompt, × `n`), `echo` prepends the prompt, integer `logprobs` gives the legacy
 * `{tokens, token_logprobs, top_logprobs, text_offset}` shape, `max_tokens` defaults to 16 as OpenAI's.
 * Refused with 400: `suffix` (no fill-in-the-middle), token-id prompts, `best_of` other than `n`, `echo` with
 * `logprobs` (prompt logprobs are not computed). Unary answers are `text_completion` objects; stream chunks are
 * `text_completion` objects too (as OpenAI sends them), then `data: [DONE]`. The output may be constrained (one of
 * `response_format`, `structured_outputs`, `guided_*`, `grammar`: structured-outputs.ts); unknown fields are a 400.
 */
import { randomUUID } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { describe, issueToError, report, stopSchema, tokenLimit, UINT32_MAX, type GenerationFields } from "./chat-request.js";
import { RANGES } from "./request-issues.js";
import { invalidValue, unsupportedField } from "../http/errors.js";
import { toErrorBody } from "../http/error-envelope.js";
import { generationOptions, runGeneration, type Encoder } from "../requests/generate.js";
import { checkModelName, readyEngine, type RouteContext } from "../http/route-context.js";
import { buildGuide } from "../guided/guide.js";
import { outputGuide } from "../models/guide-plan.js";
import type { ResponseFormat } from "../tools.js";
import { checkKnownFields, fieldsOf } from "./known-fields.js";
import { outputConstraint, structuredOutputFields } from "./structured-outputs.js";
import { responseFormatSchema } from "./tool-fields.js";
import { chunkBuilder, usageBody, withGuide } from "./chat.js";
import { completionLogprobs, TextOffsets } from "./logprobs.js";
import { checkCapabilities, checkMinTokens, checkSpeculation, extendedSampling, MAX_TOP_LOGPROBS, samplingFields, type ExtendedSampling } from "./sampling.js";

/** OpenAI's default completion budget for this endpoint. */
export const DEFAULT_COMPLETION_MAX_TOKENS = 16;
/** Most prompts in one request. */
export const MAX_PROMPTS = 16;

/** A validated completions request. */
export interface CompletionRequest extends GenerationFields {
  /** One or more prompt texts. */
  prompts: string[];
  /** Put the prompt before the completion in each choice's text. */
  echo: boolean;
  /** Completion token budget (default 16, as OpenAI's). */
  maxTokens: number;
  /** The output constraint (`response_format`, `structured_outputs`, `guided_*` or `grammar`); default text. */
  responseFormat: ResponseFormat;
}

const promptSchema = z.unknown().transform((v, ctx): string[] => {
  if (typeof v === "string") return [v];
  if (Array.isArray(v) && v.length > 0 && v.length <= MAX_PROMPTS && v.every((p) => typeof p === "string")) return [...(v as string[])];
  if (Array.isArray(v) && v.length > 0 && v.every((p) => typeof p === "number" || Array.isArray(p))) {
    report(ctx, "unsupported_field", "Token-id prompts are not supported; send the prompt as text.", [], v);
    return [];
  }
  if (v === undefined) report(ctx, "missing_field", "", [], v);
  else report(ctx, "invalid_value", `expected a string or an array of 1 to ${MAX_PROMPTS} strings, but got ${Array.isArray(v) ? `an array of ${v.length} items` : describe(v)}.`, [], v);
  return [];
});

const completionBodySchema = z.object({
  model: z.string().min(1),
  prompt: promptSchema,
  suffix: z
    .unknown()
    .optional()
    .superRefine((v, ctx) => {
      if (v !== undefined && v !== null && v !== "") report(ctx, "unsupported_field", "Fill-in-the-middle (suffix) is not available.", [], v);
    }),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  echo: z.boolean().nullish(),
  max_tokens: tokenLimit,
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().gt(0).max(1).nullish(),
  top_k: z
    .number()
    .int()
    .nullish()
    .superRefine((v, ctx) => {
      if (v != null && v < -1) report(ctx, "invalid_value", `${RANGES.top_k} (got ${v}).`, [], v);
    }),
  seed: z.number().min(0).max(UINT32_MAX).int().nullish(),
  stop: stopSchema,
  ignore_eos: z.boolean().nullish(),
  ...samplingFields,
  best_of: z.number().int().min(1).nullish(),
  logprobs: z.number().int().min(0).max(MAX_TOP_LOGPROBS).nullish(),
  response_format: responseFormatSchema,
  ...structuredOutputFields,
  // OpenAI's end-user label: checked, no effect on the output.
  user: z.string().nullish(),
});

/** Every top-level field `/completions` knows (any other is a 400 `unknown_field`). */
export const COMPLETION_FIELDS = fieldsOf(completionBodySchema);

/** Validate a completions body (400 naming the first offending field). */
export function parseCompletionRequest(body: unknown): CompletionRequest {
  checkKnownFields(body, COMPLETION_FIELDS);
  const parsed = completionBodySchema.safeParse(body, { reportInput: true });
  if (!parsed.success) throw issueToError(parsed.error.issues[0]!);
  const b = parsed.data;
  const stream = b.stream ?? false;
  if (b.stream_options != null && !stream) {
    throw invalidValue("stream_options", "Invalid value for 'stream_options': only allowed when 'stream' is true.");
  }
  const n = b.n ?? 1;
  if (b.best_of != null && b.best_of !== n) throw unsupportedField("best_of", "Only best_of equal to n is supported (every generated choice is returned).");
  if (b.echo && b.logprobs != null) throw unsupportedField("logprobs", "Log probabilities of the echoed prompt are not computed; use logprobs without echo.");
  const request: CompletionRequest = {
    model: b.model,
    prompts: b.prompt,
    stream,
    includeUsage: b.stream_options?.include_usage ?? false,
    echo: b.echo ?? false,
    maxTokens: b.max_tokens ?? DEFAULT_COMPLETION_MAX_TOKENS,
    temperature: b.temperature ?? 1,
    topP: b.top_p ?? 1,
    topK: b.top_k == null || b.top_k === 0 ? -1 : b.top_k, // 0 = all tokens, as vLLM and llama.cpp read it
    stop: b.stop,
    ignoreEos: b.ignore_eos ?? false,
    n,
    sampling: extendedSampling(b),
    includeStopStr: b.include_stop_str_in_output ?? false,
    logprobs: b.logprobs ?? null,
    responseFormat: outputConstraint(b),
  };
  checkMinTokens(request.sampling, request.maxTokens);
  if (b.seed != null) request.seed = b.seed;
  return request;
}

/** The completions encoder for one request. */
export function completionEncoder(body: CompletionRequest, id: string, model: string, created: number): Encoder {
  const wantLogprobs = body.logprobs !== null;
  const promptOf = (index: number): string => body.prompts[Math.floor(index / body.n)]!;
  /** Token offsets per choice in its streamed text (legacy text_offset; the echoed prompt counts). */
  const offsets = new Map<number, TextOffsets>();
  const chunk = chunkBuilder("text_completion", id, created, model, body.includeUsage);
  const choiceCount = body.n * body.prompts.length;
  return {
    stream(ev, w) {
      switch (ev.type) {
        case "started":
          if (body.echo) for (let i = 0; i < choiceCount; i++) w.data(chunk([{ index: i, text: promptOf(i), logprobs: null, finish_reason: null }]));
          return;
        case "delta": {
          let logprobs = null;
          if (wantLogprobs) {
            let at = offsets.get(ev.index);
            if (!at) offsets.set(ev.index, (at = new TextOffsets(body.echo ? promptOf(ev.index).length : 0)));
            logprobs = completionLogprobs(ev.logprobs, at);
          }
          w.data(chunk([{ index: ev.index, text: ev.content, logprobs, finish_reason: null }]));
          return;
        }
        case "choice_finished":
          w.data(chunk([{ index: ev.index, text: "", logprobs: null, finish_reason: ev.reason }]));
          return;
        case "finished":
          if (body.includeUsage) w.data(chunk([], { usage: usageBody(ev.usage) }));
          return;
      }
    },
    streamError(err, w) {
      w.data(toErrorBody(err));
    },
    unary(ev) {
      return {
        id,
        object: "text_completion",
        created,
        model,
        choices: ev.choices.map((c) => ({
          index: c.index,
          text: body.echo ? promptOf(c.index) + c.text : c.text,
          logprobs: wantLogprobs ? completionLogprobs(c.logprobs, new TextOffsets(0)) : null,
          finish_reason: c.reason,
        })),
        usage: usageBody(ev.usage),
      };
    },
  };
}

/** Handle one completions request. */
export async function handleCompletion(ctx: RouteContext, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  const body = parseCompletionRequest(req.body);
  checkModelName(ctx.model, body.model);
  const engine = readyEngine(ctx, reply);
  const caps = engine.capabilities;
  const refused = checkCapabilities(body.sampling, body.logprobs === null ? null : { param: "logprobs", n: body.logprobs }, caps, engine.vocabSize, engine.engineName);
  if (refused) throw refused;
  // A constraint the converter refuses, or one this engine cannot apply, is a 400 before the engine sees it.
  const guide = outputGuide(buildGuide, body.responseFormat, caps);
  const conflict = checkSpeculation(body.sampling, body.logprobs !== null, guide !== null);
  if (conflict) throw conflict;
  const id = `cmpl-${randomUUID().replaceAll("-", "")}`;
  runGeneration(
    ctx,
    req,
    reply,
    {
      id,
      prompts: body.prompts,
      ...withGuide(generationOptions(body, body.maxTokens), guide),
      promptField: "prompt",
    },
    completionEncoder(body, id, ctx.model.name, Math.floor(Date.now() / 1000)),
  );
}
