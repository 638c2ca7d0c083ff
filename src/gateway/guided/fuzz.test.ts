/**
 * Whatever a client sends as a schema, the converter answers with a grammar that llama.cpp parses or with a
 * KeelHttpError 400 — never another exception (a TypeError would be a 500) and never a grammar the engine would
 * reject. Schemas come from a generator of schema-like objects with wrong types and odd values mixed in.
 */
import fc from "fast-check";
import { getLlama, type Llama } from "node-llama-cpp";
import { beforeAll, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import type { ToolSpec } from "../tools.js";
import { GbnfGrammar } from "./gbnf-recognizer.js";
import { buildGuide } from "./guide.js";

let llama: Llama;
beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: "never" });
});

const odd = fc.oneof(fc.constant(null), fc.boolean(), fc.integer({ min: -3, max: 20 }), fc.double(), fc.string({ maxLength: 4 }), fc.constant([]), fc.constant({}));
const typeName = fc.constantFrom("object", "array", "string", "integer", "number", "boolean", "null", "strng");
const schemaArb: fc.Arbitrary<unknown> = fc.letrec<{ s: unknown }>((tie) => ({
  s: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    fc.constant(true),
    odd,
    fc.record(
      {
        type: fc.oneof(typeName, fc.array(typeName, { maxLength: 3 }), odd),
        properties: fc.oneof(fc.dictionary(fc.constantFrom("a", "b", "c~/", "d%"), tie("s"), { maxKeys: 3 }), odd),
        required: fc.oneof(fc.array(fc.constantFrom("a", "b", "z"), { maxLength: 2 }), odd),
        additionalProperties: fc.oneof(fc.boolean(), tie("s")),
        items: fc.oneof(tie("s"), fc.array(tie("s"), { maxLength: 2 })),
        prefixItems: fc.oneof(fc.array(tie("s"), { maxLength: 2 }), odd),
        anyOf: fc.oneof(fc.array(tie("s"), { maxLength: 3 }), odd),
        allOf: fc.oneof(fc.array(tie("s"), { maxLength: 2 }), odd),
        enum: fc.oneof(fc.array(fc.jsonValue({ maxDepth: 1 }), { maxLength: 3 }), odd),
        const: fc.jsonValue({ maxDepth: 1 }),
        $ref: fc.oneof(fc.constantFrom("#", "#/$defs/x", "#/properties/a", "#/definitions/y", "#/nope", "http://x"), odd),
        $defs: fc.oneof(fc.record({ x: tie("s") }), odd),
        minimum: fc.oneof(fc.integer({ min: -50, max: 50 }), fc.double({ min: -1e20, max: 1e20, noNaN: true }), odd),
        exclusiveMaximum: fc.oneof(fc.integer({ min: -50, max: 50 }), fc.boolean(), odd),
        minLength: fc.oneof(fc.integer({ min: -1, max: 8 }), odd),
        maxLength: fc.oneof(fc.integer({ min: -1, max: 8 }), odd),
        minItems: fc.oneof(fc.integer({ min: -1, max: 4 }), odd),
        maxItems: fc.oneof(fc.integer({ min: -1, max: 4 }), odd),
        pattern: fc.oneof(fc.constantFrom("^a+$", "(", "[^x]{2}", "a|", "\\d{1,3}", "x(?=y)", "^$", "[]", "a{2,1}", "\\u{1F600}"), odd),
        format: fc.oneof(fc.constantFrom("date", "uuid", "email", "ipv4"), odd),
        description: fc.string({ maxLength: 5 }),
      },
      { requiredKeys: [] },
    ),
  ),
})).s;

/** True when `e` is the 400 the gateway answers with. */
function isClean400(e: unknown): boolean {
  return e instanceof KeelHttpError && e.status === 400 && e.code === "invalid_value";
}

it("random schemas: a parsable grammar or a clean 400, as response_format and as tool parameters", async () => {
  let built = 0;
  let refusedCount = 0;
  const samples: Array<{ grammar: string; rules: string[] }> = [];
  fc.assert(
    fc.property(schemaArb, fc.constantFrom("hermes3", "qwen3coder", "llama3", "json") as fc.Arbitrary<string>, (schema, how) => {
      try {
        const g =
          how === "json"
            ? buildGuide({
                toolParser: null,
                tools: [],
                toolChoice: { kind: "auto" },
                parallelToolCalls: true,
                responseFormat: { kind: "json_schema", name: "s", schema: schema as Record<string, unknown>, strict: true },
                guideAuto: false,
                reasoning: null,
              })
            : buildGuide({
                toolParser: how as "hermes3",
                tools: [{ name: "f", parameters: schema } as ToolSpec],
                toolChoice: { kind: "required" },
                parallelToolCalls: true,
                responseFormat: { kind: "text" },
                guideAuto: true,
                reasoning: null,
              });
        if (g === null) return;
        built++;
        // Our recogniser parses it (every referenced rule defined)…
        new GbnfGrammar(g.grammar);
        if (samples.length < 150 && g.start.kind === "rule") samples.push({ grammar: g.grammar, rules: [g.start.rule] });
      } catch (e) {
        if (!isClean400(e)) throw e;
        refusedCount++;
      }
    }),
    { numRuns: 1500 },
  );
  // …and llama.cpp parses a sample of them.
  for (const s of samples) for (const rule of s.rules) await llama.createGrammar({ grammar: s.grammar, rootRuleName: rule });
  expect(built).toBeGreaterThan(50);
  expect(refusedCount).toBeGreaterThan(50);
});
