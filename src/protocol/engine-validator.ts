/**
 * The gateway's check of engine → gateway frames: the protocol version, then the compiled validator of the
 * engine messages' JSON Schema (generated from engine-schema.ts: the same document the conformance suite and every
 * engine answer to). A frame that fails is an engine fault (the engine client kills that engine); it never throws.
 */
import { protocolJsonSchema } from "./json-schema.js";
import { PROTOCOL_VERSION, type EngineMessage } from "./messages.js";
import { compile, describeFailure } from "./schema-validator.js";

const engineMessage = compile(protocolJsonSchema().$defs.engineMessage);

/** Outcome of {@link parseEngineMessage}: the message (the decoded object itself, not a copy), or why it is not one. */
export type ParsedEngineMessage = { ok: true; message: EngineMessage } | { ok: false; error: string };

/** Check a decoded frame as an engine → gateway message. */
export function parseEngineMessage(raw: Record<string, unknown>): ParsedEngineMessage {
  if (raw["v"] !== PROTOCOL_VERSION) {
    return { ok: false, error: `unsupported protocol version ${JSON.stringify(raw["v"])} (expected ${PROTOCOL_VERSION})` };
  }
  const failure = engineMessage(raw);
  if (failure !== null) return { ok: false, error: `invalid ${String(raw["type"])} message: ${describeFailure(failure)}` };
  return { ok: true, message: raw as unknown as EngineMessage };
}
