/**
 * Which model `keel serve` serves: `--model_path` may name a generated tiny model (`keel-tiny`,
 * `keel-tiny-qwen3`, `keel-tiny-qwen3coder`), a catalogue model (fetched and cached on first use), a GGUF file, or a
 * model directory holding one GGUF (`--gguf_filename` picks among several). `--source_model ORG/NAME` with
 * `--model_repository_path` pulls from the Hugging Face hub instead (hub-download.ts).
 * Without either it serves {@link DEFAULT_SERVED_MODEL} (Qwen2.5-Coder-0.5B-Instruct); if that cannot be fetched,
 * it serves `keel-tiny` and says why.
 *
 * @module
 */
import {readdirSync, statSync} from "node:fs";
import path from "node:path";
import {DEFAULT_MODEL_NAME, ensureTinyModel, isTinyModelName} from "./default-model.js";
import {ensureHybridModel, HYBRID_MODEL_NAME} from "../engine-openvino/hybrid-model.js";
import {checkGgufFilename, hubEndpoint, pullHubModel, type HubOptions} from "./hub-download.js";
import {catalogueModel, DEFAULT_SERVED_MODEL, fetchModel, isCatalogueName, type FetchOptions} from "./model-cache.js";

/** The model to serve and where it came from. */
export type ServeModel =
    /** A generated random-weight tiny model. */
    | {kind: "tiny"; name: string; path: string; servedName: string; source: string}
    /** A catalogue model from the cache (fetched now or before). */
    | {kind: "catalogue"; name: string; path: string; servedName: string; source: string; cached: boolean}
    /** A GGUF file named on the command line (not checked here). */
    | {kind: "file"; path: string; servedName: string; source: string}
    /** The GGUF of a model directory named on the command line (its only one, or the one `--gguf_filename` names). */
    | {kind: "directory"; path: string; servedName: string; source: string}
    /**
     * An OpenVINO IR directory (`openvino_model.xml`; OVMS's versioned layout resolved to its highest version): only
     * the OpenVINO engine serves it. `gguf` is a GGUF file in the same directory (a model prepared next to its IR),
     * or null; the caller decides by engine (cli/engine-choice.ts).
     */
    | {kind: "openvino-ir"; path: string; gguf: string | null; servedName: string; source: string}
    /** A GGUF pulled from the hub into the model repository (`downloaded` false: it was already there). */
    | {kind: "hub"; path: string; servedName: string; source: string; downloaded: boolean}
    /** No model named and the default could not be fetched: the tiny model, with the reason. */
    | {kind: "fallback"; name: string; path: string; servedName: string; source: string; reason: string};

/** How to pass a model, for messages after a failed default fetch. */
export const HOW_TO_PASS_A_MODEL =
    `pass --model_path with a GGUF file, a model name (keel fetch --list) or keel-tiny (the generated random-weight model)`;

/**
 * Resolves `--model_path` (undefined = not given) to the model file to serve.
 * @param opts.fetch options of the fetcher (cache dir, downloader, progress log)
 * @throws ModelFetchError when a catalogue model that was named explicitly cannot be fetched
 */
