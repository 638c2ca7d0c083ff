import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CASES, WEATHER_TOOLS, type ParserCase } from "../../../test/support/parsers/cases.js";
import { createOutputParser, pickToolParser, promptOpensReasoning, randomToolCallId } from "./index.js";
import { options, runPieces, splitAt, type Run } from "../../../test/support/parsers/test-harness.js";
import type { ParsedOutput } from "./types.js";

/** The answer a case's rules give, with the ids the counting generator hands out. */
function expected(c: ParserCase): ParsedOutput {
  return {
    content: c.content,
    reasoning: c.reasoning ?? null,
    toolCalls: (c.calls ?? []).map((call, i) => ({ id: `call_${i}`, ...call })),
  };
}

function run(c: ParserCase, pieces: readonly string[]): Run {
  return runPieces(options(c.opts), pieces, c.reason ?? "stop");
}

/** The same result and the same stream, whatever the split; `label` says which split broke. */
function expectSplit(c: ParserCase, pieces: string[], want: ParsedOutput): void {
  const r = run(c, pieces);
  // Why compare JSON first: tens of thousands of splits per case; the full matcher runs only to report a failure.
  const wantJson = JSON.stringify(want);
  if (JSON.stringify(r.result) === wantJson && JSON.stringify(r.streamed) === wantJson) return;
  const label = JSON.stringify(pieces);
  expect(r.result, label).toEqual(want);
  expect(r.streamed, label).toEqual(want);
}

describe("output parsers over recorded outputs", () => {
  for (const c of CASES) {
    describe(c.name, () => {
      const want = expected(c);

      it("whole text in one piece", () => {
        expectSplit(c, [c.text], want);
      });

      it("every 1-cut and 2-cut split", () => {
        const n = c.text.length;
        for (let i = 0; i <= n; i++) {
          expectSplit(c, splitAt(c.text, [i]), want);
          for (let j = i + 1; j <= n; j++) expectSplit(c, splitAt(c.text, [i, j]), want);
        }
      });

      it("one character at a time", () => {
        expectSplit(c, [...c.text.split("")], want);
      });

      it("random chunkings (fast-check)", () => {
        fc.assert(
          fc.property(fc.array(fc.nat({ max: c.text.length }), { maxLength: 12 }), (cuts) => {
            expectSplit(c, splitAt(c.text, cuts), want);
          }),
          { numRuns: 200 },
        );
      });
    });
  }
});

