/**
 * Client grammars (llama.cpp's `grammar`, `structured_outputs.grammar`), regexes and choice lists as guides: what the
 * emitted grammar accepts (the test-only recogniser, llama.cpp's semantics), that llama.cpp's own parser takes it,
 * and the 400s naming the field for what cannot be applied.
 */
import { getLlama, type Llama } from "node-llama-cpp";
import { beforeAll, describe, expect, it } from "vitest";
import type { GuideSpec } from "../../protocol/messages.js";
import { KeelHttpError } from "../http/errors.js";
import type { ResponseFormat } from "../tools.js";
import { GbnfGrammar } from "./gbnf-recognizer.js";
import { buildGuide } from "./guide.js";
import { MAX_ENUM_VALUES } from "./schema-limits.js";
import type { GuideRequest } from "./types.js";
import { MAX_USER_GRAMMAR_CHARS } from "./user-grammar.js";
import { WEATHER } from "./samples.js";

let llama: Llama;
beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: "never" });
});

const request = (responseFormat: ResponseFormat, extra: Partial<GuideRequest> = {}): GuideRequest => ({
  toolParser: null,
  tools: [],
  toolChoice: { kind: "none" },
  parallelToolCalls: true,
  responseFormat,
  guideAuto: false,
  reasoning: null,
  ...extra,
});

/** The guide of `rf`, checked to be one forced rule to the end, and a matcher of that rule. */
function guideOf(rf: ResponseFormat): { guide: GuideSpec; accepts: (s: string) => boolean } {
  const guide = buildGuide(request(rf))!;
  expect(guide.start.kind).toBe("rule");
  const start = guide.start as Extract<GuideSpec["start"], { kind: "rule" }>;
  expect(start.then).toBe("end");
  const g = new GbnfGrammar(guide.grammar);
  return { guide, accepts: (s) => g.accepts(start.rule, s) };
}

/** The 400 `buildGuide` throws for `rf`. */
function refusal(rf: ResponseFormat): KeelHttpError {
  try {
    buildGuide(request(rf));
  } catch (e) {
    expect(e).toBeInstanceOf(KeelHttpError);
    return e as KeelHttpError;
  }
  throw new Error(`expected a 400 for ${JSON.stringify(rf).slice(0, 200)}`);
}

const grammar = (text: string): ResponseFormat => ({ kind: "grammar", grammar: text, field: "grammar" });