export async function resolveServeModel(requested: string | undefined, opts: {fetch?: FetchOptions; tinyDir?: string; ggufFilename?: string; log?: (line: string) => void} = {}): Promise<ServeModel> {
    // 0. --gguf_filename picks a file inside a directory; with anything else it would be ignored, so it is refused.
    // Model names win over a directory of the same name in the working directory, as they did before directories.
    const isName = requested !== undefined && (isTinyModelName(requested) || isCatalogueName(requested) || requested === HYBRID_MODEL_NAME);
    const isDirectory = requested !== undefined && !isName && statSync(requested, {throwIfNoEntry: false})?.isDirectory() === true;
    if (opts.ggufFilename !== undefined && !isDirectory) {
        throw new ModelSourceError(`--gguf_filename picks a file inside a model directory or a hub repository; ${requested === undefined ? "no --model_path or --source_model names one" : `--model_path ${requested} is not a directory`}`);
    }
    if (isDirectory) {
        // An IR directory (unless --gguf_filename picks a GGUF in it): the engine choice decides who serves it.
        const ir = opts.ggufFilename === undefined ? openvinoIrDirectory(requested) : null;
        if (ir !== null) return {kind: "openvino-ir", path: ir, gguf: onlyGguf(ir), servedName: path.basename(path.resolve(requested)), source: `OpenVINO IR directory ${ir}`};
        const file = resolveModelDirectory(requested, opts.ggufFilename);
        return {kind: "directory", path: file, servedName: path.basename(path.resolve(requested)), source: `directory ${path.resolve(requested)}`};
    }
    // 1. A generated tiny model by name.
    if (requested !== undefined && isTinyModelName(requested)) {
        return {kind: "tiny", name: requested, path: await ensureTinyModel(requested, {dir: opts.tinyDir}), servedName: requested, source: "generated (random weights)"};
    }
    // 1b. The generated tiny hybrid (linear-attention) IR: only the OpenVINO engine serves it.
    if (requested === HYBRID_MODEL_NAME) {
        const dir = await ensureHybridModel({log: opts.log});
        return {kind: "openvino-ir", path: dir, gguf: null, servedName: HYBRID_MODEL_NAME, source: "generated (random weights, hybrid OpenVINO IR)"};
    }
    // 2. A catalogue model by name, or the default one.
    const name = requested ?? DEFAULT_SERVED_MODEL;
    if (isCatalogueName(name)) {
        const entry = catalogueModel(name);
        try {
            const got = await fetchModel(entry, opts.fetch);
            return {kind: "catalogue", name, path: got.path, servedName: entry.servedName, source: got.source, cached: got.cached};
        } catch (err) {
            if (requested !== undefined) throw err;
            const fallback = await ensureTinyModel(DEFAULT_MODEL_NAME, {dir: opts.tinyDir});
            return {
                kind: "fallback", name: DEFAULT_MODEL_NAME, path: fallback, servedName: DEFAULT_MODEL_NAME, source: "generated (random weights)",
                reason: `the default model ${name} could not be fetched: ${(err as Error).message}`
            };
        }
    }
    // 3. A file.
    const file = path.resolve(name);
    return {kind: "file", path: file, servedName: path.basename(file).replace(/\.gguf$/i, ""), source: "file"};
}

/** The IR's model file: a directory holding it is an OpenVINO IR directory. */
export const OPENVINO_IR_MODEL = "openvino_model.xml";

/**
 * The OpenVINO IR directory `dir` names: itself when it holds {@link OPENVINO_IR_MODEL}, else (OVMS's versioned
 * layout, no GGUF at the top) its highest numbered version when that one is an IR directory; null otherwise.
 */
export function openvinoIrDirectory(dir: string): string | null {
    const abs = path.resolve(dir);
    const entries = readdirSync(abs);
    if (entries.includes(OPENVINO_IR_MODEL)) return abs;
    if (entries.some((f) => /\.gguf$/i.test(f))) return null;
    const versions = entries.filter((f) => /^[1-9][0-9]{0,8}$/.test(f) && statSync(path.join(abs, f), {throwIfNoEntry: false})?.isDirectory());
    if (versions.length === 0) return null;
    const latest = path.join(abs, versions.sort((a, b) => Number(b) - Number(a))[0]!);
    return readdirSync(latest).includes(OPENVINO_IR_MODEL) ? latest : null;
}

/** The only `.gguf` file of `dir`, or null (none, or several). */
function onlyGguf(dir: string): string | null {
    const ggufs = readdirSync(dir).filter((f) => /\.gguf$/i.test(f) && statSync(path.join(dir, f), {throwIfNoEntry: false})?.isFile());
    return ggufs.length === 1 ? path.join(dir, ggufs[0]!) : null;
}

/** A model source that cannot be used (a directory without a usable GGUF, a contradictory set of flags). */
export class ModelSourceError extends Error {
    constructor(message: string) {
        super(message);
        this.name = "ModelSourceError";
    }
}

/**
 * The GGUF file of model directory `dir`: `ggufFilename` (relative to it) if given, else its only `.gguf`.
 * @throws ModelSourceError for several GGUFs (listed), an OpenVINO IR directory without a GGUF (llama.cpp cannot serve it), or none
 */
