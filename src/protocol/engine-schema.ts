/**
 * The schema of engine → gateway messages (docs/protocol.md §4), the one source of their validation: the gateway
 * checks every engine frame against it (engine-validator.ts compiles its generated JSON Schema), whichever engine
 * sent it. The TypeScript types of messages.ts are checked against it at compile time (the `Same` assertion at the
 * end). It bounds what the gateway relies on (types, integers, ranges) and no more: an engine may add fields (they
 * are ignored), and an error code outside the catalogue is not a protocol fault (see {@link errorCode}).
 */
import { z } from "zod";
import { tokenId, tokenIds } from "./gateway-schema.js";
import type { EngineErrorCode, EngineMessage } from "./messages.js";
import type { Same } from "./same.js";

const count = z.number().int().min(0);
const positive = z.number().int().min(1);
/** A duration or another non-negative measure (not necessarily whole). */
const nonNegative = z.number().min(0);

/**
 * An error code: validated as a non-empty string although the type is the closed catalogue, because the gateway
 * maps a code it does not know to engine_error itself (http/engine-errors.ts `engineErrorToHttp`): an engine that invents
 * one fails that request, not the protocol.
 */
const errorCode = z.string().min(1) as unknown as z.ZodType<EngineErrorCode>;

const modelMetadata = z.object({
  path: z.string(),
  name: z.string().nullable(),
  architecture: z.string(),
  trainContextSize: count,
  vocabSize: positive,
  chatTemplate: z.string().nullable(),
  kvElementsPerToken: z.number().min(0).nullable(),
  bosToken: z.string(),
  eosToken: z.string(),
});
const samplingField = z.enum(["presencePenalty", "frequencyPenalty", "repetitionPenalty", "minP", "logitBias", "minTokens", "stopTokenIds"]);
const capabilities = z.object({
  exactSeededResume: z.boolean(),
  maxTopLogprobs: z.number().int().min(-1),
  extendedSampling: z.boolean(),
  grammars: z.boolean(),
  sharedPrefill: z.boolean(),
  promptLookup: z.boolean().optional(),
  samplingFields: z.array(samplingField).optional(),
});
const readyMessage = z.object({
  v: z.number(),
  type: z.literal("ready"),
  pid: positive,
  model: modelMetadata,
  limits: z.object({ maxNumSeqs: positive, maxNumBatchedTokens: positive, maxModelLen: positive, kvPoolTokens: count.optional() }),
  engine: z.string(),
  capabilities,
  backend: z.object({ gpu: z.union([z.string(), z.literal(false)]), devices: z.array(z.string()), addon: z.enum(["keel", "node-llama-cpp"]).optional() }).optional(),
  loadMs: nonNegative.optional(),
  warmupMs: nonNegative.optional(),
});
const loadingMessage = z.object({ v: z.number(), type: z.literal("loading"), progress: z.number().min(0).max(1) });
const pongMessage = z.object({ v: z.number(), type: z.literal("pong"), nonce: z.number(), step: count });

const tokenLogprob = z.object({ token: tokenId, logprob: z.number(), bytes: z.array(z.number().int().min(0).max(255)).optional() });
const requestOutput = z.object({
  id: z.string(),
  admitted: z.object({ promptTokens: tokenIds, cachedTokens: count, queueMs: nonNegative.optional() }).optional(),
  tokens: tokenIds,
  logprobs: z.array(tokenLogprob.extend({ top: z.array(tokenLogprob) })).optional(),
  text: z.string(),
  textEnds: z.array(count).optional(),
  guideDropped: z.string().optional(),
  finish: z
    .object({
      reason: z.enum(["stop", "length", "abort", "error"]),
      promptTokens: count,
      completionTokens: count,
      error: z.object({ code: errorCode, message: z.string() }).optional(),
      stepsAfterAbort: count.optional(),
    })
    .optional(),
});
const stepMessage = z.object({
  v: z.number(),
  type: z.literal("step"),
  step: count,
  batchTokens: count,
  outputs: z.array(requestOutput),
  stats: z.object({
    waiting: count,
    running: count,
    activeSequences: count,
    cachedSequences: count,
    prefixCacheHitTokens: count,
    kvTokensInUse: count.optional(),
    draftTokens: count.optional(),
    acceptedDraftTokens: count.optional(),
    preemptions: count.optional(),
    linearAttentionBlocks: z.object({ inUse: count, total: count }).optional(),
    phaseUs: z.object({ decode: nonNegative, sample: nonNegative, step: nonNegative }).optional(),
  }),
});
const requestErrorMessage = z.object({ v: z.number(), type: z.literal("request_error"), id: z.string(), code: errorCode, message: z.string(), param: z.string().optional() });
const protocolErrorMessage = z.object({ v: z.number(), type: z.literal("protocol_error"), message: z.string() });
const fatalMessage = z.object({ v: z.number(), type: z.literal("fatal"), message: z.string() });
const tokenized = { v: z.number(), type: z.literal("tokenized"), id: z.string() };
const tokenizedMessage = z.union([z.object({ ...tokenized, tokens: tokenIds }), z.object({ ...tokenized, error: z.string() })]);

/** Every engine → gateway message, by its `type`. */
export const engineMessages = {
  loading: loadingMessage,
  tokenized: tokenizedMessage,
  ready: readyMessage,
  pong: pongMessage,
  step: stepMessage,
  request_error: requestErrorMessage,
  protocol_error: protocolErrorMessage,
  fatal: fatalMessage,
} satisfies { [K in EngineMessage["type"]]: z.ZodType };

/** Any engine → gateway message (zod; the gateway itself uses the compiled validator, engine-validator.ts). */
export const engineMessage = z.union(Object.values(engineMessages));

// The declared types are exactly what the schemas accept, message by message.
type Declared<K extends EngineMessage["type"]> = Extract<EngineMessage, { type: K }>;
export const typesMatchSchemas: { [K in keyof typeof engineMessages]: Same<z.infer<(typeof engineMessages)[K]>, Declared<K>> } = {
  loading: true,
  tokenized: true,
  ready: true,
  pong: true,
  step: true,
  request_error: true,
  protocol_error: true,
  fatal: true,
};