describe("streaming shape", () => {
  it("hermes3: the header as soon as the name closes, then compact argument fragments as they arrive", () => {
    const parser = createOutputParser(options({ toolParser: "hermes3", tools: WEATHER_TOOLS }));
    expect(parser.push("Hi <tool_call>\n")).toEqual({ content: "Hi " });
    expect(parser.push('{"name": "get_ti')).toEqual({});
    expect(parser.push('me", "arguments": {"tz"')).toEqual({ toolCalls: [{ index: 0, id: "call_0", name: "get_time" }, { index: 0, arguments: "{" }] });
    expect(parser.push(': "Europe/Pa')).toEqual({ toolCalls: [{ index: 0, arguments: '"tz":"Europe/Pa' }] });
    expect(parser.push('ris", "x": 1.50')).toEqual({ toolCalls: [{ index: 0, arguments: 'ris"' }] });
    expect(parser.push("}}\n</tool_")).toEqual({ toolCalls: [{ index: 0, arguments: ',"x":1.5}' }] });
    expect(parser.push("call>")).toEqual({});
    expect(parser.finish("stop")).toEqual({});
    expect(parser.result().toolCalls).toEqual([{ id: "call_0", name: "get_time", arguments: '{"tz":"Europe/Paris","x":1.5}' }]);
  });

  it("qwen3coder: the header at the first parameter, a string value streamed as JSON-string fragments", () => {
    const parser = createOutputParser(options({ toolParser: "qwen3coder", tools: WEATHER_TOOLS }));
    expect(parser.push("<tool_call>\n<function=run_code>\n")).toEqual({});
    expect(parser.push("<parameter=code>\nprint(1)")).toEqual({
      toolCalls: [{ index: 0, id: "call_0", name: "run_code" }, { index: 0, arguments: '{"code":"print(1)' }],
    });
    // The line break could be the one before `</parameter>` (trimmed): held until the next text shows it is not.
    expect(parser.push('\n')).toEqual({});
    expect(parser.push('x = "a"\n</param')).toEqual({ toolCalls: [{ index: 0, arguments: '\\nx = \\"a\\"' }] });
    expect(parser.push("eter>\n</function>\n</tool_call>")).toEqual({ toolCalls: [{ index: 0, arguments: '"}' }] });
    expect(parser.result().toolCalls[0]!.arguments).toBe(JSON.stringify({ code: 'print(1)\nx = "a"' }));
  });

  it("qwen3coder: a typed value is written whole when it closes", () => {
    const parser = createOutputParser(options({ toolParser: "qwen3coder", tools: WEATHER_TOOLS }));
    parser.push("<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n1");
    expect(parser.push("2\n</parameter>")).toEqual({});
    expect(parser.push("\n</function>")).toEqual({ toolCalls: [{ index: 0, arguments: ',"days":12}' }] });
  });

  it("holds back only a possible tag prefix", () => {
    const parser = createOutputParser(options({ toolParser: "qwen3coder", tools: WEATHER_TOOLS }));
    expect(parser.push("a < b and <func")).toEqual({ content: "a < b and " });
    expect(parser.push("tional>")).toEqual({ content: "<functional>" });
  });

  it("a bare candidate is released as soon as it cannot be a call", () => {
    const parser = createOutputParser(options({ toolParser: "hermes3", tools: WEATHER_TOOLS }));
    expect(parser.push('{"name": "search_web"')).toEqual({});
    expect(parser.push(", x")).toEqual({ content: '{"name": "search_web", x' });
  });

  it("a bare call naming a declared tool streams from its name on", () => {
    const parser = createOutputParser(options({ toolParser: "hermes3", tools: WEATHER_TOOLS }));
    expect(parser.push('{"name": "get_weather", "arguments": {"city": "Pa')).toEqual({
      toolCalls: [{ index: 0, id: "call_0", name: "get_weather" }, { index: 0, arguments: '{"city":"Pa' }],
    });
    expect(parser.push('ris"}}')).toEqual({ toolCalls: [{ index: 0, arguments: 'ris"}' }] });
  });

  it("reasoning streams as it arrives, the closing tag is never emitted", () => {
    const parser = createOutputParser(options({ reasoningParser: "qwen3", reasoningOpen: true }));
    expect(parser.push("step one</thi")).toEqual({ reasoning: "step one" });
    expect(parser.push("nk>Answer")).toEqual({ content: "Answer" });
    expect(parser.result()).toEqual({ content: "Answer", reasoning: "step one", toolCalls: [] });
  });

  it("reasoning that mentions <tool_call> keeps streaming; one that opens a call is held to </think> or the end", () => {
    const parser = createOutputParser(options({ toolParser: "hermes3", tools: WEATHER_TOOLS, reasoningParser: "qwen3", reasoningOpen: true }));
    expect(parser.push("Use <tool_call> ")).toEqual({ reasoning: "Use " });
    expect(parser.push("tags. Now ")).toEqual({ reasoning: "<tool_call> tags. Now " });
    expect(parser.push('<tool_call>\n{"name": "get_time", "arguments": {}}')).toEqual({});
    expect(parser.push("</tool_call>")).toEqual({});
    expect(parser.finish("stop")).toEqual({
      toolCalls: [{ index: 0, id: "call_0", name: "get_time" }, { index: 0, arguments: "{}" }],
    });
    expect(parser.result().reasoning).toBe("Use <tool_call> tags. Now ");
  });

  it("nothing after finish", () => {
    const parser = createOutputParser(options({ toolParser: "hermes3", tools: WEATHER_TOOLS }));
    parser.push("x");
    parser.finish("stop");
    expect(parser.push("more")).toEqual({});
    expect(parser.finish("stop")).toEqual({});
    expect(parser.result().content).toBe("x");
  });

  it("default ids are call_ + 24 alphanumerics, distinct", () => {
    const ids = new Set(Array.from({ length: 50 }, () => randomToolCallId()));
    expect(ids.size).toBe(50);
    for (const id of ids) expect(id).toMatch(/^call_[A-Za-z0-9]{24}$/);
  });
});

