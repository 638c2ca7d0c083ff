import {mkdtempSync, rmSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {Template} from "@huggingface/jinja";
import {afterAll, describe, expect, it} from "vitest";
import {LlamaAdapter} from "../engine/llama/adapter.js";
import {AGENT_TAGS} from "./agent-templates.js";
import {ensureDefaultModel, ensureTinyModel, isDefaultModelPath, isTinyModelName, TINY_MODELS} from "./default-model.js";
import {readGgufHeader} from "./gguf-reader.js";
import {buildTinyModel, tinyModelSpecialIds} from "./tiny-model.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-agent-model-test-"));
afterAll(() => rmSync(tmp, {recursive: true, force: true}));

const LLAMA_TOKEN_TYPE_USER_DEFINED = 4;
const AGENT_MODELS = ["keel-tiny-qwen3", "keel-tiny-qwen3coder"] as const;

describe("tiny agent model files", () => {
    it("the plain keel-tiny is unchanged by the agent variants: same file as ensureDefaultModel, no user tokens", async () => {
        const dir = path.join(tmp, "plain");
        expect(await ensureTinyModel("keel-tiny", {dir})).toBe(await ensureDefaultModel({dir}));
        expect(buildTinyModel({userTokens: []}).equals(buildTinyModel())).toBe(true);
        const types = readGgufHeader(buildTinyModel()).kv.get("tokenizer.ggml.token_type")!.value as number[];
        expect(types).not.toContain(LLAMA_TOKEN_TYPE_USER_DEFINED);
    });

    it("stores each agent tag as a USER_DEFINED token after the control tokens, with a trainable (non-zero) output row", () => {
        for (const name of AGENT_MODELS) {
            const opts = TINY_MODELS[name];
            const buf = buildTinyModel(opts);
            const h = readGgufHeader(buf);
            const tokens = h.kv.get("tokenizer.ggml.tokens")!.value as string[];
            const types = h.kv.get("tokenizer.ggml.token_type")!.value as number[];
            const ids = tinyModelSpecialIds(opts);
            expect(tokens).toHaveLength(ids.vocabSize);
            for (const tag of AGENT_TAGS) {
                const id = ids.userTokens[tag]!;
                expect(id, `${name} ${tag}`).toBeGreaterThan(ids.eos);
                expect(tokens[id]).toBe(tag);
                expect(types[id]).toBe(LLAMA_TOKEN_TYPE_USER_DEFINED);
            }
            expect(h.kv.get("tokenizer.chat_template")!.value).toBe(opts.chatTemplate);
            const out = h.tensors.find((t) => t.name === "output.weight")!;
            const hidden = out.ne[0]!;
            const row = (id: number): number[] => Array.from({length: hidden}, (_, i) => buf.readFloatLE(h.dataStart + out.offset + 4 * (id * hidden + i)));
            expect(row(ids.userTokens["<tool_call>"]!).some((x) => x !== 0)).toBe(true);
        }
    });

    it("names resolve, and the files are cached under distinct names", async () => {
        const dir = path.join(tmp, "names");
        expect(isTinyModelName("keel-tiny-qwen3")).toBe(true);
        expect(isTinyModelName("keel-tiny-qwen4")).toBe(false);
        expect(isTinyModelName("toString")).toBe(false);
        await expect(ensureTinyModel("keel-tiny-qwen4", {dir})).rejects.toThrow(/unknown tiny model "keel-tiny-qwen4"/);
        const files = await Promise.all(AGENT_MODELS.map((n) => ensureTinyModel(n, {dir})));
        expect(files.map((f) => path.basename(f).replace(/-[0-9a-f]{16}\.gguf$/, ""))).toEqual([...AGENT_MODELS]);
        for (const f of files) expect(isDefaultModelPath(f)).toBe(true);
        expect(await ensureTinyModel("keel-tiny-qwen3", {dir})).toBe(files[0]);
    });
});

describe.each(AGENT_MODELS)("%s in llama.cpp", (name) => {
    it("tokenizes each tag as its single token, prints the tag's text (not swallowed), and spells all printable ASCII", async () => {
        const file = await ensureTinyModel(name, {dir: path.join(tmp, "load")});
        const adapter = await LlamaAdapter.open({modelPath: file, sequences: 1, contextSize: 256, batchSize: 64, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu"});
        try {
            const ids = tinyModelSpecialIds(TINY_MODELS[name]);
            const text = (tokens: number[]): string => Buffer.concat(tokens.map((t) => adapter.bytesOf(t))).toString("utf8");
            for (const tag of AGENT_TAGS) {
                expect(adapter.tokenize(tag), tag).toEqual([ids.userTokens[tag]]);
                expect(text([ids.userTokens[tag]!])).toBe(tag);
                expect(adapter.isEndOfGeneration(ids.userTokens[tag]!)).toBe(false);
            }
            // Grammars must be satisfiable: every printable ASCII character and the newline is one token of its own.
            for (let c = 0x20; c <= 0x7e; c++) {
                const ch = String.fromCharCode(c);
                const toks = adapter.tokenize(ch);
                expect(toks, JSON.stringify(ch)).toHaveLength(1);
                expect(text(toks)).toBe(ch);
            }
            expect(text(adapter.tokenize("\n"))).toBe("\n");
            // A rendered agent turn: the tags inside it are single tokens and the bytes round-trip.
            const prompt = new Template(TINY_MODELS[name].chatTemplate).render({
                messages: [{role: "user", content: "weather?"}, {role: "assistant", content: "", reasoning_content: "think", tool_calls: [{function: {name: "w", arguments: {city: "Oslo"}}}]}],
                tools: [{name: "w", parameters: {type: "object", properties: {city: {type: "string"}}}}],
                add_generation_prompt: true
            });
            const toks = adapter.tokenize(prompt);
            for (const tag of AGENT_TAGS.filter((t) => prompt.includes(t))) expect(toks).toContain(ids.userTokens[tag]);
            expect(toks).toContain(ids.imStart);
            // control markers print nothing; everything else round-trips
            expect(text(toks)).toBe(prompt.replaceAll("<|im_start|>", "").replaceAll("<|im_end|>", ""));
        } finally {
            await adapter.dispose();
        }
    }, 60_000);
});
