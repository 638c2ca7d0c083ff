/**
 * OpenVINO GenAI's structured output (its bundled XGrammar) as the guide mapping relies on and works around
 * (guides.py, gbnf.py, free_text.py; docs/upstream.md), shown on the raw library (xgrammar_contract.py) with the
 * embedded tiny model in F16. If a release fixes one, its test fails here and the workaround can be reconsidered.
 */
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { DEFAULT_MODEL_OPTIONS, ensureDefaultModel } from "../model/default-model.js";
import { openvinoPython } from "../../test/support/openvino.js";

const run = promisify(execFile);
const SCRIPT = path.join(path.dirname(new URL(import.meta.url).pathname), "xgrammar_contract.py");

type Result = { texts: [string, string]; tokens: number[]; stepErrors: string[]; invalid?: string[] };

async function check(name: string): Promise<Result> {
  const model = await ensureDefaultModel({ model: { ...DEFAULT_MODEL_OPTIONS, f16: true } });
  const { stdout } = await run(await openvinoPython(), [SCRIPT, model, name], { timeout: 120_000 });
  return JSON.parse(stdout.trim().split("\n").pop()!) as Result;
}

describe("XGrammar in OpenVINO GenAI 2026.4.1 (worked around by the guide mapping)", { timeout: 120_000 }, () => {
  it("a grammar XGrammar cannot parse raises inside step(), not at add_request, and every later step raises (gbnf.py: only re-written EBNF reaches it)", async () => {
    const r = await check("bad_grammar_wedges");
    expect(r.stepErrors).toHaveLength(3);
    expect(r.stepErrors[0]).toMatch(/grammar_parser/);
    expect(r.texts).toEqual(["", ""]); // the unconstrained neighbour got nothing either
  });

  it("\\x reads every hex digit that follows: \"\\x41bc\" is U+41BC (gbnf.py writes four-digit \\u escapes)", async () => {
    expect((await check("hex_escape_greedy")).texts[0]).toBe("\u41bc<|im_end|>");
  });

  it("a class starting with ^, even escaped, is negated (gbnf.py never starts a class with ^)", async () => {
    const r = await check("escaped_caret_negates");
    expect(r.stepErrors).toEqual([]);
    expect(r.texts[0].replace("<|im_end|>", "")).toMatch(/[^a^]/);
  });

  it("a root that derives nothing is no error, and the output is not constrained to anything (gbnf.py refuses it at add)", async () => {
    const r = await check("empty_language_unconstrained");
    expect(r.stepErrors).toEqual([]);
    expect(r.tokens).toHaveLength(16);
  });

  it("a Union of open-ended and bounded elements raises inside step() (guides.py: unions are all EBNF)", async () => {
    expect((await check("union_mixed_raises")).stepErrors[0]).toMatch(/all elements in an or format to be unlimited or all limited/);
  });

  it("triggers nested in one another raise inside step() (guides.py: the free text as an EBNF automaton then)", async () => {
    expect((await check("nested_triggers_raise")).stepErrors[0]).toMatch(/One tag matches multiple triggers/);
  });

  it("ignore_eos: after a complete grammar the output goes on unconstrained (worker: a guide with ignoreEos is refused)", async () => {
    const r = await check("ignore_eos_after_grammar");
    expect(r.texts[0].startsWith("ab<|im_end|>")).toBe(true);
    expect(r.tokens).toHaveLength(10);
  });

  it("min_new_tokens past a complete grammar samples masked NUL tokens (worker: a guide with minTokens is refused)", async () => {
    const r = await check("min_new_tokens_masked");
    expect(r.texts[0]).toMatch(/^ab\u0000+/);
  });

  it("inside a string literal, U+0080–U+00FF before a hex digit is misread (\"°C\" matches U+0B0C; gbnf.py splits the literal there)", async () => {
    const r = await check("latin1_before_hex_digit");
    expect(r.texts).toEqual(["\u0b0c<|im_end|>", "°C<|im_end|>"]);
  });

  it("a character class takes bytes that are not UTF-8 as characters (here overlong forms, C1 81 for \"A\"): guided output that no decoder reads (worker: utf8_guard.py samples again inside rules)", async () => {
    const r = await check("overlong_forms_accepted");
    expect(r.invalid!.length).toBeGreaterThan(0);
    // Each is the rule's "<" … ">" with a two-byte overlong form (C0/C1 and a continuation byte) among its characters.
    for (const hex of r.invalid!) expect(hex).toMatch(/^3c .* ?c[01] [89ab][0-9a-f] .*3e$/);
  });
});
