/**
 * `POST /v3/tokenize` (and `/v3/v1/tokenize`, `/v1/tokenize`), OVMS's shape: body `{model, text}` with `text` a
 * string or an array of strings, optional `add_special_tokens` (default true) and `max_length` (truncates);
 * answer `{"tokens": [...]}` (an array of arrays for an array of texts). Tokenization is the engine's (protocol
 * `tokenize`), so the ids are exactly what a prompt would be. Padding (`pad_to_max_length`, `padding_side`) is
 * refused: Keel has no pad token to fill with.
 */
import type { FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { issueToError, report, unsupported } from "./chat-request.js";
import { engineError, invalidValue } from "../http/errors.js";
import { checkModelName, readyEngine, type RouteContext } from "../http/route-context.js";

/** Most texts per request. */
export const MAX_TOKENIZE_TEXTS = 64;
/**
 * Characters of text per token of the model's context that one request may ask to tokenize. The engine tokenizes
 * between steps (synchronously), so an unbounded text would stall every generation (8 MB: 10 s); text longer than
 * this could never be a prompt anyway.
 */
export const TOKENIZE_CHARS_PER_CONTEXT_TOKEN = 16;

const textSchema = z.unknown().transform((v, ctx): string[] | string => {
  if (typeof v === "string") return v;
  if (Array.isArray(v) && v.length > 0 && v.length <= MAX_TOKENIZE_TEXTS && v.every((t) => typeof t === "string")) return [...(v as string[])];
  if (v === undefined) report(ctx, "missing_field", "", [], v);
  else report(ctx, "invalid_value", `expected a string or an array of 1 to ${MAX_TOKENIZE_TEXTS} strings.`, [], v);
  return "";
});

const tokenizeBodySchema = z.object({
  model: z.string().min(1),
  text: textSchema,
  add_special_tokens: z.boolean().nullish(),
  max_length: z.number().int().min(1).max(0xffffffff).nullish(),
  pad_to_max_length: unsupported((v) => v === false, "Padding is not available (no pad token)."),
  padding_side: unsupported(() => false, "Padding is not available (no pad token)."),
  padding: unsupported((v) => v === false || v === "do_not_pad", "Padding is not available (no pad token)."),
});

/** Handle one tokenize request. */
export async function handleTokenize(ctx: RouteContext, req: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const parsed = tokenizeBodySchema.safeParse(req.body, { reportInput: true });
  if (!parsed.success) throw issueToError(parsed.error.issues[0]!);
  const b = parsed.data;
  checkModelName(ctx.model, b.model);
  const engine = readyEngine(ctx, reply);
  const texts = typeof b.text === "string" ? [b.text] : b.text;
  const limit = engine.maxModelLen * TOKENIZE_CHARS_PER_CONTEXT_TOKEN;
  const total = texts.reduce((n, t) => n + t.length, 0);
  if (total > limit) {
    throw invalidValue("text", `Invalid value for 'text': ${total} characters is more than this model's context can hold (at most ${limit} characters per request: ${TOKENIZE_CHARS_PER_CONTEXT_TOKEN} per token of the ${engine.maxModelLen}-token context).`);
  }
  let results: number[][];
  try {
    results = await Promise.all(texts.map((t) => engine.tokenize(t, b.add_special_tokens ?? true)));
  } catch (err) {
    if (ctx.engine() === null) {
      void reply.header("retry-after", "1");
      throw ctx.unavailable();
    }
    throw engineError(`tokenization failed: ${(err as Error).message}`);
  }
  const cut = (tokens: number[]): number[] => (b.max_length != null ? tokens.slice(0, b.max_length) : tokens);
  return { tokens: typeof b.text === "string" ? cut(results[0]!) : results.map(cut) };
}