describe("a client's GBNF grammar", () => {
  it("is applied with llama.cpp's meaning: rules, classes, escapes, groups, repetitions, comments, continued lines", async () => {
    const text = [
      "# a greeting, then digits",
      'root ::= greet " " num ( "!" | "?" )?   # trailing comment',
      'greet ::= "hi" | "h\\x65llo" |',
      '   "\\u00e9t\\u00e9"',
      "num ::= [1-9] [0-9]{0,3} sep*",
      'sep ::= [^a-z\\n0-9!? ]',
    ].join("\n");
    const { guide, accepts } = guideOf(grammar(text));
    for (const ok of ["hi 1", "hello 42!", "été 1234?", "hi 7__", "hi 9-"]) expect(accepts(ok), ok).toBe(true);
    for (const bad of ["hi 0", "hey 1", "hi 12345", "hi 1a", "hi 1!!", "hello  1", ""]) expect(accepts(bad), bad).toBe(false);
    // Rules keep their names under a prefix, so they never meet Keel's own.
    expect(guide.grammar).toMatch(/^gr-root ::= /m);
    await llama.createGrammar({ grammar: guide.grammar, rootRuleName: "gr-root" });
  });

  it("keeps only the rules root reaches, and `.` is any character", async () => {
    const { guide, accepts } = guideOf(grammar('root ::= "<" . ">"\nunused ::= "x"\n'));
    expect(accepts("<é>")).toBe(true);
    expect(accepts("<>")).toBe(false);
    expect(guide.grammar).not.toContain("unused");
    await llama.createGrammar({ grammar: guide.grammar, rootRuleName: "gr-root" });
  });

  it("passes through the reasoning gate like any forced rule", () => {
    const g = buildGuide(request(grammar('root ::= "yes" | "no"'), { reasoning: { parser: "qwen3", open: false } }))!;
    expect(g.reasoning).toMatchObject({ open: "<think>", close: "</think>" });
    const gate = new GbnfGrammar(g.grammar);
    expect(gate.accepts((g.start as { rule: string }).rule, "<think>")).toBe(true);
    expect(gate.accepts((g.start as { rule: string }).rule, "no")).toBe(true);
  });

  it.each([
    ['root ::= "a" missing', /rule 'root' refers to the undefined rule 'missing'/],
    ['start ::= "a"', /no 'root' rule/],
    ['root ::= "a"\nroot ::= "b"', /syntax error at line 2: rule 'root' is defined twice/],
    ['root ::= "a"\n\nx ::= "b" )', /syntax error at line 3: unexpected "\)"/],
    ['root ::= [a-', /unterminated character class/],
    ['root ::= "abc', /unterminated string/],
    ['root ::= "\\q"', /unknown escape '\\q'/],
    ['root ::= [z-a]', /reversed/],
    ["root ::= [^\\x00-\\U0010FFFF]", /matches no character/],
    ['root ::= <|im_end|> "a"', /token references/],
    ['root ::= x "a"\nx ::= root | "b"', /left-recursive/],
    ['root ::= ("a"?)* "b"', /repeats without bound something that can match nothing/],
    ['root ::= "a" root', /rule 'root' derives no finite text/],
    ['root ::= "a"{3,2}', /maximum below its minimum/],
    ['root ::= ("a"{0,100}){0,20}', /a repetition expands to/],
    [`root ::= ${"(".repeat(80)}"a"${")".repeat(80)}`, /groups nest deeper than 64/],
    ["   # only a comment\n", /defines no rule/],
  ])("refuses %j with a 400 naming the field", (text, why) => {
    const e = refusal(grammar(text));
    expect({ code: e.code, param: e.param }).toEqual({ code: "invalid_value", param: "grammar" });
    expect(e.message).toMatch(/^Invalid grammar in 'grammar': /);
    expect(e.message).toMatch(why);
  });

  it("refuses a text longer than 64 K characters before reading it", () => {
    const e = refusal(grammar(`root ::= "a"\n# ${"x".repeat(MAX_USER_GRAMMAR_CHARS)}\n`));
    expect(e.message).toBe(`Invalid grammar in 'grammar': the grammar is longer than ${MAX_USER_GRAMMAR_CHARS} characters (limit ${MAX_USER_GRAMMAR_CHARS}).`);
  });

  it("refuses a grammar whose repetitions expand past the size limit", () => {
    const rules = Array.from({ length: 40 }, (_, i) => `r${i} ::= [a-z]{0,1999}`).join("\n");
    const e = refusal(grammar(`root ::= ${Array.from({ length: 40 }, (_, i) => `r${i}`).join(" ")}\n${rules}`));
    expect(e.param).toBe("grammar");
    expect(e.message).toMatch(/exceeds \d+ characters/);
  });
});

