/**
 * The protocol's JSON Schema, generated from its zod schemas (gateway-schema.ts, engine-schema.ts) and checked in as
 * protocol.schema.json for validators in other languages (the Python worker's messages.py reads it). A unit test
 * (json-schema.test.ts) fails when the checked-in file is stale; `npx vitest run src/protocol/json-schema.test.ts -u`
 * rewrites it.
 *
 * The generator emits a small subset of JSON Schema 2020-12, which {@link SCHEMA_KEYWORDS} lists: every validator of
 * this document (schema-validator.ts, messages.py) implements exactly these keywords and refuses a schema that uses
 * any other, so a new zod feature that the generator renders differently fails loudly instead of being ignored.
 */
import { z } from "zod";
import { CHECKS_KEYWORD, MAX_GUIDE_GRAMMAR_BYTES, RESERVED_RULE } from "./checks.js";
import { engineMessage } from "./engine-schema.js";
import { gatewayMessage, samplingParams } from "./gateway-schema.js";
import { PROTOCOL_VERSION } from "./messages.js";

/** The JSON Schema keywords the generator emits and every validator of protocol.schema.json implements. */
export const SCHEMA_KEYWORDS = [
  "type",
  "const",
  "enum",
  "properties",
  "required",
  "additionalProperties",
  "propertyNames",
  "items",
  "prefixItems",
  "minItems",
  "maxItems",
  "minimum",
  "maximum",
  "exclusiveMinimum",
  "exclusiveMaximum",
  "minLength",
  "maxLength",
  "pattern",
  "anyOf",
  "oneOf",
  CHECKS_KEYWORD,
  // Annotations, no assertion.
  "$schema",
  "description",
] as const;

/** A JSON Schema node (the subset above). */
export type JsonSchema = { [keyword: string]: unknown };

/** The definitions of protocol.schema.json. */
export interface ProtocolSchema {
  $schema: string;
  $comment: string;
  protocolVersion: number;
  /** The constants the named checks (checks.ts) use, so that another language's checks read them from here. */
  checkConstants: { maxGuideGrammarBytes: number; reservedRule: string };
  $defs: {
    /** Every gateway → engine message; an add's `params` only as an object (refused on their own: samplingParams). */
    gatewayMessage: JsonSchema;
    /** `add.params`: a sound add whose params fail this is refused (`invalid_params`), not a protocol error. */
    samplingParams: JsonSchema;
    /** Every engine → gateway message. */
    engineMessage: JsonSchema;
  };
}

/** One definition: the schema of what a validator receives (zod's "input" view), without a `$schema` of its own. */
function definition(schema: z.ZodType): JsonSchema {
  const { $schema: _, ...rest } = z.toJSONSchema(schema, { io: "input", unrepresentable: "throw" }) as JsonSchema;
  return rest;
}

/** The protocol's JSON Schema document (what protocol.schema.json holds). */
export function protocolJsonSchema(): ProtocolSchema {
  return {
    $schema: "https://json-schema.org/draft/2020-12/schema",
    $comment: "Generated from src/protocol/gateway-schema.ts and engine-schema.ts by json-schema.ts; do not edit. Regenerate: npx vitest run src/protocol/json-schema.test.ts -u",
    protocolVersion: PROTOCOL_VERSION,
    checkConstants: { maxGuideGrammarBytes: MAX_GUIDE_GRAMMAR_BYTES, reservedRule: RESERVED_RULE },
    $defs: { gatewayMessage: definition(gatewayMessage), samplingParams: definition(samplingParams), engineMessage: definition(engineMessage) },
  };
}

/** The document as checked in: two-space JSON and a final newline. */
export function protocolJsonSchemaText(): string {
  return `${JSON.stringify(protocolJsonSchema(), null, 2)}\n`;
}
