import {Template} from "@huggingface/jinja";
import {describe, expect, it} from "vitest";
import {AGENT_TAGS, QWEN3_STYLE_TEMPLATE, QWEN3CODER_STYLE_TEMPLATE} from "./agent-templates.js";

/** Renders a template with the variables `transformers` passes (what ChatTemplate will pass once it forwards tools). */
function render(template: string, vars: Record<string, unknown>): string {
    return new Template(template).render({add_generation_prompt: false, ...vars});
}

const weather = {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: {
        type: "object",
        properties: {city: {type: "string", description: "City name"}, unit: {type: "string", enum: ["c", "f"]}, days: {type: "integer"}},
        required: ["city"]
    }
};
const clock = {name: "get_time", description: "Time now", parameters: {type: "object", properties: {}}};
/** OpenAI's nested shape for one tool and the flat (OVMS) shape for the other. */
const tools = [{type: "function", function: weather}, clock];

const callArgs = {city: "Paris", days: 2, unit: "c"};
/** A conversation with reasoning, two calls (object and JSON-string arguments) and two tool results. */
const agentTurn = [
    {role: "system", content: "Be brief."},
    {role: "user", content: "Weather in Paris and the time?"},
    {
        role: "assistant", content: "", reasoning_content: "Two tools are needed.",
        tool_calls: [
            {id: "c1", type: "function", function: {name: "get_weather", arguments: callArgs}},
            {id: "c2", type: "function", function: {name: "get_time", arguments: "{\"zone\": \"CET\"}"}}
        ]
    },
    {role: "tool", tool_call_id: "c1", content: "18 degrees"},
    {role: "tool", tool_call_id: "c2", content: "14:05"}
];