/** Random outputs stitched from the pieces models write, for every format. */
const FRAGMENTS = [
  "<think>",
  "</think>",
  "<tool_call>",
  "</tool_call>",
  "\n<tool_call>\n",
  "<function=get_weather>",
  "<function=",
  "</function>",
  "<parameter=city>",
  "<parameter=days>",
  "</parameter>",
  "\n</parameter>\n",
  "<|python_tag|>",
  '{"name": "get_weather", "arguments": {"city": "Paris"}}',
  '{"name": "get_time", "parameters": {"tz": "UTC"}}',
  '{"name": ',
  "}",
  "{",
  ";",
  "```json\n",
  "```",
  "Paris",
  "3",
  "True",
  " ",
  "\n",
  "<",
  "é🌎",
  "hello world",
];

describe("properties over random outputs", () => {
  const formats = [null, "hermes3", "qwen3coder", "llama3"] as const;
  const arbitraryOutput = fc.array(fc.constantFrom(...FRAGMENTS), { maxLength: 14 }).map((parts) => parts.join(""));

  it("any split gives the one-piece answer, and the deltas rebuild it", () => {
    fc.assert(
      fc.property(
        fc.constantFrom(...formats),
        fc.boolean(),
        fc.boolean(),
        fc.constantFrom("stop" as const, "length" as const),
        arbitraryOutput,
        fc.array(fc.nat(), { maxLength: 10 }),
        (toolParser, withReasoning, reasoningOpen, reason, text, cuts) => {
          const opts = () =>
            options({
              toolParser,
              tools: WEATHER_TOOLS,
              reasoningParser: withReasoning ? "qwen3" : null,
              reasoningOpen: withReasoning && reasoningOpen,
            });
          const whole = runPieces(opts(), [text], reason);
          const split = runPieces(opts(), splitAt(text, cuts.map((c) => c % (text.length + 1))), reason);
          expect(split.result).toEqual(whole.result);
          expect(split.streamed).toEqual(split.result);
          expect(whole.streamed).toEqual(whole.result);
          // Every reported call has a JSON-object arguments text.
          for (const call of whole.result.toolCalls) {
            const args: unknown = JSON.parse(call.arguments);
            expect(typeof args === "object" && args !== null && !Array.isArray(args)).toBe(true);
          }
        },
      ),
      { numRuns: 3000 },
    );
  });

  it("without calls or reasoning, no text is lost", () => {
    fc.assert(
      fc.property(
        fc.constantFrom(...formats),
        fc.string({ unit: fc.constantFrom("a", " ", "\n", "<", ">", "{", "}", "`", "é", "/") }),
        (toolParser, text) => {
          const r = runPieces(options({ toolParser, tools: WEATHER_TOOLS }), [text], "stop");
          expect(r.result.toolCalls).toEqual([]);
          expect(r.result.content).toBe(text);
        },
      ),
      { numRuns: 1000 },
    );
  });
});

describe("pickToolParser", () => {
  const qwen25 =
    '{%- if tools %}For each function call, return a json object with function name and arguments within ' +
    "<tool_call></tool_call> XML tags:\n<tool_call>\n" +
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>{% endif %}';
  const qwen3coder =
    "{%- if tools %}<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n" +
    "</parameter>\n</function>\n</tool_call>{% endif %}";
  const llama31 =
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}" +
    "{%- if builtin_tools %}{{- '<|python_tag|>' }}{% endif %}";
  const llama32 =
    '<|start_header_id|>user<|end_header_id|>Respond in the format {"name": function name, "parameters": dictionary}';

  it.each([
    ["qwen3coder template", qwen3coder, "qwen3coder"],
    ["Qwen2.5 template (hermes)", qwen25, "hermes3"],
    ["Llama 3.1 template", llama31, "llama3"],
    ["Llama 3.2 template without the python tag", llama32, "llama3"],
    ["a template without tools", "{% for m in messages %}{{ m.content }}{% endfor %}", null],
    ["no template", null, null],
  ] as const)("%s", (_label, template, want) => {
    expect(pickToolParser(template)).toBe(want);
  });
});

