/**
 * Which model `keel serve` serves: `--model_path` may name a generated tiny model (`keel-tiny`,
 * `keel-tiny-qwen3`, `keel-tiny-qwen3coder`), a catalogue model (fetched and cached on first use), or a GGUF file.
 * Without `--model_path` it serves {@link DEFAULT_SERVED_MODEL} (SmolLM2-135M-Instruct); if that cannot be fetched,
 * it serves `keel-tiny` and says why.
 *
 * @module
 */
import path from "node:path";
import {DEFAULT_MODEL_NAME, ensureTinyModel, isTinyModelName} from "./default-model.js";
import {catalogueModel, DEFAULT_SERVED_MODEL, fetchModel, isCatalogueName, type FetchOptions} from "./model-cache.js";

/** The model to serve and where it came from. */
export type ServeModel =
    /** A generated random-weight tiny model. */
    | {kind: "tiny"; name: string; path: string; servedName: string; source: string}
    /** A catalogue model from the cache (fetched now or before). */
    | {kind: "catalogue"; name: string; path: string; servedName: string; source: string; cached: boolean}
    /** A GGUF file named on the command line (not checked here). */
    | {kind: "file"; path: string; servedName: string; source: string}
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
export async function resolveServeModel(requested: string | undefined, opts: {fetch?: FetchOptions; tinyDir?: string} = {}): Promise<ServeModel> {
    // 1. A generated tiny model by name.
    if (requested !== undefined && isTinyModelName(requested)) {
        return {kind: "tiny", name: requested, path: await ensureTinyModel(requested, {dir: opts.tinyDir}), servedName: requested, source: "generated (random weights)"};
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