/** The text between each open and close tag. */
function between(text: string, open: string, close: string): string[] {
    return [...text.matchAll(new RegExp(`${escape(open)}([\\s\\S]*?)${escape(close)}`, "g"))].map((m) => m[1]!);
}
function escape(s: string): string {
    return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

describe("Qwen3-style template (hermes tool calls, thinking)", () => {
    it("lists every tool's function JSON in the system turn, after the client's system message", () => {
        const out = render(QWEN3_STYLE_TEMPLATE, {messages: agentTurn, tools});
        const system = between(out, "<|im_start|>system\n", "<|im_end|>")[0]!;
        expect(system.startsWith("Be brief.\n\n")).toBe(true);
        const listed = between(system, "<tools>\n", "\n</tools>")[0]!.trim().split("\n").map((l) => JSON.parse(l) as unknown);
        expect(listed).toEqual([weather, clock]);
        // the system message is not repeated as a turn of its own
        expect(out.split("Be brief.")).toHaveLength(2);
    });

    it("renders assistant tool_calls as hermes blocks whose JSON is the call, and groups tool results in one user turn", () => {
        const out = render(QWEN3_STYLE_TEMPLATE, {messages: agentTurn, tools});
        const calls = between(out, "<tool_call>\n", "\n</tool_call>").filter((c) => c.startsWith("{\"name\": \"get_"));
        expect(calls.map((c) => JSON.parse(c) as unknown)).toEqual([
            {name: "get_weather", arguments: callArgs},
            {name: "get_time", arguments: {zone: "CET"}}
        ]);
        const toolTurn = out.slice(out.lastIndexOf("<|im_start|>user"));
        expect(between(toolTurn, "<tool_response>\n", "\n</tool_response>")).toEqual(["18 degrees", "14:05"]);
        expect(toolTurn.match(/<\|im_start\|>/g)).toHaveLength(1);
    });

    it("keeps reasoning_content of turns after the last user message and drops older ones", () => {
        const out = render(QWEN3_STYLE_TEMPLATE, {messages: agentTurn});
        expect(between(out, "<think>\n", "\n</think>")).toEqual(["Two tools are needed."]);
        const older = render(QWEN3_STYLE_TEMPLATE, {messages: [...agentTurn, {role: "assistant", content: "Sunny."}, {role: "user", content: "Thanks"}]});
        expect(older).not.toContain("Two tools are needed.");
        expect(older).toContain("Sunny.");
        // a think block left inside the content is split out the same way
        const inline = render(QWEN3_STYLE_TEMPLATE, {messages: [{role: "user", content: "q"}, {role: "assistant", content: "<think>\nponder\n</think>\n\nanswer"}]});
        expect(between(inline, "<think>\n", "\n</think>")).toEqual(["ponder"]);
        expect(inline).toContain("</think>\n\nanswer<|im_end|>");
    });

    it("enable_thinking=false closes an empty think block in the generation prompt; true or absent leaves it open to the model", () => {
        const messages = [{role: "user", content: "hi"}];
        const off = render(QWEN3_STYLE_TEMPLATE, {messages, add_generation_prompt: true, enable_thinking: false});
        const on = render(QWEN3_STYLE_TEMPLATE, {messages, add_generation_prompt: true, enable_thinking: true});
        const absent = render(QWEN3_STYLE_TEMPLATE, {messages, add_generation_prompt: true});
        expect(on).toBe(absent);
        expect(on.endsWith("<|im_start|>assistant\n")).toBe(true);
        expect(off).toBe(`${on}<think>\n\n</think>\n\n`);
        expect(render(QWEN3_STYLE_TEMPLATE, {messages})).not.toContain("<|im_start|>assistant");
    });

    it("without tools renders plain ChatML", () => {
        const out = render(QWEN3_STYLE_TEMPLATE, {messages: [{role: "system", content: "S"}, {role: "user", content: "U"}], add_generation_prompt: true});
        expect(out).toBe("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    });
});

describe("Qwen3-Coder-style template (XML tool calls)", () => {
    it("renders each tool with its parameters' names, types, descriptions, enums and required list", () => {
        const out = render(QWEN3CODER_STYLE_TEMPLATE, {messages: agentTurn, tools});
        const functions = between(out, "<function>\n", "\n</function>");
        expect(functions.map((f) => between(f, "<name>", "</name>")[0])).toEqual(["get_weather", "get_time"]);
        const params = between(functions[0]!, "<parameter>\n", "\n</parameter>");
        expect(params.map((p) => between(p, "<name>", "</name>")[0])).toEqual(Object.keys(weather.parameters.properties));
        expect(params.map((p) => between(p, "<type>", "</type>")[0])).toEqual(Object.values(weather.parameters.properties).map((p) => p.type));
        expect(between(params[0]!, "<description>", "</description>")).toEqual([weather.parameters.properties.city.description]);
        expect(JSON.parse(between(params[1]!, "<enum>", "</enum>")[0]!)).toEqual(weather.parameters.properties.unit.enum);
        expect(JSON.parse(between(functions[0]!, "<required>", "</required>")[0]!)).toEqual(weather.parameters.required);
        expect(between(functions[1]!, "<parameter>", "</parameter>")).toEqual([]);
    });

    it("renders assistant tool_calls as <function=…> with one <parameter=…> per argument, and tool results", () => {
        const out = render(QWEN3CODER_STYLE_TEMPLATE, {messages: agentTurn, tools});
        const assistant = out.slice(out.indexOf("<|im_start|>assistant\n"));
        const blocks = between(assistant, "<tool_call>\n", "\n</tool_call>");
        expect(blocks).toHaveLength(2);
        const first = /^<function=([^>]+)>\n([\s\S]*)<\/function>$/.exec(blocks[0]!)!;
        expect(first[1]).toBe("get_weather");
        const parsed = Object.fromEntries([...first[2]!.matchAll(/<parameter=([^>]+)>\n([\s\S]*?)\n<\/parameter>\n/g)].map((m) => [m[1], m[2]]));
        // strings verbatim, other values as JSON
        expect(parsed).toEqual(Object.fromEntries(Object.entries(callArgs).map(([k, v]) => [k, typeof v === "string" ? v : JSON.stringify(v)])));
        expect(blocks[1]).toBe("<function=get_time>\n{\"zone\": \"CET\"}\n</function>");
        expect(between(out, "<tool_response>\n", "\n</tool_response>")).toEqual(["18 degrees", "14:05"]);
        expect(out).not.toContain("<think>\n"); // no thinking in this family
    });

    it("without tools or system message renders plain ChatML", () => {
        const out = render(QWEN3CODER_STYLE_TEMPLATE, {messages: [{role: "user", content: "U"}], add_generation_prompt: true});
        expect(out).toBe("<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    });
});

it("every agent tag the templates use is one of AGENT_TAGS", () => {
    const out = render(QWEN3_STYLE_TEMPLATE, {messages: agentTurn, tools}) + render(QWEN3CODER_STYLE_TEMPLATE, {messages: agentTurn, tools});
    for (const tag of AGENT_TAGS) expect(out).toContain(tag);
});

describe("through the gateway's ChatTemplate as it is today (role + content, chat_template_kwargs)", () => {
    it("renders plain conversations with both templates, and enable_thinking reaches the Qwen3 one as a kwarg", async () => {
        const {ChatTemplate} = await import("../gateway/models/chat-template.js");
        const messages = [{role: "system", content: "S"}, {role: "user", content: "U"}, {role: "assistant", content: "A"}, {role: "user", content: "V"}];
        for (const source of [QWEN3_STYLE_TEMPLATE, QWEN3CODER_STYLE_TEMPLATE]) {
            const t = new ChatTemplate(source, {bosToken: "<|endoftext|>", eosToken: "<|im_end|>"});
            expect(t.render(messages)).toBe(render(source, {messages, add_generation_prompt: true}));
        }
        const qwen3 = new ChatTemplate(QWEN3_STYLE_TEMPLATE, {bosToken: "<|endoftext|>", eosToken: "<|im_end|>"});
        expect(qwen3.render(messages, {kwargs: {enable_thinking: false}})).toBe(`${qwen3.render(messages)}<think>\n\n</think>\n\n`);
    });
});
