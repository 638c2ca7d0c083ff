/**
 * Model sources of `keel serve`: a model directory (one GGUF, several, an OpenVINO IR directory, none), the
 * model-source flags (`--pull`, `--overwrite_models` switches and which flags need which), and the hub source.
 */
import {mkdirSync, mkdtempSync, rmSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {afterAll, beforeAll, describe, expect, it} from "vitest";
import {type FakeHub, startFakeHub} from "../../test/support/fake-hub.js";
import {parseServeFlags} from "../cli.js";
import {modelSourceFlagProblem, ModelSourceError, openvinoIrDirectory, resolveHubModel, resolveModelDirectory, resolveServeModel} from "./serve-model.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-model-sources-test-"));
let hub: FakeHub;
beforeAll(async () => {
    hub = await startFakeHub({"org/tiny": {"tiny.gguf": {data: Buffer.from("GGUF and then some bytes")}}});
});
afterAll(async () => {
    await hub.close();
    rmSync(tmp, {recursive: true, force: true});
});

/** Makes a directory under tmp holding `files` (name → content). */
function dirWith(name: string, files: Record<string, string>): string {
    const dir = path.join(tmp, name);
    mkdirSync(dir, {recursive: true});
    for (const [f, content] of Object.entries(files)) {
        mkdirSync(path.dirname(path.join(dir, f)), {recursive: true});
        writeFileSync(path.join(dir, f), content);
    }
    return dir;
}

describe("a model directory as --model_path", () => {
    it("with one .gguf serves it, under the directory's name", async () => {
        const dir = dirWith("Qwen-one", {"model.Q4.gguf": "GGUF", "README.md": "x", "config.json": "{}"});
        expect(await resolveServeModel(dir)).toEqual({kind: "directory", path: path.join(dir, "model.Q4.gguf"), servedName: "Qwen-one", source: `directory ${dir}`});
    });

    it("with several .gguf files lists them and asks for --gguf_filename, which then picks one", async () => {
        const dir = dirWith("several", {"b.gguf": "GGUF", "a.gguf": "GGUF"});
        expect(() => resolveModelDirectory(dir)).toThrow(`the model directory ${dir} has 2 .gguf files; pick one with --gguf_filename: a.gguf, b.gguf`);
        expect((await resolveServeModel(dir, {ggufFilename: "b.gguf"})).path).toBe(path.join(dir, "b.gguf"));
        expect(() => resolveModelDirectory(dir, "c.gguf")).toThrow(`the model directory ${dir} has no file c.gguf; its .gguf files: a.gguf, b.gguf`);
        expect(() => resolveModelDirectory(dir, "../several/a.gguf")).toThrow(/--gguf_filename must be the relative path/);
    });

    it("OVMS's versioned layout (base_path/1/, base_path/2/…): the highest version's GGUF", () => {
        const dir = dirWith("versioned", {"1/old.gguf": "GGUF", "2/new.gguf": "GGUF", "10/newest.gguf": "GGUF", "notes/x.gguf": "GGUF"});
        expect(resolveModelDirectory(dir)).toBe(path.join(dir, "10", "newest.gguf"));
        const two = dirWith("versioned-two", {"3/a.gguf": "GGUF", "3/b.gguf": "GGUF"});
        expect(resolveModelDirectory(two, "b.gguf")).toBe(path.join(two, "3", "b.gguf"));
        expect(() => resolveModelDirectory(two)).toThrow(/has 2 \.gguf files; pick one with --gguf_filename/);
    });

    it("an OpenVINO IR directory is served as one (the engine choice decides who serves it); llama.cpp alone cannot resolve it", async () => {
        const dir = dirWith("ov", {"openvino_model.xml": "<xml/>", "openvino_model.bin": ""});
        expect(await resolveServeModel(dir)).toEqual({kind: "openvino-ir", path: dir, gguf: null, servedName: "ov", source: `OpenVINO IR directory ${dir}`});
        expect(() => resolveModelDirectory(dir)).toThrow(ModelSourceError);
        expect(() => resolveModelDirectory(dir)).toThrow(`${dir} is an OpenVINO IR model directory (openvino_model.xml) without a .gguf file; the llama.cpp engine serves GGUF files: serve it with --engine openvino (or --engine auto)`);
        // The IR saved next to its GGUF: an IR directory that names its GGUF; --gguf_filename picks the GGUF itself.
        const both = dirWith("ov-and-gguf", {"openvino_model.xml": "<xml/>", "model.gguf": "GGUF"});
        expect(await resolveServeModel(both)).toMatchObject({kind: "openvino-ir", path: both, gguf: path.join(both, "model.gguf")});
        expect(await resolveServeModel(both, {ggufFilename: "model.gguf"})).toMatchObject({kind: "directory", path: path.join(both, "model.gguf")});
        // OVMS's versioned layout: the highest version's IR.
        const versioned = dirWith("ov-versioned", {"1/openvino_model.xml": "<xml/>", "2/openvino_model.xml": "<xml/>"});
        expect(await resolveServeModel(versioned)).toMatchObject({kind: "openvino-ir", path: path.join(versioned, "2"), servedName: "ov-versioned"});
        expect(openvinoIrDirectory(dirWith("plain", {"a.gguf": "GGUF"}))).toBeNull();
    });

    it("a directory without a model says what --model_path takes", () => {
        const dir = dirWith("empty", {"notes.txt": "x"});
        expect(() => resolveModelDirectory(dir)).toThrow(`the model directory ${dir} has no .gguf file; --model_path needs a GGUF file, a directory holding one, or a model name (keel fetch --list)`);
    });

    it("--gguf_filename with a model file (not a directory) is refused, not ignored", async () => {
        await expect(resolveServeModel(path.join(tmp, "x.gguf"), {ggufFilename: "x.gguf"})).rejects.toThrow(/--gguf_filename picks a file inside a model directory or a hub repository; --model_path .* is not a directory/);
    });
});

