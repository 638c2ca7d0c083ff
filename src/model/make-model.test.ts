import {existsSync, mkdtempSync, readdirSync, readFileSync, rmSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {afterAll, describe, expect, it, vi} from "vitest";
import {readGgufHeader} from "./gguf-reader.js";
import {main, parseMakeModelArgs} from "./make-model.js";
import {buildTinyModel, MODEL_SHAPES} from "./tiny-model.js";
import {TINY_MODELS} from "./default-model.js";
import {buildTinyRecurrentModel} from "./tiny-recurrent-model.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-make-model-"));
afterAll(() => rmSync(tmp, {recursive: true, force: true}));

describe("make-model CLI", () => {
    it("parses options", () => {
        expect(parseMakeModelArgs(["--out", "x.gguf", "--layers", "2", "--kv-heads", "1", "--f16", "--broken", "expert-used"]))
            .toEqual({out: "x.gguf", options: {layers: 2, kvHeads: 1, f16: true, broken: "expert-used"}});
        expect(() => parseMakeModelArgs(["--layers", "2"])).toThrow(/--out/);
        expect(() => parseMakeModelArgs(["--out", "x", "--layers", "two"])).toThrow(/integer/);
        expect(() => parseMakeModelArgs(["--out", "x", "--bogus"])).toThrow(/unknown/);
        expect(() => parseMakeModelArgs(["--out", "x", "--broken", "nope"])).toThrow(/broken/);
    });

    it("writes the same bytes as buildTinyModel and reports usage errors with exit code 2", () => {
        const out = path.join(tmp, "m.gguf");
        const stdout = vi.spyOn(process.stdout, "write").mockImplementation(() => true);
        const stderr = vi.spyOn(process.stderr, "write").mockImplementation(() => true);
        try {
            expect(main(["--out", out, "--layers", "1", "--hidden", "32", "--ff", "64", "--heads", "4", "--kv-heads", "2", "--merges", "50"])).toBe(0);
            expect(main(["--nope"])).toBe(2);
        } finally {
            stdout.mockRestore();
            stderr.mockRestore();
        }
        const buf = readFileSync(out);
        expect(buf.equals(buildTinyModel({layers: 1, hidden: 32, ff: 64, heads: 4, kvHeads: 2, merges: 50}))).toBe(true);
        expect(readGgufHeader(buf).kv.get("llama.block_count")?.value).toBe(1);
    });

    it("--agent qwen3|qwen3coder writes the same bytes as the keel-tiny-qwen3 / keel-tiny-qwen3coder models", () => {
        for (const family of ["qwen3", "qwen3coder"] as const) {
            const out = path.join(tmp, `${family}.gguf`);
            const stdout = vi.spyOn(process.stdout, "write").mockImplementation(() => true);
            try {
                expect(main(["--out", out, "--agent", family])).toBe(0);
            } finally {
                stdout.mockRestore();
            }
            expect(readFileSync(out).equals(buildTinyModel(TINY_MODELS[`keel-tiny-${family}`])), family).toBe(true);
        }
        expect(parseMakeModelArgs(["--out", "x", "--user-token", "<a>", "--user-token", "<b>"]).options.userTokens).toEqual(["<a>", "<b>"]);
        expect(() => parseMakeModelArgs(["--out", "x", "--agent", "llama3"])).toThrow(/unknown family/);
        expect(() => parseMakeModelArgs(["--out", "x", "--arch", "mamba", "--agent", "qwen3"])).toThrow(/not supported/);
        expect(() => parseMakeModelArgs(["--out", "x", "--user-token", "<a>", "--user-token", "<a>"])).toThrow(/distinct/);
    });

    it("--arch mamba|jamba writes a recurrent-state model", () => {
        expect(parseMakeModelArgs(["--out", "x", "--arch", "jamba", "--layers", "4", "--attention-layers", "1,3", "--state-size", "8"]))
            .toEqual({out: "x", options: {layers: 4}, recurrent: {arch: "jamba", layers: 4, attentionLayers: [1, 3], stateSize: 8}});
        expect(() => parseMakeModelArgs(["--out", "x", "--arch", "mamba", "--f16"])).toThrow(/not supported/);
        expect(() => parseMakeModelArgs(["--out", "x", "--dt-rank", "4"])).toThrow(/--arch/);
        expect(() => parseMakeModelArgs(["--out", "x", "--arch", "rwkv"])).toThrow(/unknown architecture/);
        const out = path.join(tmp, "mamba.gguf");
        const stdout = vi.spyOn(process.stdout, "write").mockImplementation(() => true);
        try {
            expect(main(["--out", out, "--arch", "mamba", "--layers", "2", "--merges", "50"])).toBe(0);
        } finally {
            stdout.mockRestore();
        }
        const buf = readFileSync(out);
        expect(buf.equals(buildTinyRecurrentModel({arch: "mamba", layers: 2, merges: 50}))).toBe(true);
        expect(readGgufHeader(buf).kv.get("general.architecture")?.value).toBe("mamba");
    });

    it("--shape and --vocab: a named model's sizes (single flags override), a generated vocabulary", () => {
        expect(parseMakeModelArgs(["--out", "x", "--shape", "qwen2.5-0.5b", "--layers", "2", "--f16"]).options)
            .toEqual({...MODEL_SHAPES["qwen2.5-0.5b"], layers: 2, f16: true});
        expect(parseMakeModelArgs(["--out", "x", "--vocab", "151936"]).options).toEqual({vocab: 151936});
        expect(() => parseMakeModelArgs(["--out", "x", "--shape", "gpt5"])).toThrow(/unknown shape/);
        expect(() => parseMakeModelArgs(["--out", "x", "--vocab", "lots"])).toThrow(/integer/);
        expect(() => parseMakeModelArgs(["--out", "x", "--vocab", "100"])).toThrow(/vocab too small/);
        expect(() => parseMakeModelArgs(["--out", "x", "--arch", "mamba", "--vocab", "5000"])).toThrow(/not supported/);
        const out = path.join(tmp, "v.gguf");
        const stdout = vi.spyOn(process.stdout, "write").mockImplementation(() => true);
        try {
            expect(main(["--out", out, "--layers", "1", "--hidden", "32", "--ff", "64", "--heads", "4", "--kv-heads", "2", "--merges", "50", "--vocab", "3000"])).toBe(0);
        } finally {
            stdout.mockRestore();
        }
        const buf = readFileSync(out);
        expect(buf.equals(buildTinyModel({layers: 1, hidden: 32, ff: 64, heads: 4, kvHeads: 2, merges: 50, vocab: 3000}))).toBe(true);
        expect((readGgufHeader(buf).kv.get("tokenizer.ggml.tokens")?.value as string[]).length).toBe(3000);
    });

    it("a write that fails exits 1 and leaves no file behind", () => {
        const out = path.join(tmp, "no-such-dir", "m.gguf");
        const stderr = vi.spyOn(process.stderr, "write").mockImplementation(() => true);
        try {
            expect(main(["--out", out, "--layers", "1", "--hidden", "32", "--ff", "64", "--heads", "4", "--kv-heads", "2", "--merges", "50"])).toBe(1);
            expect(String(stderr.mock.calls[0]?.[0])).toMatch(/ENOENT/);
        } finally {
            stderr.mockRestore();
        }
        expect(existsSync(out)).toBe(false);
        expect(readdirSync(tmp).filter((f) => f.endsWith(".tmp"))).toEqual([]);
    });
});
