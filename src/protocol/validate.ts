/**
 * Validation of messages that cross the engine channel. A message that fails validation is answered with a
 * protocol error — or, for an `add` whose envelope is sound but whose sampling parameters are not, with a
 * `request_error` (`invalid_params`) for that id. It never throws past this module.
 */
import { z } from "zod";
import { PROTOCOL_VERSION, type GatewayMessage, type SamplingParams } from "./messages.js";

const tokenId = z.number().int().min(0).max(0x7fffffff);
const tokenIds = z.array(tokenId);

/** Largest GBNF text a guide may carry (bytes of UTF-8): a grammar for 200 tools is about 80 KB. */
export const MAX_GUIDE_GRAMMAR_BYTES = 4 * 1024 * 1024;
/** Root rule name the engine adds for a trigger matched inside a token (llama-adapter.ts); a guide may not use it. */
const RESERVED_RULE = "keel-prefixed-root";
/** A GBNF rule name (llama.cpp: letters, digits and '-'). */
const ruleName = z
  .string()
  .regex(/^[A-Za-z0-9-]+$/, "must be a GBNF rule name (letters, digits, '-')")
  .refine((r) => r !== RESERVED_RULE, `${RESERVED_RULE} is reserved`);
const then = z.enum(["free", "end"]);
const guidePhase = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("free") }).strict(),
  z.object({ kind: z.literal("reasoning") }).strict(),
  z.object({ kind: z.literal("rule"), rule: ruleName, then }).strict(),
]);
/** Shape of `params.guide` (docs/protocol.md "Guided generation"); whether the grammar compiles is not checked here. */
const guideSpec = z
  .object({
    grammar: z.string().min(1).refine((g) => Buffer.byteLength(g) <= MAX_GUIDE_GRAMMAR_BYTES, `must be at most ${MAX_GUIDE_GRAMMAR_BYTES} bytes`),
    start: guidePhase,
    reasoning: z.object({ open: z.string().min(1), close: z.string().min(1), after: guidePhase }).strict().optional(),
    triggers: z.array(z.object({ text: z.string().min(1), rule: ruleName, atStart: z.boolean().optional(), then: then.optional() }).strict()).optional(),
    specialTokens: z.array(z.string().min(1)).optional(),
  })
  .strict()
  .superRefine((g, ctx) => {
    // A reasoning phase without markers could never end.
    const usesReasoning = g.start.kind === "reasoning" || g.reasoning?.after.kind === "reasoning";
    if (usesReasoning && !g.reasoning) ctx.addIssue({ code: "custom", path: ["reasoning"], message: "a reasoning phase needs reasoning.open/close" });
    if (g.reasoning?.after.kind === "reasoning") ctx.addIssue({ code: "custom", path: ["reasoning", "after"], message: "must not be reasoning again" });
    if (new RegExp(`^\\s*${RESERVED_RULE}\\s*::=`, "m").test(g.grammar)) ctx.addIssue({ code: "custom", path: ["grammar"], message: `defines the reserved rule ${RESERVED_RULE}` });
  });

/** Ranges of every sampling parameter (docs/protocol.md §3.1). Vocabulary-dependent checks: {@link checkSamplingParams}. */
const samplingParams = z
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
  })
  .strict()
  .superRefine((p, ctx) => {
    if (p.minTokens !== undefined && p.maxTokens !== null && p.minTokens > p.maxTokens) {
      ctx.addIssue({ code: "custom", path: ["minTokens"], message: `minTokens (${p.minTokens}) must not exceed maxTokens (${p.maxTokens})` });
    }
    const biased = new Set<number>();
    for (const [token] of p.logitBias ?? []) {
      if (biased.has(token)) ctx.addIssue({ code: "custom", path: ["logitBias"], message: `token ${token} is biased twice` });
      biased.add(token);
    }
  });