describe("model-source flags", () => {
    it("--pull and --overwrite_models are switches as in OVMS; =false and =true are accepted", () => {
        expect(parseServeFlags(["--source_model", "o/n", "--pull", "--overwrite_models"])).toMatchObject({sourceModel: "o/n", pull: true, overwriteModels: true});
        expect(parseServeFlags([])).toMatchObject({pull: undefined, overwriteModels: undefined});
        expect(parseServeFlags(["--pull=false"])).toMatchObject({pull: false});
        expect(() => parseServeFlags(["--pull=yes"])).toThrow(`--pull must be true or false, got "yes"`);
    });

    it("which flag needs which", () => {
        const none = {pull: false, overwriteModels: false};
        expect(modelSourceFlagProblem({...none, sourceModel: "o/n"})).toMatch(/^--source_model needs --model_repository_path \(or OVMS_MODEL_REPOSITORY_PATH\)/);
        expect(modelSourceFlagProblem({...none, sourceModel: "o/n", modelPath: "m.gguf", modelRepositoryPath: "r"})).toBe("--source_model and --model_path both name a model; give one");
        expect(modelSourceFlagProblem({...none, pull: true})).toMatch(/^--pull downloads the model of --source_model/);
        expect(modelSourceFlagProblem({...none, overwriteModels: true})).toMatch(/^--overwrite_models re-downloads/);
        expect(modelSourceFlagProblem({...none, sourceModel: "o/n", modelRepositoryPath: "r", pull: true})).toBeNull();
    });

    it("a hub model is served as ORG/NAME; the second resolution finds it in the repository without the hub", async () => {
        const root = path.join(tmp, "repo");
        const first = await resolveHubModel({sourceModel: "org/tiny", repositoryPath: root, overwrite: false}, {endpoint: hub.endpoint, token: ""});
        expect(first).toEqual({kind: "hub", path: path.join(root, "org", "tiny", "tiny.gguf"), servedName: "org/tiny", source: `pulled from ${hub.endpoint}/org/tiny (sha256 verified)`, downloaded: true});
        hub.requests.length = 0;
        const second = await resolveHubModel({sourceModel: "org/tiny", repositoryPath: root, overwrite: false}, {endpoint: hub.endpoint, token: ""});
        expect(second.downloaded).toBe(false);
        expect(hub.requests).toEqual([]);
    });
});