describe("promptOpensReasoning", () => {
  it.each([
    ["<|im_start|>assistant\n<think>\n", true],
    ["<|im_start|>assistant\n<think>", true],
    ["<|im_start|>assistant\n<think>\n\n</think>\n\n", false],
    ["<|im_start|>assistant\n", false],
    ["<think> is mentioned early\nassistant:", false],
  ] as const)("%j → %s", (prompt, want) => {
    expect(promptOpensReasoning(prompt)).toBe(want);
  });
});

describe("bare-call early release", () => {
  it("a JSON answer streams as soon as its first key rules out a call", () => {
    const parser = createOutputParser(options({ toolParser: "hermes3", tools: WEATHER_TOOLS }));
    expect(parser.push('{"answ')).toEqual({});
    expect(parser.push('er": 4')).toEqual({ content: '{"answer": 4' });
  });

  it("llama3: a leading call object naming a declared tool streams from its name on", () => {
    const parser = createOutputParser(options({ toolParser: "llama3", tools: WEATHER_TOOLS }));
    expect(parser.push('{"name": "get_time", "parameters": {"answer": 1')).toEqual({
      toolCalls: [{ index: 0, id: "call_0", name: "get_time" }, { index: 0, arguments: "{" }],
    });
    expect(parser.push("}}")).toEqual({ toolCalls: [{ index: 0, arguments: '"answer":1}' }] });
    expect(parser.finish("stop")).toEqual({});
  });

  it("a bare list of calls is only known at the end: header and arguments together", () => {
    const parser = createOutputParser(options({ toolParser: "llama3", tools: WEATHER_TOOLS }));
    expect(parser.push('[{"name": "get_time", "parameters": {"answer": 1}}]')).toEqual({});
    expect(parser.finish("stop").toolCalls).toEqual([
      { index: 0, id: "call_0", name: "get_time" },
      { index: 0, arguments: '{"answer":1}' },
    ]);
  });
});

describe("parallel calls one per line in a fence (Qwen2.5-Coder-0.5B's answer in llm-serving-tests)", () => {
  const two = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name": "get_time", "arguments": {"answer": 2}}\n```';
  it("hermes3: two calls, at any split", () => {
    for (const toolParser of ["hermes3"] as const) {
      fc.assert(
        fc.property(fc.array(fc.nat(), { maxLength: 6 }), (cuts) => {
          const r = runPieces(options({ toolParser, tools: WEATHER_TOOLS }), splitAt(two, cuts.map((c) => c % (two.length + 1))), "stop");
          expect(r.result.toolCalls.map((c) => [c.name, c.arguments])).toEqual([["get_weather", '{"city":"Paris"}'], ["get_time", '{"answer":2}']]);
          expect(r.result.content).toBe("");
          expect(r.streamed).toEqual(r.result);
        }),
        { numRuns: 200 },
      );
    }
  });

  it("two objects on one line are not calls: the text stays content", () => {
    const oneLine = two.replace('}}\n{"name"', '}} {"name"');
    const r = runPieces(options({ toolParser: "hermes3", tools: WEATHER_TOOLS }), [oneLine], "stop");
    expect(r.result).toEqual({ content: oneLine, reasoning: null, toolCalls: [] });
  });
});

