/**
 * The generation session with an output parser (issue #9), using a FAKE parser so the session's part is tested on
 * its own: stop strings run before the parser, the parser's deltas become `reasoning` / `toolCalls` / `content`,
 * a choice that stopped after a call finishes `tool_calls` (`length` wins), and the unary result is the parser's.
 */
import { describe, expect, it } from "vitest";
import type { OutputParser, ParsedDelta, ParsedOutput, ToolCallDelta } from "../../parsers/types.js";
import { GenerationSession } from "./session.js";
import type { SessionEvent } from "./events.js";

/**
 * A toy format: text before `|` is reasoning; `@name(args)` is a tool call (held back until `)`); the rest is
 * content. A call left open at the end becomes content (as the real parsers report a cut call).
 */
class FakeParser implements OutputParser {
  /** Text not yet decided (an open call). */
  #pending = "";
  #inReasoning = true;
  readonly #out: ParsedOutput = { content: "", reasoning: null, toolCalls: [] };
  /** Every text the session pushed, to check what the parser saw. */
  readonly seen: string[] = [];
  finished: "stop" | "length" | null = null;

  push(text: string): ParsedDelta {
    this.seen.push(text);
    this.#pending += text;
    const d: ParsedDelta = {};
    const calls: ToolCallDelta[] = [];
    for (;;) {
      if (this.#inReasoning) {
        const bar = this.#pending.indexOf("|");
        const part = bar < 0 ? this.#pending : this.#pending.slice(0, bar);
        if (part) {
          d.reasoning = (d.reasoning ?? "") + part;
          this.#out.reasoning = (this.#out.reasoning ?? "") + part;
        }
        if (bar < 0) {
          this.#pending = "";
          break;
        }
        this.#pending = this.#pending.slice(bar + 1);
        this.#inReasoning = false;
        continue;
      }
      const at = this.#pending.indexOf("@");
      const before = at < 0 ? this.#pending : this.#pending.slice(0, at);
      if (before) {
        d.content = (d.content ?? "") + before;
        this.#out.content += before;
      }
      if (at < 0) {
        this.#pending = "";
        break;
      }
      this.#pending = this.#pending.slice(at);
      const m = /^@(\w+)\((.*?)\)/.exec(this.#pending);
      if (!m) break;
      const index = this.#out.toolCalls.length;
      this.#out.toolCalls.push({ id: `call_${index}`, name: m[1]!, arguments: m[2]! });
      calls.push({ index, id: `call_${index}`, name: m[1]! }, { index, arguments: m[2]! });
      this.#pending = this.#pending.slice(m[0].length);
    }
    if (calls.length > 0) d.toolCalls = calls;
    return d;
  }

  finish(reason: "stop" | "length"): ParsedDelta {
    this.finished = reason;
    const rest = this.#pending;
    this.#pending = "";
    this.#out.content += rest;
    return rest ? { content: rest } : {};
  }

  result(): ParsedOutput {
    return this.#out;
  }
}

function withParser(stop: string[] = []) {
  const parsers: FakeParser[] = [];
  const s = new GenerationSession({
    childIds: ["r"],
    stop,
    includeStopStr: false,
    logprobs: false,
    parser: () => {
      const p = new FakeParser();
      parsers.push(p);
      return p;
    },
  });
  s.admitted("r", 4);
  return { s, parser: () => parsers[0]! };
}

type Delta = Extract<SessionEvent, { type: "delta" }>;
const deltas = (events: SessionEvent[]): Delta[] => events.filter((e): e is Delta => e.type === "delta");
const finished = (events: SessionEvent[]) => events.find((e): e is Extract<SessionEvent, { type: "finished" }> => e.type === "finished")!;

describe("GenerationSession with an output parser", () => {
  it("emits reasoning, content and tool-call fragments; a stop after a call finishes 'tool_calls'; unary = the parser's result", () => {
    const { s } = withParser();
    const events = [
      ...s.output("r", [1], "thin").events,
      ...s.output("r", [2], "k|Hi @get_we").events,
      ...s.output("r", [3], "ather({\"city\":\"P\"}) ok").events,
      ...s.finish("r", "stop", { promptTokens: 4, completionTokens: 3 }).events,
    ];
    const ds = deltas(events);
    expect(ds.map((d) => d.reasoning ?? "").join("")).toBe("think");
    expect(ds.map((d) => d.content).join("")).toBe("Hi  ok");
    expect(ds.flatMap((d) => d.toolCalls ?? [])).toEqual([
      { index: 0, id: "call_0", name: "get_weather" },
      { index: 0, arguments: '{"city":"P"}' },
    ]);
    expect(events.filter((e) => e.type === "choice_finished")).toEqual([{ type: "choice_finished", index: 0, reason: "tool_calls" }]);
    expect(finished(events).choices[0]).toMatchObject({
      text: "Hi  ok",
      reasoning: "think",
      toolCalls: [{ id: "call_0", name: "get_weather", arguments: '{"city":"P"}' }],
      reason: "tool_calls",
    });
  });

  it("'length' wins over tool calls, and the parser is told the generation was cut", () => {
    const { s, parser } = withParser();
    s.output("r", [1], "|@f(1) @g(");
    const end = s.finish("r", "length", { promptTokens: 4, completionTokens: 9 });
    expect(parser().finished).toBe("length");
    expect(end.events.filter((e) => e.type === "choice_finished")).toEqual([{ type: "choice_finished", index: 0, reason: "length" }]);
    // The open call is reported as content by the parser; the session passes it on.
    expect(finished(end.events).choices[0]).toMatchObject({ reason: "length", text: " @g(", toolCalls: [{ name: "f" }] });
  });

  it("a stop without calls stays 'stop'", () => {
    const { s } = withParser();
    s.output("r", [1], "r|plain");
    const end = s.finish("r", "stop", { promptTokens: 4, completionTokens: 1 });
    expect(finished(end.events).choices[0]).toMatchObject({ reason: "stop", text: "plain", reasoning: "r", toolCalls: [] });
  });

  it("stop strings run first: the parser never sees the stop string or what follows, and is finished at the match", () => {
    const { s, parser } = withParser(["END"]);
    const a = s.output("r", [1], "|@f(1) E");
    const b = s.output("r", [2], "ND @g(2)");
    expect(b.abort).toEqual(["r"]);
    expect(parser().seen.join("")).toBe("|@f(1) ");
    expect(parser().finished).toBe("stop");
    const events = [...a.events, ...b.events];
    expect(events.filter((e) => e.type === "choice_finished")).toEqual([{ type: "choice_finished", index: 0, reason: "tool_calls" }]);
    expect(finished(events).choices[0]).toMatchObject({ toolCalls: [{ name: "f", arguments: "1" }], text: " " });
  });

  it("held-back text produces no empty delta", () => {
    const { s } = withParser();
    s.output("r", [1], "|");
    expect(deltas(s.output("r", [2], "@open(").events)).toEqual([]);
  });

  it("without a parser the result has no reasoning and no calls, and 'stop' stays 'stop'", () => {
    const s = new GenerationSession({ childIds: ["r"], stop: [], includeStopStr: false, logprobs: false });
    s.admitted("r", 1);
    s.output("r", [1], "@f(1)");
    const end = s.finish("r", "stop", { promptTokens: 1, completionTokens: 1 });
    expect(finished(end.events).choices[0]).toMatchObject({ text: "@f(1)", reasoning: null, toolCalls: [], reason: "stop" });
  });
});

describe("GenerationSession with the real parsers (qwen3 reasoning + hermes3 / qwen3coder calls)", () => {
  const tools = [{ name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } }];
  const outputs = {
    hermes3: '<think>need weather</think>\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    qwen3coder: "<think>need weather</think>\nLet me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
  } as const;

  for (const format of ["hermes3", "qwen3coder"] as const) {
    it(`${format}: any split of the output streams to deltas that concatenate to the unary answer; finish tool_calls`, async () => {
      const { createOutputParser } = await import("../../parsers/index.js");
      const whole = outputs[format];
      let n = 0;
      const run = (cuts: number[]) => {
        const s = new GenerationSession({
          childIds: ["r"],
          stop: [],
          includeStopStr: false,
          logprobs: false,
          parser: () => createOutputParser({ toolParser: format, tools, reasoningParser: "qwen3", reasoningOpen: false, newId: () => `call_${n++}` }),
        });
        s.admitted("r", 3);
        const events: SessionEvent[] = [];
        let at = 0;
        for (const cut of [...cuts, whole.length]) {
          events.push(...s.output("r", [1], whole.slice(at, cut)).events);
          at = cut;
        }
        events.push(...s.finish("r", "stop", { promptTokens: 3, completionTokens: cuts.length + 1 }).events);
        return events;
      };
      // Every single cut, and every character on its own.
      const splits = [...Array.from({ length: whole.length - 1 }, (_, i) => [i + 1]), Array.from({ length: whole.length - 1 }, (_, i) => i + 1)];
      for (const cuts of splits) {
        const events = run(cuts);
        const ds = deltas(events);
        const result = finished(events).choices[0]!;
        expect(result.reason).toBe("tool_calls");
        expect(result.reasoning).toBe("need weather");
        expect(result.toolCalls.map((c) => ({ name: c.name, args: JSON.parse(c.arguments) }))).toEqual([{ name: "get_weather", args: { city: "Paris" } }]);
        expect(ds.map((d) => d.content).join("")).toBe(result.text);
        expect(result.text).toContain("Let me check.");
        expect(ds.map((d) => d.reasoning ?? "").join("")).toBe(result.reasoning);
        const frags = ds.flatMap((d) => d.toolCalls ?? []);
        expect(frags.map((f) => f.arguments ?? "").join("")).toBe(result.toolCalls[0]!.arguments);
        expect(frags[0]).toMatchObject({ index: 0, id: result.toolCalls[0]!.id, name: "get_weather" });
      }
    });
  }
});