describe("regex and choice", () => {
  it("a regex is matched in full (anchors at the ends change nothing), newlines included", () => {
    for (const pattern of ["[0-9]{3}-[A-Z]+", "^[0-9]{3}-[A-Z]+$"]) {
      const { accepts } = guideOf({ kind: "regex", pattern, field: "structured_outputs.regex" });
      expect(accepts("123-AB")).toBe(true);
      expect(accepts("x123-AB")).toBe(false);
      expect(accepts("123-AB ")).toBe(false);
    }
    const lines = guideOf({ kind: "regex", pattern: "(a\\n)+b", field: "guided_regex" });
    expect(lines.accepts("a\na\nb")).toBe(true);
  });

  it("a regex the converter cannot take is a 400 naming its field", () => {
    const bad = (pattern: string) => refusal({ kind: "regex", pattern, field: "structured_outputs.regex" });
    expect(bad("(")).toMatchObject({ param: "structured_outputs.regex", message: expect.stringMatching(/invalid regular expression/) });
    expect(bad("a(?=b)")).toMatchObject({ param: "structured_outputs.regex", message: expect.stringMatching(/lookahead|lookaround/i) });
    expect(bad("a{0,5000}").message).toMatch(/repetition bound above 1999/);
  });

  it("an escaped surrogate pair is the character it encodes (as in a JavaScript regex); a lone surrogate is a 400 wherever it is written", () => {
    for (const pattern of ["\\ud83d\\ude00", "\\u{1F600}", "😀"]) {
      const { accepts } = guideOf({ kind: "regex", pattern, field: "structured_outputs.regex" });
      expect(accepts("😀")).toBe(true);
      expect(new RegExp(`^(?:${pattern})$`, "u").test("😀")).toBe(true);
    }
    expect(refusal({ kind: "regex", pattern: "a\\ud83d", field: "guided_regex" })).toMatchObject({ param: "guided_regex", message: expect.stringMatching(/lone surrogate/) });
    expect(refusal({ kind: "regex", pattern: "a\ud83d", field: "guided_regex" }).message).toMatch(/lone surrogate U\+D83D/);
    expect(refusal(grammar('root ::= "x\\uDC00y"')).message).toMatch(/lone surrogate U\+DC00/);
    expect(refusal({ kind: "choice", choices: ["ok", "\ud83d"], field: "structured_outputs.choice" }).message).toMatch(/lone surrogate U\+D83D/);
  });

  it("a choice is exactly one of the strings, special characters included", async () => {
    const { guide, accepts } = guideOf({ kind: "choice", choices: ["yes", "no", 'say "hi"\n', "yes"], field: "structured_outputs.choice" });
    for (const ok of ["yes", "no", 'say "hi"\n']) expect(accepts(ok)).toBe(true);
    for (const bad of ["ye", "yesno", "No", ""]) expect(accepts(bad)).toBe(false);
    await llama.createGrammar({ grammar: guide.grammar, rootRuleName: (guide.start as { rule: string }).rule });
  });

  it("a choice list has the enum limits", () => {
    const many = Array.from({ length: MAX_ENUM_VALUES + 1 }, (_, i) => `c${i}`);
    expect(refusal({ kind: "choice", choices: many, field: "guided_choice" }).message).toMatch(/more than 1000 choices/);
    expect(refusal({ kind: "choice", choices: ["x".repeat(15001)], field: "guided_choice" }).message).toMatch(/more than 15000 characters/);
  });

  it("structured_outputs.json is the schema converter under its own field: values match, a bad schema names the field", () => {
    const { accepts } = guideOf({ kind: "json_schema", name: "s", schema: { type: "integer", minimum: 3, maximum: 12 }, strict: true, field: "structured_outputs.json" });
    expect(["3", "12", "7"].every(accepts)).toBe(true);
    expect(["2", "13", '"7"'].some(accepts)).toBe(false);
    const e = refusal({ kind: "json_schema", name: "s", schema: { type: "string", pattern: "(?<=a)b" }, strict: true, field: "guided_json" });
    expect(e.param).toBe("guided_json");
    expect(e.message).toMatch(/lookaround/);
  });

  it("one constraint with active tools is refused, naming the constraint's field", () => {
    let err: unknown;
    try {
      buildGuide(request({ kind: "regex", pattern: "a", field: "guided_regex" }, { tools: [WEATHER], toolChoice: { kind: "auto" }, toolParser: "hermes3" }));
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ status: 400, param: "guided_regex", message: expect.stringMatching(/cannot be combined with tools unless tool_choice is 'none'/) });
  });
});