describe("any arguments survive every format", () => {
  const args = fc.dictionary(fc.string({ maxLength: 6 }), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 4 });
  const indent = fc.constantFrom(0, 1, 2);
  const wrap = fc.constantFrom(
    (json: string) => ({ toolParser: "hermes3" as const, text: `<tool_call>\n${json}\n</tool_call>` }),
    (json: string) => ({ toolParser: "hermes3" as const, text: json }),
    (json: string) => ({ toolParser: "hermes3" as const, text: "```json\n" + json + "\n```" }),
    (json: string) => ({ toolParser: "llama3" as const, text: `<|python_tag|>${json}` }),
    (json: string) => ({ toolParser: "llama3" as const, text: json }),
    (json: string) => ({ toolParser: "qwen3coder" as const, text: `<tool_call>\n${json}\n</tool_call>` }),
  );

  it("hermes3 / llama3 / bare: the arguments object comes back as compact JSON, at any split", () => {
    fc.assert(
      fc.property(args, indent, wrap, fc.array(fc.nat(), { maxLength: 6 }), (a, sp, w, cuts) => {
        const { toolParser, text } = w(JSON.stringify({ name: "get_weather", arguments: a }, null, sp));
        const pieces = splitAt(text, cuts.map((c) => c % (text.length + 1)));
        const r = runPieces(options({ toolParser, tools: WEATHER_TOOLS }), pieces, "stop");
        expect(r.result).toEqual({
          content: "",
          reasoning: null,
          toolCalls: [{ id: "call_0", name: "get_weather", arguments: JSON.stringify(a) }],
        });
        expect(r.streamed).toEqual(r.result);
      }),
      { numRuns: 1500 },
    );
  });

  it("qwen3coder: string values come back exactly, whatever they hold", () => {
    const unit = fc.constantFrom(..."a \n</>=é".split(""), "🌎", "</parameter>", "<parameter=x>", "</function>");
    const value = fc.string({ unit });
    fc.assert(
      fc.property(value, fc.array(fc.nat(), { maxLength: 6 }), (v, cuts) => {
        // The one text the format cannot carry in a value: `</parameter>` followed by the next tag.
        fc.pre(!/<\/parameter>\s*(<parameter=|<\/function>|<\/tool_call>)/.test(v));
        const open = "<tool_call>\n<function=run_code>\n<parameter=code>\n";
        const text = `${open}${v}\n</parameter>\n</function>\n</tool_call>`;
        const pieces = splitAt(text, cuts.map((c) => c % (text.length + 1)));
        const r = runPieces(options({ toolParser: "qwen3coder", tools: WEATHER_TOOLS }), pieces, "stop");
        const want = [{ id: "call_0", name: "run_code", arguments: JSON.stringify({ code: v }) }];
        expect(r.result.toolCalls).toEqual(want);
        expect(r.streamed).toEqual(r.result);
      }),
      { numRuns: 1500 },
    );
  });
});

describe("hold-back bound", () => {
  it("plain text is held back at most one tag's length minus one", () => {
    // The longest opener any stage watches for in content is `<|python_tag|>` (14): at most 13 held.
    const maxHeld = "<|python_tag|>".length - 1;
    const unit = fc.constantFrom("a", " ", "\n", "<", "/", ">", "t", "|", "é", "<|python_ta", "<tool_ca", "<functio");
    fc.assert(
      fc.property(
        fc.constantFrom(null, "hermes3" as const, "qwen3coder" as const, "llama3" as const),
        fc.boolean(),
        fc.array(fc.string({ unit, maxLength: 8 }), { maxLength: 12 }),
        (toolParser, withReasoning, pieces) => {
          const parser = createOutputParser(
            options({ toolParser, tools: WEATHER_TOOLS, reasoningParser: withReasoning ? "qwen3" : null }),
          );
          // Why the leading "x": it rules out a bare JSON call and a reasoning block, the two other hold-backs.
          let fed = "x";
          let emitted = parser.push("x").content ?? "";
          for (const p of pieces) {
            fed += p;
            emitted += parser.push(p).content ?? "";
            expect(fed.startsWith(emitted)).toBe(true);
            expect(fed.length - emitted.length).toBeLessThanOrEqual(maxHeld);
          }
        },
      ),
      { numRuns: 1000 },
    );
  });
});
