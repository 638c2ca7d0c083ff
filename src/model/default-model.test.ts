import {spawnSync} from "node:child_process";
import {mkdtempSync, readdirSync, rmSync, statSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {pathToFileURL} from "node:url";
import {afterAll, describe, expect, it} from "vitest";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {bpeEncode} from "./bpe.js";
import {
    DEFAULT_MODEL_NAME, defaultModelDir, describeDefaultModel, ensureDefaultModel, findRepoRoot, isDefaultModelPath
} from "./default-model.js";
import {buildTinyModel, tinyModelSpecialIds, type BrokenModelKind} from "./tiny-model.js";
import {readGgufHeader} from "./gguf-reader.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-model-test-"));
afterAll(() => rmSync(tmp, {recursive: true, force: true}));

describe("ensureDefaultModel", () => {
    it("generates once, atomically, under concurrent callers, and reuses the file", async () => {
        const dir = path.join(tmp, "concurrent");
        const paths = await Promise.all(Array.from({length: 4}, () => ensureDefaultModel({dir})));
        expect(new Set(paths).size).toBe(1);
        const file = paths[0]!;
        expect(isDefaultModelPath(file)).toBe(true);
        expect(readdirSync(dir)).toEqual([path.basename(file)]); // no temp files left behind
        const buf = buildTinyModel();
        expect(statSync(file).size).toBe(buf.length);
        const mtime = statSync(file).mtimeMs;
        expect(await ensureDefaultModel({dir})).toBe(file);
        expect(statSync(file).mtimeMs).toBe(mtime);
    });

    it("replaces a truncated file and honours KEEL_MODEL_DIR", async () => {
        const dir = path.join(tmp, "env");
        const prev = process.env["KEEL_MODEL_DIR"];
        process.env["KEEL_MODEL_DIR"] = dir;
        try {
            expect(defaultModelDir()).toBe(dir);
            const file = await ensureDefaultModel();
            expect(path.dirname(file)).toBe(dir);
            writeFileSync(file, buildTinyModel().subarray(0, 5000));
            await ensureDefaultModel();
            const size = statSync(file).size;
            expect(size).toBe(buildTinyModel().length);
        } finally {
            if (prev === undefined) delete process.env["KEEL_MODEL_DIR"];
            else process.env["KEEL_MODEL_DIR"] = prev;
        }
        expect(defaultModelDir()).toBe(path.join(findRepoRoot(), "models"));
    });

    it("describes itself as a random-weight demo model", () => {
        const d = describeDefaultModel();
        expect(DEFAULT_MODEL_NAME).toBe("keel-tiny");
        expect(d.randomWeights).toBe(true);
        expect(d.description).toMatch(/random-weight demo model/);
    });
});

describe("generated model in node-llama-cpp", () => {
    it("loads, round-trips UTF-8 text, tokenizes specials and matches the reference BPE", async () => {
        const file = await ensureDefaultModel({dir: path.join(tmp, "load")});
        const llama = await getLlama({gpu: false, build: "never", maxThreads: 1, logLevel: LlamaLogLevel.error});
        const model = await llama.loadModel({modelPath: file});
        try {
            const ids = tinyModelSpecialIds();
            const text = "Hello wörld! The queue has 42 requests 🙂🚀 — naïve café\n\ttabs & \"quotes\"";
            const toks = model.tokenize(text);
            expect(model.detokenize(toks)).toBe(text);
            const merges = readGgufHeader(buildTinyModel()).kv.get("tokenizer.ggml.merges")!.value as string[];
            const vocab = readGgufHeader(buildTinyModel()).kv.get("tokenizer.ggml.tokens")!.value as string[];
            expect(toks).toEqual(bpeEncode(text, merges).map((t) => vocab.indexOf(t)));
            const special = model.tokenize("<|im_start|>user", true);
            expect(special[0]).toBe(ids.imStart);
            expect(model.detokenize(special.slice(1))).toBe("user");
            expect(model.tokens.bos).toBe(ids.bos);
            expect(model.tokens.eos).toBe(ids.eos);
            // without specials enabled the marker is plain text
            expect(model.tokenize("<|im_start|>")).not.toContain(ids.imStart);

            const ctx = await model.createContext({contextSize: 256, threads: 1});
            const seq = ctx.getSequence();
            const out: number[] = [];
            for await (const t of seq.evaluate(model.tokenize("The weather"), {temperature: 0})) {
                out.push(t);
                if (out.length >= 16) break;
            }
            expect(out).toHaveLength(16);
            expect(out.some((t) => t >= ids.bos)).toBe(false);
            await ctx.dispose();
        } finally {
            await model.dispose();
            await llama.dispose();
        }
    }, 60_000);

    it("crafted broken models abort llama.cpp with a GGML_ASSERT (in a child process)", () => {
        // `node -e` breaks node-llama-cpp's binary self-test, so the child runs a script file.
        const nlc = pathToFileURL(path.join(findRepoRoot(), "node_modules", "node-llama-cpp", "dist", "index.js")).href;
        const expected: [BrokenModelKind, RegExp, boolean][] = [
            ["zero-layers", /GGML_ASSERT\(hparams\.n_layer_all > 0/, false],
            ["kv-heads-3", /GGML_ASSERT\(ggml_can_mul_mat\(k, q\)\)/, true],
            ["expert-used", /GGML_ASSERT\(n_expert_used_max <= hparams\.n_expert\)/, false]
        ];
        for (const [broken, assertion, loads] of expected) {
            const file = path.join(tmp, `broken-${broken}.gguf`);
            writeFileSync(file, buildTinyModel({layers: 2, merges: 100, broken}));
            const script = path.join(tmp, `broken-${broken}.mjs`);
            writeFileSync(script, [
                `import {getLlama, LlamaLogLevel} from ${JSON.stringify(nlc)};`,
                `const llama = await getLlama({gpu: false, build: "never", maxThreads: 1, logLevel: LlamaLogLevel.disabled});`,
                `const model = await llama.loadModel({modelPath: ${JSON.stringify(file)}});`,
                `console.log("LOADED");`,
                `await model.createContext({contextSize: 64, threads: 1});`,
                `console.log("SURVIVED");`
            ].join("\n"));
            const r = spawnSync(process.execPath, [script], {encoding: "utf8", timeout: 60_000});
            expect(r.stderr, broken).toMatch(assertion);
            expect(r.signal, broken).toBe("SIGABRT");
            expect(r.stdout.includes("LOADED"), broken).toBe(loads);
            expect(r.stdout, broken).not.toContain("SURVIVED");
        }
    }, 120_000);
});