/** An add's envelope; its params are checked separately so that bad params refuse only that request. */
const addEnvelope = z.object({
  v: z.number(),
  type: z.literal("add"),
  id: z.string().min(1).max(256),
  prompt: z.union([z.object({ text: z.string() }), z.object({ tokens: tokenIds.min(1) })]),
  params: z.record(z.string(), z.unknown()),
  generated: tokenIds.optional(),
});

const gatewayMessage = z.discriminatedUnion("type", [
  addEnvelope,
  z.object({ v: z.number(), type: z.literal("abort"), ids: z.array(z.string()) }),
  z.object({ v: z.number(), type: z.literal("ping"), nonce: z.number() }),
  z.object({ v: z.number(), type: z.literal("shutdown") }),
  z.object({ v: z.number(), type: z.literal("tokenize"), id: z.string().min(1).max(256), text: z.string(), addSpecialTokens: z.boolean() }),
]);

/** Outcome of {@link parseGatewayMessage}. */
export type ParsedGatewayMessage =
  | { ok: true; message: GatewayMessage }
  /** Not a message: answer with `protocol_error`. */
  | { ok: false; error: string }
  /** A sound `add` with unusable sampling parameters: answer with `request_error` `invalid_params` for `id`. */
  | { ok: false; error: string; refuse: { id: string; code: "invalid_params" } };

function describe(issues: readonly z.core.$ZodIssue[]): string {
  const first = issues[0];
  return `${first?.path.join(".") ?? ""} ${first?.message ?? ""}`.trim();
}

/** Parse a decoded frame as a gateway → engine message, or say why it is not one. */
export function parseGatewayMessage(raw: Record<string, unknown>): ParsedGatewayMessage {
  if (raw["v"] !== PROTOCOL_VERSION) {
    return { ok: false, error: `unsupported protocol version ${JSON.stringify(raw["v"])} (expected ${PROTOCOL_VERSION})` };
  }
  const result = gatewayMessage.safeParse(raw);
  if (!result.success) return { ok: false, error: `invalid ${String(raw["type"])} message: ${describe(result.error.issues)}` };
  if (result.data.type !== "add") return { ok: true, message: result.data as GatewayMessage };
  const params = samplingParams.safeParse(result.data.params);
  if (!params.success) {
    const first = params.error.issues[0];
    const where = ["params", ...(first?.path ?? []).map(String)].join(".");
    const error = `invalid sampling parameters: ${where} ${first?.message ?? ""}`.trim();
    return { ok: false, error, refuse: { id: result.data.id, code: "invalid_params" } };
  }
  return { ok: true, message: { ...result.data, params: params.data } as GatewayMessage };
}

/** What the engine serves, for the parameter checks that depend on it. */
export interface EngineParamLimits {
  vocabSize: number;
  /** Largest `logprobs` served; -1 = none. */
  maxTopLogprobs: number;
  /** Whether `guide` is applied (capabilities.grammars); absent = false. */
  grammars?: boolean;
}

/** Checks of range-valid params against the engine (token ids in the vocabulary, logprobs cap); null when fine. */
export function checkSamplingParams(p: SamplingParams, limits: EngineParamLimits): string | null {
  const outside = (ids: readonly number[]): number | undefined => ids.find((t) => t >= limits.vocabSize);
  const badBias = outside((p.logitBias ?? []).map(([t]) => t));
  if (badBias !== undefined) return `logitBias token ${badBias} is outside the vocabulary (${limits.vocabSize})`;
  const badStop = outside(p.stopTokenIds ?? []);
  if (badStop !== undefined) return `stopTokenIds token ${badStop} is outside the vocabulary (${limits.vocabSize})`;
  if (p.guide && !limits.grammars) return "this engine does not apply guides (capabilities.grammars is false)";
  if (p.logprobs != null && p.logprobs > limits.maxTopLogprobs) {
    return limits.maxTopLogprobs < 0
      ? "this engine does not serve log probabilities"
      : `logprobs ${p.logprobs} exceeds the engine's maximum of ${limits.maxTopLogprobs}`;
  }
  return null;
}
