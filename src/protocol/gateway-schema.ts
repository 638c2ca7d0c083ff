/**
 * The schema of gateway → engine messages (docs/protocol.md §3), the one source of their validation: the llama.cpp
 * engine parses with these zod schemas (validate.ts), and the Python worker interprets their generated JSON Schema
 * (protocol.schema.json, json-schema.ts). The TypeScript types of messages.ts are checked against them at compile
 * time (the `Same` assertions at the end).
 */
import { z } from "zod";
import { RESERVED_RULE, withChecks } from "./checks.js";
import type { GuideSpec, SamplingParams, AbortMessage, PingMessage, ShutdownMessage, TokenizeMessage, AddMessage } from "./messages.js";
import type { Same } from "./same.js";

export const tokenId = z.number().int().min(0).max(0x7fffffff);
export const tokenIds = z.array(tokenId);

/** A GBNF rule name (llama.cpp: letters, digits and '-'), other than the engine's reserved root rule. */
const ruleName = z.string().regex(new RegExp(`^(?!${RESERVED_RULE}$)[A-Za-z0-9-]+$`), `must be a GBNF rule name (letters, digits, '-'), not the reserved ${RESERVED_RULE}`);
const then = z.enum(["free", "end"]);
const guidePhase = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("free") }).strict(),
  z.object({ kind: z.literal("reasoning") }).strict(),
  z.object({ kind: z.literal("rule"), rule: ruleName, then }).strict(),
]);

/** Shape of `params.guide` (docs/protocol.md "Guided generation"); whether the grammar compiles is not checked here. */
const guideSpec = withChecks(
  z
    .object({
      grammar: z.string().min(1),
      start: guidePhase,
      reasoning: z.object({ open: z.string().min(1), close: z.string().min(1), after: guidePhase }).strict().optional(),
      triggers: z.array(z.object({ text: z.string().min(1), rule: ruleName, atStart: z.boolean().optional(), then: then.optional() }).strict()).optional(),
      specialTokens: z.array(z.string().min(1)).optional(),
    })
    .strict(),
  ["grammarSize", "reservedRuleUndefined", "reasoningHasMarkers", "reasoningEnds"],
);

/** Ranges of every sampling parameter (docs/protocol.md §3.1). Vocabulary-dependent checks: validate.ts `checkSamplingParams`. */
export const samplingParams = withChecks(
  z
    .object({
      maxTokens: z.number().int().min(1).nullable(),
      temperature: z.number().min(0).max(2),
      topP: z.number().gt(0).max(1),
      topK: z.number().int().min(-1),
      seed: z.number().int().min(0).max(0xffffffff),
      ignoreEos: z.boolean(),
      presencePenalty: z.number().min(-2).max(2).optional(),
      frequencyPenalty: z.number().min(-2).max(2).optional(),
      repetitionPenalty: z.number().gt(0).max(100).optional(),
      minP: z.number().min(0).max(1).optional(),
      logitBias: z.array(z.tuple([tokenId, z.number().min(-100).max(100)])).optional(),
      minTokens: z.number().int().min(0).optional(),
      stopTokenIds: tokenIds.optional(),
      logprobs: z.number().int().min(0).nullable().optional(),
      guide: guideSpec.optional(),
      speculation: z.object({ numAssistantTokens: z.number().int().min(0).max(32), maxNgramSize: z.number().int().min(1).max(16) }).strict().optional(),
    })
    .strict(),
  ["minTokensWithinMax", "logitBiasUnique"],
);

/** An add's envelope; its params are checked separately (with {@link samplingParams}) so that bad params refuse only that request. */
const addEnvelope = z.object({
  v: z.number(),
  type: z.literal("add"),
  id: z.string().min(1).max(256),
  prompt: z.union([z.object({ text: z.string() }), z.object({ tokens: tokenIds.min(1) })]),
  params: z.record(z.string(), z.unknown()),
  generated: tokenIds.optional(),
});
const abortMessage = z.object({ v: z.number(), type: z.literal("abort"), ids: z.array(z.string()) });
const pingMessage = z.object({ v: z.number(), type: z.literal("ping"), nonce: z.number() });
const shutdownMessage = z.object({ v: z.number(), type: z.literal("shutdown") });
const tokenizeMessage = z.object({ v: z.number(), type: z.literal("tokenize"), id: z.string().min(1).max(256), text: z.string(), addSpecialTokens: z.boolean() });

/** Every gateway → engine message, an add's params only as an object (see {@link addEnvelope}). */
export const gatewayMessage = z.discriminatedUnion("type", [addEnvelope, abortMessage, pingMessage, shutdownMessage, tokenizeMessage]);

// The declared types are exactly what the schemas accept.
export const typesMatchSchemas: Same<z.infer<typeof samplingParams>, SamplingParams> &
  Same<z.infer<typeof guideSpec>, GuideSpec> &
  Same<Omit<z.infer<typeof addEnvelope>, "params"> & { params: SamplingParams }, AddMessage> &
  Same<z.infer<typeof abortMessage>, AbortMessage> &
  Same<z.infer<typeof pingMessage>, PingMessage> &
  Same<z.infer<typeof shutdownMessage>, ShutdownMessage> &
  Same<z.infer<typeof tokenizeMessage>, TokenizeMessage> = true;