export function resolveModelDirectory(dir: string, ggufFilename?: string): string {
    const abs = path.resolve(dir);
    const entries = readdirSync(abs).sort();
    const ggufs = entries.filter((f) => /\.gguf$/i.test(f) && statSync(path.join(abs, f), {throwIfNoEntry: false})?.isFile());
    // 0. OVMS's versioned layout (`base_path/1/…`, `base_path/2/…`) and no GGUF at the top: the highest version, as
    //    OVMS serves it.
    const versions = entries.filter((f) => /^[1-9][0-9]{0,8}$/.test(f) && statSync(path.join(abs, f), {throwIfNoEntry: false})?.isDirectory());
    if (ggufs.length === 0 && versions.length > 0) {
        const latest = versions.sort((a, b) => Number(b) - Number(a))[0]!;
        return resolveModelDirectory(path.join(abs, latest), ggufFilename);
    }
    // 1. A named file must be in the directory (no way out of it).
    if (ggufFilename !== undefined) {
        try {
            checkGgufFilename(ggufFilename);
        } catch (err) {
            throw new ModelSourceError((err as Error).message);
        }
        const file = path.join(abs, ggufFilename);
        if (statSync(file, {throwIfNoEntry: false})?.isFile()) return file;
        throw new ModelSourceError(`the model directory ${abs} has no file ${ggufFilename}${ggufs.length > 0 ? `; its .gguf files: ${ggufs.join(", ")}` : ""}`);
    }
    // 2. The only GGUF.
    if (ggufs.length === 1) return path.join(abs, ggufs[0]!);
    if (ggufs.length > 1) throw new ModelSourceError(`the model directory ${abs} has ${ggufs.length} .gguf files; pick one with --gguf_filename: ${ggufs.join(", ")}`);
    // 3. No GGUF: say what the directory is instead.
    if (entries.includes(OPENVINO_IR_MODEL)) {
        throw new ModelSourceError(`${abs} is an OpenVINO IR model directory (${OPENVINO_IR_MODEL}) without a .gguf file; the llama.cpp engine serves GGUF files: serve it with --engine openvino (or --engine auto)`);
    }
    throw new ModelSourceError(`the model directory ${abs} has no .gguf file; --model_path needs a GGUF file, a directory holding one, or a model name (keel fetch --list)`);
}

/** The model-source flags of `keel serve`. */
export interface ModelSourceFlags {
    modelPath?: string;
    sourceModel?: string;
    /** `--model_repository_path`, already defaulted from `OVMS_MODEL_REPOSITORY_PATH`. */
    modelRepositoryPath?: string;
    ggufFilename?: string;
    pull: boolean;
    overwriteModels: boolean;
}

/** A user-facing message when the model-source flags contradict each other or lack a partner, else null. */
export function modelSourceFlagProblem(f: ModelSourceFlags): string | null {
    if (f.sourceModel !== undefined) {
        if (f.modelPath !== undefined) return "--source_model and --model_path both name a model; give one";
        if (f.modelRepositoryPath === undefined) return "--source_model needs --model_repository_path (or OVMS_MODEL_REPOSITORY_PATH): the directory the model is pulled into";
        return null;
    }
    if (f.pull) return "--pull downloads the model of --source_model; give --source_model ORG/NAME and --model_repository_path";
    if (f.overwriteModels) return "--overwrite_models re-downloads the model of --source_model; give --source_model ORG/NAME";
    return null;
}

/**
 * Pulls `--source_model` into the model repository (a no-op when it is there, unless `overwrite`) and describes it
 * as the model to serve, served as `ORG/NAME` (as OVMS) unless `--model_name` says otherwise.
 * @throws HubError
 */
export async function resolveHubModel(req: {sourceModel: string; repositoryPath: string; ggufFilename?: string; overwrite: boolean}, hub: HubOptions = {}): Promise<ServeModel & {kind: "hub"}> {
    const got = await pullHubModel(req, hub);
    const endpoint = hub.endpoint ?? hubEndpoint();
    return {kind: "hub", path: got.path, servedName: req.sourceModel, source: got.downloaded ? `pulled from ${endpoint}/${req.sourceModel} (${got.verified} verified)` : `${req.sourceModel}, already in ${req.repositoryPath}`, downloaded: got.downloaded};
}
