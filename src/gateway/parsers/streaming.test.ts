import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CASES, type ParserCase } from "../../../test/support/parsers/cases.js";
import { FILE_TOOLS, QWEN3_CORPUS } from "../../../test/support/parsers/qwen3-corpus.js";
import { options, runPieces, splitAt } from "../../../test/support/parsers/test-harness.js";
import { createOutputParser } from "./index.js";
import type { ParsedOutput } from "./types.js";

/** The answer a case's rules give, with the ids the counting generator hands out. */
function expected(c: ParserCase): ParsedOutput {
  return {
    content: c.content,
    reasoning: c.reasoning ?? null,
    toolCalls: (c.calls ?? []).map((call, i) => ({ id: `call_${i}`, ...call })),
  };
}

describe("Qwen3.x corpus: unary and streamed at any split", () => {
  for (const c of QWEN3_CORPUS) {
    describe(c.name, () => {
      const want = expected(c);
      const run = (pieces: string[]) => runPieces(options(c.opts), pieces, c.reason ?? "stop");

      it("unary (one piece) gives the expected calls and content", () => {
        const r = run([c.text]);
        expect(r.result).toEqual(want);
        expect(r.streamed).toEqual(want);
      });

      it("every 1-cut split and one character at a time stream the same answer", () => {
        for (let i = 0; i <= c.text.length; i++) {
          const r = run(splitAt(c.text, [i]));
          if (JSON.stringify(r.streamed) !== JSON.stringify(want) || JSON.stringify(r.result) !== JSON.stringify(want)) {
            expect(r.result, `cut at ${i}`).toEqual(want);
            expect(r.streamed, `cut at ${i}`).toEqual(want);
          }
        }
        expect(run(c.text.split("")).streamed).toEqual(want);
      });

      it("random chunkings (fast-check)", () => {
        fc.assert(
          fc.property(fc.array(fc.nat({ max: c.text.length }), { maxLength: 16 }), (cuts) => {
            const r = run(splitAt(c.text, cuts));
            expect(r.result).toEqual(want);
            expect(r.streamed).toEqual(want);
          }),
          { numRuns: 150 },
        );
      });
    });
  }
});

/** Every parser setting a text can meet. */
const SETTINGS = fc.record({
  toolParser: fc.constantFrom(null, "hermes3" as const, "qwen3coder" as const, "llama3" as const),
  reasoning: fc.constantFrom("none", "explicit", "open"),
  reason: fc.constantFrom("stop" as const, "length" as const),
});

/** Streamed (deltas of a random split) equals unary (one piece), and the stream rebuilds the parser's result. */
function checkStreamedEqualsUnary(text: string, s: { toolParser: "hermes3" | "qwen3coder" | "llama3" | null; reasoning: string; reason: "stop" | "length" }, cuts: number[]): void {
  const opts = () =>
    options({
      toolParser: s.toolParser,
      tools: FILE_TOOLS,
      reasoningParser: s.reasoning === "none" ? null : "qwen3",
      reasoningOpen: s.reasoning === "open",
    });
  const unary = runPieces(opts(), [text], s.reason).result;
  const split = runPieces(opts(), splitAt(text, cuts.map((c) => c % (text.length + 1))), s.reason);
  expect(split.result).toEqual(unary);
  expect(split.streamed).toEqual(unary);
  for (const call of unary.toolCalls) {
    const args: unknown = JSON.parse(call.arguments);
    expect(typeof args === "object" && args !== null && !Array.isArray(args)).toBe(true);
  }
}

describe("streamed = unary for every parser", () => {
  const corpus = [...CASES, ...QWEN3_CORPUS].map((c) => c.text);

  it("corpus texts under every parser, reasoning mode and finish reason, cut anywhere, and truncated anywhere", () => {
    fc.assert(
      fc.property(fc.constantFrom(...corpus), SETTINGS, fc.array(fc.nat(), { maxLength: 12 }), fc.nat(), (text, s, cuts, end) => {
        // Why also a prefix: every corpus text cut by max_tokens at any point is an output too.
        checkStreamedEqualsUnary(text, s, cuts);
        checkStreamedEqualsUnary(text.slice(0, end % (text.length + 1)), s, cuts);
      }),
      { numRuns: 3000 },
    );
  });

  /** Pieces of call markup, JSON and values, stitched at random. */
  const PIECES = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", " ", "```", "<|python_tag|>", ";",
    "<function=write_file>", "<function=glob>", "<function=", "</function>", "<parameter=path>", "<parameter=content>",
    "<parameter=overwrite>", "<parameter=", "</parameter>", ">", "<", "True", "null", "12", "-0.50e1",
    '{"name": "write_file", "arguments": {', '{"name": "glob"', ', "arguments": ', '{"name": ', '"get_time"',
    '"path": ', '"content": "', '"a\\"b\\\\c\\u00e9\\ud83c\\udf0e', '\\n', '"', "{", "}", "[", "]", ",", ":",
    "é🌎", "hello", "</p>",
  ];
  const output = fc.array(fc.constantFrom(...PIECES), { maxLength: 24 }).map((p) => p.join(""));

  it("generated texts under every parser, reasoning mode and finish reason", () => {
    fc.assert(
      fc.property(output, SETTINGS, fc.array(fc.nat(), { maxLength: 12 }), (text, s, cuts) => checkStreamedEqualsUnary(text, s, cuts)),
      { numRuns: 5000 },
    );
  });

  it("a long string argument arrives in many fragments (hermes3, qwen3coder, llama3)", () => {
    const long = "line of text ".repeat(20);
    const texts = [
      ["hermes3", `<tool_call>\n{"name": "write_file", "arguments": {"path": "a", "content": "${long}"}}\n</tool_call>`],
      ["llama3", `<|python_tag|>{"name": "write_file", "parameters": {"path": "a", "content": "${long}"}}`],
      ["qwen3coder", `<tool_call>\n<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=content>\n${long}\n</parameter>\n</function>\n</tool_call>`],
    ] as const;
    for (const [toolParser, text] of texts) {
      const parser = createOutputParser(options({ toolParser, tools: FILE_TOOLS }));
      // Token-sized pieces, as an engine sends them.
      const deltas = [...splitAt(text, Array.from({ length: text.length / 4 }, (_, i) => i * 4)), null].map((p) =>
        p === null ? parser.finish("stop") : parser.push(p),
      );
      const fragments = deltas.flatMap((d) => d.toolCalls ?? []).filter((t) => t.arguments !== undefined);
      expect(fragments.length, toolParser).toBeGreaterThan(20);
      expect(fragments.map((f) => f.arguments).join(""), toolParser).toBe(JSON.stringify({ path: "a", content: long }));
      expect(parser.result().toolCalls[0]!.arguments).toBe(JSON.stringify({ path: "a", content: long }));
    }
  });
});
