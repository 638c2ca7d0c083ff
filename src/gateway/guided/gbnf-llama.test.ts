/**
 * Every grammar Keel emits parses in llama.cpp's own GBNF parser (node-llama-cpp's LlamaGrammar, validated with a
 * null vocab), with each rule a phase or trigger names as the root: the schema samples, every call format, and the
 * guides of each request shape.
 */
import { getLlama, type Llama } from "node-llama-cpp";
import { beforeAll, describe, expect, it } from "vitest";
import type { GuideSpec } from "../../protocol/messages.js";
import { buildGuide } from "./guide.js";
import { schemaToGbnf } from "./json-schema-gbnf.js";
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
});
