/**
 * Validation of messages that cross the engine channel. A message that fails validation is answered with a
 * protocol error; it never throws past this module.
 */
import { z } from "zod";
import { PROTOCOL_VERSION, type GatewayMessage } from "./messages.js";

const tokenIds = z.array(z.number().int().min(0).max(0x7fffffff));

const samplingParams = z.object({
  maxTokens: z.number().int().min(1).nullable(),
  temperature: z.number().min(0).max(2),
  topP: z.number().gt(0).max(1),
  topK: z.number().int().min(-1),
  seed: z.number().int().min(0).max(0xffffffff),
  ignoreEos: z.boolean(),
});

const gatewayMessage = z.discriminatedUnion("type", [
  z.object({
    v: z.number(),
    type: z.literal("add"),
    id: z.string().min(1).max(256),
    prompt: z.union([z.object({ text: z.string() }), z.object({ tokens: tokenIds.min(1) })]),
    params: samplingParams,
    generated: tokenIds.optional(),
  }),
  z.object({ v: z.number(), type: z.literal("abort"), ids: z.array(z.string()) }),
  z.object({ v: z.number(), type: z.literal("ping"), nonce: z.number() }),
  z.object({ v: z.number(), type: z.literal("shutdown") }),
  z.object({ v: z.number(), type: z.literal("tokenize"), id: z.string().min(1).max(256), text: z.string(), addSpecialTokens: z.boolean() }),
]);

/** Parse a decoded frame as a gateway → engine message, or say why it is not one. */
export function parseGatewayMessage(raw: Record<string, unknown>): { ok: true; message: GatewayMessage } | { ok: false; error: string } {
  if (raw["v"] !== PROTOCOL_VERSION) {
    return { ok: false, error: `unsupported protocol version ${JSON.stringify(raw["v"])} (expected ${PROTOCOL_VERSION})` };
  }
  const result = gatewayMessage.safeParse(raw);
  if (!result.success) {
    const first = result.error.issues[0];
    return { ok: false, error: `invalid ${String(raw["type"])} message: ${first?.path.join(".") ?? ""} ${first?.message ?? ""}`.trim() };
  }
  return { ok: true, message: result.data as GatewayMessage };
}
