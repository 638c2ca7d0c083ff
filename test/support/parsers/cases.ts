/**
 * Recorded-style outputs for the parser tests: what models in each format write (text + call, parallel calls,
 * calls after reasoning, reasoning only, truncation, malformed markup, small-model bare calls, look-alike tags,
 * multibyte text), each with the answer the format's rules give — written from the rules, not from a run.
 *
 * @module
 */
import type { ToolSpec } from "../../../src/gateway/tools.js";
import type { OutputParserOptions } from "../../../src/gateway/parsers/types.js";

export const WEATHER_TOOLS: ToolSpec[] = [
  {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string" },
        days: { type: "integer" },
        metric: { type: "boolean" },
        note: { type: ["string", "null"] },
      },
      required: ["city"],
    },
  },
  { name: "get_time", parameters: { type: "object", properties: { tz: { type: "string" } } } },
  { name: "run_code", parameters: { type: "object", properties: { code: { type: "string" } } } },
  { name: "list_files", parameters: { type: "object", properties: {} } },
];

export interface ParserCase {
  name: string;
  opts: Partial<OutputParserOptions>;
  text: string;
  reason?: "stop" | "length";
  content: string;
  reasoning?: string;
  /** Expected calls: name and exact arguments text. */
  calls?: { name: string; arguments: string }[];
}

const hermes = { toolParser: "hermes3", tools: WEATHER_TOOLS } as const;
const coder = { toolParser: "qwen3coder", tools: WEATHER_TOOLS } as const;
const llama = { toolParser: "llama3", tools: WEATHER_TOOLS } as const;
const think = { reasoningParser: "qwen3" } as const;

const hermesParis = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
const coderParis =
  "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n" +
  "<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>";

