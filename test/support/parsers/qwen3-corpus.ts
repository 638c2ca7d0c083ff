/**
 * What real Qwen3.x models (Qwen3, Qwen3-Coder, Qwen3.5/3.6) are reported to emit around tool calls, written in
 * the shape of public reports against other servers (vLLM, llama.cpp, SGLang, Ollama, LM Studio): a call made
 * from an unterminated `<think>` (llama.cpp #24202, vLLM #42021), call drafts inside a closed `<think>`
 * (PrimeIntellect renderers #80), the format echoed from the prompt, a missing `<tool_call>` opener with an orphan
 * `</tool_call>` (Ollama #16686, #17353, #18530), missing `</parameter>` (vLLM #23099), malformed `<parameter=`
 * (vLLM #39771), values holding `</parameter>`, HTML or XML (AReaL #1458, Ollama #18563), several calls in one
 * turn, text after a call. The texts are our own; each has the answer this server's rules give (docs/agents.md).
 *
 * @module
 */
import type { ParserCase } from "./cases.js";
import { WEATHER_TOOLS } from "./cases.js";
import type { ToolSpec } from "../../../src/gateway/tools.js";

/** An agent's file tools (what coding agents give Qwen3-Coder). */
export const FILE_TOOLS: ToolSpec[] = [
  ...WEATHER_TOOLS,
  {
    name: "write_file",
    parameters: {
      type: "object",
      properties: { path: { type: "string" }, content: { type: "string" }, overwrite: { type: "boolean" } },
      required: ["path", "content"],
    },
  },
  { name: "glob", parameters: { type: "object", properties: { pattern: { type: "string" } } } },
];

const coder = { toolParser: "qwen3coder", tools: FILE_TOOLS } as const;
const hermes = { toolParser: "hermes3", tools: FILE_TOOLS } as const;
const thinking = { reasoningParser: "qwen3", reasoningOpen: true } as const;

const html = '<!doctype html>\n<html>\n<body>\n  <p class="x">Hi &amp; bye</p>\n</body>\n</html>';
const writeHtml =
  "<tool_call>\n<function=write_file>\n<parameter=path>\nindex.html\n</parameter>\n" +
  `<parameter=content>\n${html}\n</parameter>\n</function>\n</tool_call>`;

