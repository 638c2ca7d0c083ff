/**
 * Every grammar Keel emits parses in llama.cpp's own GBNF parser (node-llama-cpp's LlamaGrammar, validated with a
 * null vocab), with each rule a phase or trigger names as the root: the schema samples, every call format, and the
 * guides of each request shape.
 */
import { getLlama, type Llama } from "node-llama-cpp";
import { beforeAll, describe, expect, it } from "vitest";
import type { GuideSpec } from "../../protocol/messages.js";
import { buildGuide } from "./guide.js";
import { KeelHttpError } from "../http/errors.js";
import { MAX_GROUP_DEPTH } from "./gbnf-limits.js";
import { schemaToGbnf } from "./json-schema-gbnf.js";
import { MAX_REPEAT } from "./pattern-gbnf.js";
import { MAX_PREFIX_ITEMS } from "./schema-limits.js";
import { SCHEMAS, TOOLS } from "./samples.js";
import type { GuideRequest } from "./types.js";

let llama: Llama;
beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: "never" });
});

/** Parses `grammar` with `root` as the root rule; rejects when llama.cpp refuses it. */
async function parses(grammar: string, root: string): Promise<void> {
  await llama.createGrammar({ grammar, rootRuleName: root });
}

/** Rules a guide names. */
function namedRules(g: GuideSpec): string[] {
  const out: string[] = [];
  if (g.start.kind === "rule") out.push(g.start.rule);
  if (g.reasoning?.after.kind === "rule") out.push(g.reasoning.after.rule);
  for (const t of g.triggers ?? []) out.push(t.rule);
  return out;
}

describe("llama.cpp parses our grammars", () => {
  it("a broken grammar is refused (the check can fail)", async () => {
    await expect(parses('root ::= "a" missing\n', "root")).rejects.toThrow();
    await expect(parses('root ::= [a-\n', "root")).rejects.toThrow();
    await expect(parses('root ::= x "a"\nx ::= root | "b"\n', "root")).rejects.toThrow(); // left recursion
    await expect(parses('root ::= "a"\n', "other")).rejects.toThrow(); // missing root
  });

  it("every sample schema", async () => {
    for (const schema of SCHEMAS) {
      const { grammar } = schemaToGbnf(schema, { param: "p" });
      await parses(grammar, "root");
    }
  });

  it("every guide shape, every named rule", async () => {
    const base: GuideRequest = {
      toolParser: "hermes3",
      tools: TOOLS,
      toolChoice: { kind: "auto" },
      parallelToolCalls: true,
      responseFormat: { kind: "text" },
      guideAuto: true,
      reasoning: null,
    };
    const requests: GuideRequest[] = [];
    for (const toolParser of ["hermes3", "qwen3coder", "llama3"] as const) {
      for (const toolChoice of [{ kind: "auto" }, { kind: "required" }, { kind: "function", name: "save_tree" }] as const) {
        for (const reasoning of [null, { parser: "qwen3", open: false }, { parser: "qwen3", open: true }] as const) {
          for (const parallelToolCalls of [true, false]) requests.push({ ...base, toolParser, toolChoice, reasoning, parallelToolCalls });
        }
      }
    }
    requests.push({ ...base, tools: [], responseFormat: { kind: "json_object" }, reasoning: { parser: "qwen3", open: false } });
    for (const schema of SCHEMAS) {
      requests.push({ ...base, tools: [], responseFormat: { kind: "json_schema", name: "s", schema: schema as Record<string, unknown>, strict: true } });
    }
    let checked = 0;
    for (const req of requests) {
      const g = buildGuide(req)!;
      expect(g).not.toBeNull();
      for (const rule of namedRules(g)) {
        await parses(g.grammar, rule);
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(requests.length);
  });

  it("boundary schemas: exactly at each limit parses in llama.cpp, just above is a 400 (issue #9)", async () => {
    const tuple = (n: number) => ({ type: "array", prefixItems: Array.from({ length: n }, () => ({ type: "integer" })) });
    const nested = (n: number) => `^${"(a".repeat(n)}${")?".repeat(n)}$`;
    // [at the limit, just above it]
    const pairs: Array<[unknown, unknown]> = [
      [{ type: "string", maxLength: MAX_REPEAT }, { type: "string", maxLength: MAX_REPEAT + 1 }],
      [{ type: "string", minLength: MAX_REPEAT }, { type: "string", minLength: MAX_REPEAT + 1 }],
      [{ type: "array", items: { type: "integer" }, maxItems: MAX_REPEAT }, { type: "array", items: { type: "integer" }, maxItems: MAX_REPEAT + 1 }],
      [tuple(MAX_PREFIX_ITEMS), tuple(MAX_PREFIX_ITEMS + 1)],
      [{ type: "string", pattern: `^a{0,${MAX_REPEAT}}$` }, { type: "string", pattern: `^a{0,${MAX_REPEAT + 1}}$` }],
      // Nested repetitions multiply: 101 rules × 19 < 2000 ≤ 101 × 20.
      [{ type: "string", pattern: "^(a{1,100}){1,19}$" }, { type: "string", pattern: "^(a{1,100}){1,20}$" }],
      [{ type: "string", pattern: "^b(a{1,100}){1,19}$" }, { type: "string", pattern: "^(a|a)*b(a{1,100}){1,100}$" }],
      [{ type: "string", pattern: nested(MAX_GROUP_DEPTH - 2) }, { type: "string", pattern: nested(MAX_GROUP_DEPTH + 1) }],
    ];
    for (const [at, above] of pairs) {
      const { grammar } = schemaToGbnf(at, { param: "p" });
      await parses(grammar, "root");
      expect(() => schemaToGbnf(above, { param: "p" }), JSON.stringify(above).slice(0, 80)).toThrow(KeelHttpError);
    }
  });

  it("boundary schemas as qwen3coder parameters (raw values)", async () => {
    const req = (minLength: number): GuideRequest => ({
      toolParser: "qwen3coder",
      tools: [{ name: "f", parameters: { type: "object", properties: { s: { type: "string", minLength } }, required: ["s"] } }],
      toolChoice: { kind: "required" },
      parallelToolCalls: true,
      responseFormat: { kind: "text" },
      guideAuto: true,
      reasoning: null,
    });
    const g = buildGuide(req(MAX_REPEAT))!;
    for (const rule of namedRules(g)) await parses(g.grammar, rule);
    for (const above of [MAX_REPEAT + 1, 4096]) expect(() => buildGuide(req(above))).toThrow(KeelHttpError);
  });
});