export const CASES: ParserCase[] = [
  // ---- hermes3 ----
  {
    // A guided call may write the closing tag inside a JSON string (the grammar allows any text there).
    name: "hermes3: </tool_call> inside an argument string is text of the string",
    opts: hermes,
    text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a</tool_call>b"}}\n</tool_call> done',
    content: " done",
    calls: [{ name: "get_weather", arguments: '{"city":"a</tool_call>b"}' }],
  },
  {
    name: "hermes3: text then a call",
    opts: hermes,
    text: `Let me check.\n${hermesParis}`,
    content: "Let me check.\n",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "hermes3: parallel calls, whitespace between them dropped",
    opts: hermes,
    text: `${hermesParis}\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>\n`,
    content: "",
    calls: [
      { name: "get_weather", arguments: '{"city":"Paris"}' },
      { name: "get_time", arguments: '{"tz":"Europe/Paris"}' },
    ],
  },
  {
    name: "hermes3: text after the call is kept",
    opts: hermes,
    text: `${hermesParis}\nI asked for the weather.`,
    content: "\nI asked for the weather.",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "hermes3: only the text after the last call is content, not the gap between calls",
    opts: hermes,
    text: `${hermesParis}\n\n${hermesParis}\nDone.`,
    content: "\nDone.",
    calls: [
      { name: "get_weather", arguments: '{"city":"Paris"}' },
      { name: "get_weather", arguments: '{"city":"Paris"}' },
    ],
  },
  {
    name: "hermes3: call after explicit reasoning",
    opts: { ...hermes, ...think },
    text: `<think>\nThe user wants the weather in Paris.\n</think>\n\n${hermesParis}`,
    reasoning: "\nThe user wants the weather in Paris.\n",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "hermes3: call after reasoning the prompt opened",
    opts: { ...hermes, ...think, reasoningOpen: true },
    text: `I need the weather tool.\n</think>\n\n${hermesParis}`,
    reasoning: "I need the weather tool.\n",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "qwen3: reasoning only, cut by length, with <tool_call> inside it",
    opts: { ...hermes, ...think, reasoningOpen: true },
    text: "Should I emit <tool_call> now? The city is Par",
    reason: "length",
    reasoning: "Should I emit <tool_call> now? The city is Par",
    content: "",
  },
  {
    name: "qwen3: <tool_call> inside reasoning stays reasoning",
    opts: { ...hermes, ...think },
    text: `<think>Maybe ${hermesParis}? No, I know it.</think>It is sunny in Paris.`,
    reasoning: `Maybe ${hermesParis}? No, I know it.`,
    content: "It is sunny in Paris.",
  },
  {
    name: "qwen3: a model repeating the <think> the prompt opened",
    opts: { ...think, reasoningOpen: true },
    text: "\n<think>\nHmm.\n</think>\n\nHello.",
    reasoning: "\nHmm.\n",
    content: "\n\nHello.",
  },
  {
    name: "qwen3: explicit reasoning never closed (cut) is reasoning",
    opts: { ...think },
    text: "<think>\nFirst, recall </thin",
    reason: "length",
    reasoning: "\nFirst, recall </thin",
    content: "",
  },
  {
    name: "qwen3: thinking switched off, plain content",
    opts: { ...hermes, ...think, reasoningOpen: false },
    text: "Paris is the capital of France.",
    content: "Paris is the capital of France.",
  },
  {
    name: "qwen3: a later <think> is content",
    opts: { ...think },
    text: "Use the <think> tag like this: <think>x</think>",
    content: "Use the <think> tag like this: <think>x</think>",
  },
  {
    // Announced at its name, the call stays a call: arguments as produced so far, closed (finish_reason length).
    name: "hermes3: call cut by max_tokens after its name stays a call",
    opts: hermes,
    text: 'Sure.\n<tool_call>\n{"name": "get_weather", "argum',
    reason: "length",
    content: "Sure.\n",
    calls: [{ name: "get_weather", arguments: "{}" }],
  },
  {
    name: "hermes3: call cut by max_tokens mid-string keeps the string so far",
    opts: hermes,
    text: '<tool_call>\n{"name": "run_code", "arguments": {"code": "print(\\"hi\\")\\nfor i in ra',
    reason: "length",
    content: "",
    calls: [{ name: "run_code", arguments: JSON.stringify({ code: 'print("hi")\nfor i in ra' }) }],
  },
  {
    name: "hermes3: call cut by max_tokens before its name is content",
    opts: hermes,
    text: 'Sure.\n<tool_call>\n{"name": "get_wea',
    reason: "length",
    content: 'Sure.\n<tool_call>\n{"name": "get_wea',
  },
  {
    name: "hermes3: complete body without </tool_call>, model stopped",
    opts: hermes,
    text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n',
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Oslo"}' }],
  },
  {
    name: "hermes3: complete body without </tool_call>, cut by length",
    opts: hermes,
    text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n',
    reason: "length",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Oslo"}' }],
  },
  {
    // After its name the call exists; where the JSON breaks, the call ends and the rest of the tag is content.
    name: "hermes3: JSON broken after the name: the call ends there, the rest is content",
    opts: hermes,
    text: 'OK <tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call> done',
    content: "OK Paris}}\n done",
    calls: [{ name: "get_weather", arguments: "{}" }],
  },
  {
    name: "hermes3: a body that is not JSON stays as raw content",
    opts: hermes,
    text: "OK <tool_call>\nget_weather(city='Paris')\n</tool_call> done",
    content: "OK <tool_call>\nget_weather(city='Paris')\n</tool_call> done",
  },
  {
    name: "hermes3: bare JSON call (Qwen2.5-Coder-0.5B)",
    opts: hermes,
    text: '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "hermes3: fenced JSON call (Qwen2.5-Coder-1.5B)",
    opts: hermes,
    text: '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```\n',
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "hermes3: bare list of calls, 'parameters' alias",
    opts: hermes,
    text:
      '[{"name": "get_weather", "parameters": {"city": "Paris"}}, ' +
      '{"name": "get_time", "arguments": {"tz": "UTC"}}]',
    content: "",
    calls: [
      { name: "get_weather", arguments: '{"city":"Paris"}' },
      { name: "get_time", arguments: '{"tz":"UTC"}' },
    ],
  },
  {
    name: "hermes3: bare call in OpenAI's wrapper shape, arguments as a JSON text",
    opts: hermes,
    text: '{"type": "function", "function": {"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}}',
    content: "",
    calls: [{ name: "get_time", arguments: '{"tz":"UTC"}' }],
  },
  {
    name: "hermes3: bare JSON naming an undeclared tool is content",
    opts: hermes,
    text: '{"name": "search_web", "arguments": {"q": "Paris"}}',
    content: '{"name": "search_web", "arguments": {"q": "Paris"}}',
  },
  {
    name: "hermes3: a JSON answer is content",
    opts: hermes,
    text: '{"city": "Paris", "temperature": 21}',
    content: '{"city": "Paris", "temperature": 21}',
  },
  {
    // A leading object naming a declared tool streams as a call from its name on; text after it is content.
    name: "hermes3: bare call followed by prose is a call, the prose content",
    opts: hermes,
    text: '{"name": "get_weather", "arguments": {"city": "Paris"}}\nThis will fetch the weather.',
    content: "\nThis will fetch the weather.",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "hermes3: bare calls separated by ;",
    opts: hermes,
    text: '{"name": "get_weather", "arguments": {"city": "Paris"}}; {"name": "get_time", "arguments": {}}',
    content: "",
    calls: [
      { name: "get_weather", arguments: '{"city":"Paris"}' },
      { name: "get_time", arguments: "{}" },
    ],
  },
  {
    name: "hermes3: a bare object cut before its name is content",
    opts: hermes,
    text: '{"name": "get_wea',
    reason: "length",
    content: '{"name": "get_wea',
  },
  {
    name: "hermes3: released bare candidate still finds a later tagged call",
    opts: hermes,
    text: `{"plan": 1}\n${hermesParis}`,
    content: '{"plan": 1}\n',
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "hermes3: #include <functional> in a code fence is not a call",
    opts: hermes,
    text: "```cpp\n#include <functional>\nstd::function<int()> f;\n```",
    content: "```cpp\n#include <functional>\nstd::function<int()> f;\n```",
  },
  {
    name: "hermes3: multibyte text and arguments",
    opts: hermes,
    text:
      "Il fait beau à Zürich 🌤️ — <tool_call>\n" +
      '{"name": "get_weather", "arguments": {"city": "Zürich 🇨🇭"}}\n</tool_call>',
    content: "Il fait beau à Zürich 🌤️ — ",
    calls: [{ name: "get_weather", arguments: '{"city":"Zürich 🇨🇭"}' }],
  },
  {
    name: "hermes3: whitespace-only output without calls is kept",
    opts: hermes,
    text: " \n",
    content: " \n",
  },
  {
    name: "no tool parser: tags are plain content",
    opts: { toolParser: null, tools: WEATHER_TOOLS },
    text: `Hi ${hermesParis}`,
    content: `Hi ${hermesParis}`,
  },
  // ---- qwen3coder ----
  {
    name: "qwen3coder: text then a call, values typed by schema",
    opts: coder,
    text: `I'll check.\n${coderParis}`,
    content: "I'll check.\n",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris","days":3,"metric":true}' }],
  },
  {
    name: "qwen3coder: parallel calls, a bare <function= and zero parameters",
    opts: coder,
    text: `${coderParis}\n<function=list_files>\n</function>\n`,
    content: "",
    calls: [
      { name: "get_weather", arguments: '{"city":"Paris","days":3,"metric":true}' },
      { name: "list_files", arguments: "{}" },
    ],
  },
  {
    name: "qwen3coder: </parameter> mid-line inside a value stays in the value",
    opts: coder,
    text:
      '<tool_call>\n<function=run_code>\n<parameter=code>\nprint("</parameter>")\nx = "<parameter=y>"\n' +
      "</parameter>\n</function>\n</tool_call>",
    content: "",
    calls: [{ name: "run_code", arguments: JSON.stringify({ code: 'print("</parameter>")\nx = "<parameter=y>"' }) }],
  },
  {
    name: "qwen3coder: </parameter> without newline ends the value (OVMS)",
    opts: coder,
    text: "<function=get_weather><parameter=city>Paris</parameter><parameter=days>2</parameter></function>",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris","days":2}' }],
  },
  {
    name: "qwen3coder: duplicate parameter (first wins), unknown parameters JSON-or-string, string stays string",
    opts: coder,
    text:
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n" +
      "<parameter=city>\nMilan\n</parameter>\n" +
      '<parameter=extra>\n{"a": [1, 2]}\n</parameter>\n<parameter=other>\nhello\n</parameter>\n' +
      "<parameter=days>\nthree\n</parameter>\n<parameter=note>\nNone\n</parameter>\n</function>\n</tool_call>",
    content: "",
    calls: [
      {
        name: "get_weather",
        arguments: '{"city":"42","extra":{"a":[1,2]},"other":"hello","days":"three","note":"None"}',
      },
    ],
  },
  {
    name: "qwen3coder: empty value and multi-line value keep inner newlines",
    opts: coder,
    text: "<function=run_code>\n<parameter=code>\n\nline1\nline2\n\n</parameter>\n</function>",
    content: "",
    calls: [{ name: "run_code", arguments: JSON.stringify({ code: "\nline1\nline2\n" }) }],
  },
  {
    name: "qwen3coder: an undeclared function is still a call, values JSON-or-string",
    opts: coder,
    text:
      "<function=search>\n<parameter=q>\nParis weather\n</parameter>\n" +
      "<parameter=limit>\n5\n</parameter>\n</function>",
    content: "",
    calls: [{ name: "search", arguments: '{"q":"Paris weather","limit":5}' }],
  },
  {
    name: "qwen3coder: text after a complete call survives a length cut",
    opts: coder,
    text: `${coderParis}\nNow I will`,
    reason: "length",
    content: "\nNow I will",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris","days":3,"metric":true}' }],
  },
  {
    name: "qwen3coder: empty values",
    opts: coder,
    text: "<function=get_weather>\n<parameter=city>\n</parameter>\n<parameter=note>\n\n</parameter>\n</function>",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"","note":""}' }],
  },
  {
    name: "qwen3coder: call after implicit reasoning",
    opts: { ...coder, ...think, reasoningOpen: true },
    text: `The user wants weather; <function= is the syntax.\n</think>\n\n${coderParis}`,
    reasoning: "The user wants weather; <function= is the syntax.\n",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris","days":3,"metric":true}' }],
  },
  {
    name: "qwen3coder: call cut by max_tokens mid-value keeps the value so far",
    opts: coder,
    text: "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    reason: "length",
    content: "Checking.\n",
    calls: [{ name: "get_weather", arguments: '{"city":"Par"}' }],
  },
  {
    name: "qwen3coder: call cut by max_tokens before its first parameter is content",
    opts: coder,
    text: "Checking.\n<tool_call>\n<function=get_weather>\n<param",
    reason: "length",
    content: "Checking.\n<tool_call>\n<function=get_weather>\n<param",
  },
  {
    name: "qwen3coder: #include <functional> is not a call",
    opts: coder,
    text: "Use:\n```cpp\n#include <functional>\nstd::function<int()> f;\n```",
    content: "Use:\n```cpp\n#include <functional>\nstd::function<int()> f;\n```",
  },
  {
    name: "qwen3coder: multibyte values",
    opts: coder,
    text:
      "Voilà 🌎\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo 🌎\n</parameter>\n" +
      "</function>\n</tool_call>",
    content: "Voilà 🌎\n",
    calls: [{ name: "get_weather", arguments: '{"city":"São Paulo 🌎"}' }],
  },
  {
    name: "qwen3coder: markup that does not fit stays raw",
    opts: coder,
    text: "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call> ok",
    content: "<tool_call>\n<function=get_weather>\nParis\n</function>\n</tool_call> ok",
  },
  {
    name: "qwen3coder: hermes JSON inside <tool_call> is a call",
    opts: coder,
    text: hermesParis,
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "qwen3coder: </tool_call> closes an unclosed function, text after kept",
    opts: coder,
    text: "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</tool_call>\nDone.",
    content: "\nDone.",
    calls: [{ name: "get_time", arguments: '{"tz":"UTC"}' }],
  },
  // ---- llama3 ----
  {
    name: "llama3: python tag and one call",
    opts: llama,
    text: '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "llama3: text, tag, two calls separated by ;",
    opts: llama,
    text:
      'Checking both.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; ' +
      '{"name": "get_time", "arguments": {"tz": "CET"}}',
    content: "Checking both.",
    calls: [
      { name: "get_weather", arguments: '{"city":"Paris"}' },
      { name: "get_time", arguments: '{"tz":"CET"}' },
    ],
  },
  {
    name: "llama3: leading { whole-output call",
    opts: llama,
    text: '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Paris"}' }],
  },
  {
    name: "llama3: python tag before code is content",
    opts: llama,
    text: "<|python_tag|>print(1 + 1)",
    content: "<|python_tag|>print(1 + 1)",
  },
  {
    name: "llama3: call cut by max_tokens after its name stays a call",
    opts: llama,
    text: '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Par',
    reason: "length",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Par"}' }],
  },
  {
    name: "llama3: call cut by max_tokens before its name is content",
    opts: llama,
    text: '<|python_tag|>{"name": "get_wea',
    reason: "length",
    content: '<|python_tag|>{"name": "get_wea',
  },
  {
    name: "llama3: broken JSON after a call is content",
    opts: llama,
    text: '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": oops}',
    content: '{"name": oops}',
    calls: [{ name: "get_time", arguments: "{}" }],
  },
];