export const QWEN3_CORPUS: ParserCase[] = [
  {
    name: "qwen3.5: call from an unterminated <think> (template opened it): reasoning ends at <tool_call>",
    opts: { ...coder, ...thinking },
    text: "The user wants the markdown files. I'll glob.\n\n<tool_call>\n<function=glob>\n<parameter=pattern>\n*.md\n</parameter>\n</function>\n</tool_call>",
    reasoning: "The user wants the markdown files. I'll glob.\n\n",
    content: "",
    calls: [{ name: "glob", arguments: '{"pattern":"*.md"}' }],
  },
  {
    name: "qwen3 hermes: explicit <think> never closed, then a call",
    opts: { ...hermes, reasoningParser: "qwen3" },
    text: '<think>\nI should check Oslo.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    reasoning: "\nI should check Oslo.\n",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Oslo"}' }],
  },
  {
    name: "qwen3: a draft call inside a closed <think> stays reasoning, the real call after it counts once",
    opts: { ...hermes, reasoningParser: "qwen3" },
    text:
      '<think>Draft: <tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call> — no, Paris.</think>\n\n' +
      '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>',
    reasoning: 'Draft: <tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call> — no, Paris.',
    content: "",
    calls: [{ name: "get_time", arguments: '{"tz":"Europe/Paris"}' }],
  },
  {
    name: "qwen3: unterminated <think> mentioning <tool_call> without a call stays reasoning",
    opts: { ...hermes, ...thinking },
    text: "Should I use <tool_call> here? The weather in Par",
    reason: "length",
    reasoning: "Should I use <tool_call> here? The weather in Par",
    content: "",
  },
  {
    name: "qwen3-coder: the format echoed from the prompt inside a code fence is content",
    opts: coder,
    text:
      "Calls look like this:\n```\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n" +
      "value_1\n</parameter>\n</function>\n</tool_call>\n```\nShall I run one?",
    content:
      "Calls look like this:\n```\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n" +
      "value_1\n</parameter>\n</function>\n</tool_call>\n```\nShall I run one?",
  },
  {
    name: "qwen3 hermes: the format echoed in a fence, then a real call",
    opts: hermes,
    text:
      'Format:\n```xml\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n```\n' +
      '<tool_call>\n{"name": "glob", "arguments": {"pattern": "src/**"}}\n</tool_call>',
    content: 'Format:\n```xml\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n```\n',
    calls: [{ name: "glob", arguments: '{"pattern":"src/**"}' }],
  },
  {
    name: "qwen3-coder: opener missing after a preamble, orphan </tool_call> dropped",
    opts: coder,
    text: "I'll use the Glob tool.\n\n<function=glob>\n<parameter=pattern>\n*.md\n</parameter>\n</function>\n</tool_call>",
    content: "I'll use the Glob tool.\n\n",
    calls: [{ name: "glob", arguments: '{"pattern":"*.md"}' }],
  },
  {
    name: "qwen3-coder: </tool_call> twice",
    opts: coder,
    text: "<tool_call>\n<function=glob>\n<parameter=pattern>\n*\n</parameter>\n</function>\n</tool_call>\n</tool_call>\nDone.",
    content: "\nDone.",
    calls: [{ name: "glob", arguments: '{"pattern":"*"}' }],
  },
  {
    name: "qwen3 hermes: </tool_call> twice",
    opts: hermes,
    text: '<tool_call>\n{"name": "glob", "arguments": {"pattern": "*"}}\n</tool_call></tool_call>\nDone.',
    content: "\nDone.",
    calls: [{ name: "glob", arguments: '{"pattern":"*"}' }],
  },
  {
    name: "qwen3-coder: missing </function>",
    opts: coder,
    text: "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</tool_call>",
    content: "",
    calls: [{ name: "get_time", arguments: '{"tz":"UTC"}' }],
  },
  {
    name: "qwen3-coder: missing </parameter> before the next declared parameter",
    opts: coder,
    text:
      "<tool_call>\n<function=write_file>\n<parameter=path>\nnotes.txt\n<parameter=content>\nhello\n</parameter>\n" +
      "</function>\n</tool_call>",
    content: "",
    calls: [{ name: "write_file", arguments: '{"path":"notes.txt","content":"hello"}' }],
  },
  {
    name: "qwen3-coder: missing </parameter> before </function></tool_call>",
    opts: coder,
    text: "<tool_call>\n<function=glob>\n<parameter=pattern>\n**/*.ts\n</function>\n</tool_call>",
    content: "",
    calls: [{ name: "glob", arguments: '{"pattern":"**/*.ts"}' }],
  },
  {
    name: "qwen3-coder: missing </function> and </tool_call> at the end of the output",
    opts: coder,
    text: "<tool_call>\n<function=glob>\n<parameter=pattern>\n*.md\n</parameter>\n",
    content: "",
    calls: [{ name: "glob", arguments: '{"pattern":"*.md"}' }],
  },
  {
    name: "qwen3-coder: <parameter= without '>' after the call began: the call ends, the rest is content",
    opts: coder,
    text: "<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content\nhi\n</function>\n</tool_call>",
    content: "<parameter=content\nhi\n</function>\n</tool_call>",
    calls: [{ name: "write_file", arguments: '{"path":"a.txt"}' }],
  },
  {
    name: "qwen3-coder: an HTML file written in one call (long string, tags inside)",
    opts: coder,
    text: `Writing it.\n${writeHtml}`,
    content: "Writing it.\n",
    calls: [{ name: "write_file", arguments: JSON.stringify({ path: "index.html", content: html }) }],
  },
  {
    name: "qwen3-coder: a value holding </parameter> and <parameter= (parser source) stays whole",
    opts: coder,
    text:
      "<tool_call>\n<function=write_file>\n<parameter=path>\nt.py\n</parameter>\n<parameter=content>\n" +
      'END = "</parameter>"\nSTART = "<parameter=x>"\nassert END in s\n</parameter>\n</function>\n</tool_call>',
    content: "",
    calls: [
      {
        name: "write_file",
        arguments: JSON.stringify({ path: "t.py", content: 'END = "</parameter>"\nSTART = "<parameter=x>"\nassert END in s' }),
      },
    ],
  },
  {
    name: "qwen3-coder: an XML value with </function> and </tool_call> inside",
    opts: coder,
    text:
      "<tool_call>\n<function=write_file>\n<parameter=path>\nf.xml\n</parameter>\n<parameter=content>\n" +
      "<a></function></tool_call></a>\n</parameter>\n<parameter=overwrite>\ntrue\n</parameter>\n</function>\n</tool_call>",
    content: "",
    calls: [
      { name: "write_file", arguments: JSON.stringify({ path: "f.xml", content: "<a></function></tool_call></a>", overwrite: true }) },
    ],
  },
  {
    name: "qwen3 hermes: a code argument holding </tool_call> and a raw line break (lenient)",
    opts: hermes,
    text: '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.md", "content": "x </tool_call>\ny"}}\n</tool_call>',
    content: "",
    calls: [{ name: "write_file", arguments: JSON.stringify({ path: "a.md", content: "x </tool_call>\ny" }) }],
  },
  {
    name: "qwen3-coder: three calls in one turn, text between and after",
    opts: coder,
    text:
      "<tool_call>\n<function=glob>\n<parameter=pattern>\na\n</parameter>\n</function>\n</tool_call>\n" +
      "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\nand\n" +
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\nAll three sent.",
    content: "\nand\n\nAll three sent.",
    calls: [
      { name: "glob", arguments: '{"pattern":"a"}' },
      { name: "get_time", arguments: "{}" },
      { name: "get_weather", arguments: '{"city":"Rome","days":2}' },
    ],
  },
  {
    name: "qwen3 hermes: two call objects in one tag (comma-separated), then text",
    opts: hermes,
    text:
      '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}},\n{"name": "glob", "arguments": {"pattern": "*"}}\n</tool_call>\nBoth.',
    content: "\nBoth.",
    calls: [
      { name: "get_time", arguments: '{"tz":"UTC"}' },
      { name: "glob", arguments: '{"pattern":"*"}' },
    ],
  },
  {
    name: "qwen3 hermes: </tool_call> missing before the next <tool_call>",
    opts: hermes,
    text: '<tool_call>\n{"name": "get_time", "arguments": {}}\n<tool_call>\n{"name": "glob", "arguments": {"pattern": "*"}}\n</tool_call>',
    content: "",
    calls: [
      { name: "get_time", arguments: "{}" },
      { name: "glob", arguments: '{"pattern":"*"}' },
    ],
  },
  {
    name: "qwen3 hermes: arguments before name, 'parameters' alias, nested values normalised",
    opts: hermes,
    text: '<tool_call>\n{"parameters": {"city": "K\\u00f6ln", "days": 1.0e1, "x": [true, null, {"y": "\\/"}]}, "name": "get_weather"}\n</tool_call>',
    content: "",
    calls: [{ name: "get_weather", arguments: JSON.stringify({ city: "Köln", days: 10, x: [true, null, { y: "/" }] }) }],
  },
  {
    name: "qwen3 hermes: a cut call (max_tokens) in a long string keeps what was written",
    opts: hermes,
    text: `<tool_call>\n{"name": "write_file", "arguments": {"path": "i.html", "content": ${JSON.stringify(html).slice(0, 40)}`,
    reason: "length",
    content: "",
    calls: [{ name: "write_file", arguments: `{"path":"i.html","content":${JSON.stringify(html).slice(0, 40)}"}` }],
  },
  {
    name: "qwen3-coder: a cut call (max_tokens) in a typed value keeps it typed",
    opts: coder,
    text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n1",
    reason: "length",
    content: "",
    calls: [{ name: "get_weather", arguments: '{"city":"Oslo","days":1}' }],
  },
  {
    name: "qwen3-coder: prose after a call that mentions the tags",
    opts: coder,
    text: "<function=glob>\n<parameter=pattern>\n*\n</parameter>\n</function>\nI used <function=glob> with </parameter> closed.",
    content: "\nI used <function=glob> with </parameter> closed.",
    calls: [{ name: "glob", arguments: '{"pattern":"*"}' }],
  },
];
