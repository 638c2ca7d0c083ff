/**
 * Keel's embedded default model: a {@link buildTinyModel} GGUF generated on first use and cached on disk.
 *
 * Cache file: `<dir>/keel-tiny-<hash>.gguf`, where `<hash>` covers the model options and the generator version,
 * and `<dir>` is (first match) the `dir` argument, `$KEEL_MODEL_DIR`, or `<repo root>/models`.
 */
import {createHash, randomBytes} from "node:crypto";
import {existsSync, readFileSync} from "node:fs";
import {open, rename, stat, unlink, writeFile} from "node:fs/promises";
import path from "node:path";
import {fileURLToPath} from "node:url";
import {AGENT_TAGS, QWEN3_STYLE_TEMPLATE, QWEN3CODER_STYLE_TEMPLATE} from "./agent-templates.js";
import {readGgufHeader} from "./gguf-reader.js";
import {
    buildTinyModel, resolveTinyModelOptions, TINY_MODEL_DEFAULTS, TINY_MODEL_GENERATOR_VERSION,
    type ResolvedTinyModelOptions, type TinyModelOptions
} from "./tiny-model.js";
import {makeDirsSync} from "./make-dirs.js";

/** Public model name (the `model` field clients send / `/v1/models` lists) of the embedded default model. */
export const DEFAULT_MODEL_NAME = "keel-tiny";

/** Options the embedded default model is built with. */
export const DEFAULT_MODEL_OPTIONS: Readonly<TinyModelOptions> = Object.freeze({...TINY_MODEL_DEFAULTS});

/**
 * Context settings under which the default model is batch-invariant on the CPU backend (measured: 0 of 2048
 * mixed-batch requests differed from their solo runs, not even in the last bit of a probability; see
 * docs/batch-variance.md). Spread into node-llama-cpp's `model.createContext({...})`. Keep flash attention off:
 * it also measured 0 with 1 thread, but the CPU flash-attention kernel picks code paths by batch shape (a split-KV
 * reduction for single-token queries once the padded KV length, which depends on the other sequences in the
 * batch, reaches 512; the split follows the thread count), so invariance is not guaranteed there. F32 KV also
 * measured 0; F16 is the default and uses half the memory. Thread count does not matter (1 vs 2 measured).
 */
export const DEFAULT_MODEL_CONTEXT_SETTINGS = Object.freeze({
    flashAttention: false,
    experimentalKvCacheKeyType: "F16",
    experimentalKvCacheValueType: "F16"
} as const);

/** What the server should say about the default model in logs and metadata. */
export interface DefaultModelDescription {
    name: string;
    /** Always true: the weights are random, the text is gibberish. */
    randomWeights: true;
    /** One-line human description, e.g. for a startup log line. */
    description: string;
    options: ResolvedTinyModelOptions;
    generatorVersion: number;
}

/** Describes the embedded default model (no I/O). */
export function describeDefaultModel(): DefaultModelDescription {
    const o = resolveTinyModelOptions(DEFAULT_MODEL_OPTIONS);
    return {
        name: DEFAULT_MODEL_NAME,
        randomWeights: true,
        description: `random-weight demo model (${o.layers} layers, hidden ${o.hidden}, output is gibberish; ` +
            `pass --model_path <file.gguf or model name> for a real model)`,
        options: o,
        generatorVersion: TINY_MODEL_GENERATOR_VERSION
    };
}

/**
 * The generated tiny models a `--model_path` may name: the plain ChatML model, its F16 twin (same seed and shapes,
 * matrices stored as F16: OpenVINO GenAI refuses F32 matrices, so this is the one model both engines load), and
 * two agent variants (same weights' shapes and seed, the agent tags as extra USER_DEFINED tokens, a Qwen3- or
 * Qwen3-Coder-style template; see agent-templates.ts) so that tool calls and reasoning run end to end, fast and
 * deterministically.
 */
export const TINY_MODELS = Object.freeze({
    "keel-tiny": DEFAULT_MODEL_OPTIONS,
    "keel-tiny-f16": Object.freeze({...TINY_MODEL_DEFAULTS, f16: true}),
    "keel-tiny-qwen3": Object.freeze({...TINY_MODEL_DEFAULTS, chatTemplate: QWEN3_STYLE_TEMPLATE, userTokens: AGENT_TAGS}),
    "keel-tiny-qwen3coder": Object.freeze({...TINY_MODEL_DEFAULTS, chatTemplate: QWEN3CODER_STYLE_TEMPLATE, userTokens: AGENT_TAGS})
} satisfies Record<string, Readonly<TinyModelOptions>>);

/** Name of one of the {@link TINY_MODELS}. */
export type TinyModelName = keyof typeof TINY_MODELS;

/** True if `name` names one of the {@link TINY_MODELS}. */
export function isTinyModelName(name: string): name is TinyModelName {
    return Object.hasOwn(TINY_MODELS, name);
}

/** True if `modelPath` is a file name produced by {@link ensureDefaultModel} / {@link ensureTinyModel} (random weights). */
export function isDefaultModelPath(modelPath: string): boolean {
    return /^keel-tiny(-f16|-qwen3|-qwen3coder)?-[0-9a-f]{16}\.gguf$/.test(path.basename(modelPath));
}

/** Cache key (16 hex chars) of a tiny model: hash of the resolved options and the generator version. */
export function tinyModelCacheKey(opts: TinyModelOptions = DEFAULT_MODEL_OPTIONS): string {
    const o = resolveTinyModelOptions(opts);
    const canonical = JSON.stringify(Object.keys(o).sort().map((k) => [k, o[k as keyof typeof o]]));
    return createHash("sha256").update(`keel-tiny-v${TINY_MODEL_GENERATOR_VERSION}\n${canonical}`).digest("hex").slice(0, 16);
}

/** Finds the repository root: the nearest ancestor of this module that holds a package.json named "keel". */
export function findRepoRoot(start: string = path.dirname(fileURLToPath(import.meta.url))): string {
    let dir = start;
    for (;;) {
        const pkg = path.join(dir, "package.json");
        if (existsSync(pkg)) {
            try {
                if ((JSON.parse(readFileSync(pkg, "utf8")) as {name?: unknown}).name === "keel") return dir;
            } catch {
                // unreadable package.json: keep walking up
            }
        }
        const parent = path.dirname(dir);
        if (parent === dir) throw new Error(`cannot find the Keel repository root above ${start}`);
        dir = parent;
    }
}

/** Resolves the model cache directory: `dir` argument, `$KEEL_MODEL_DIR`, else `<repo root>/models`. */
export function defaultModelDir(dir?: string): string {
    return path.resolve(dir ?? process.env["KEEL_MODEL_DIR"] ?? path.join(findRepoRoot(), "models"));
}

/** True if `file` exists and its size equals the size its own GGUF header implies (i.e. it is complete). */
async function isCompleteGguf(file: string): Promise<boolean> {
    let size: number;
    try {
        size = (await stat(file)).size;
    } catch {
        return false;
    }
    const fh = await open(file, "r");
    try {
        // The header of a tiny model is well under 1 MiB (tokens + merges + template).
        const head = Buffer.alloc(Math.min(size, 1 << 20));
        await fh.read(head, 0, head.length, 0);
        return readGgufHeader(head).impliedSize === size;
    } catch {
        return false;
    } finally {
        await fh.close();
    }
}

/**
 * Returns the absolute path of the embedded default model, generating it if needed (about 0.3 s, ~15 MB).
 *
 * Concurrency: safe when several processes call it at once. Each writer builds into a uniquely named temp file
 * in the target directory and `rename`s it over the final name (atomic on POSIX); readers only ever see a
 * complete file. An existing file whose size matches its header is reused; an incomplete one is replaced.
 * @param opts.dir cache directory (default `$KEEL_MODEL_DIR`, else `<repo root>/models`); created if missing
 * @param opts.model tiny-model options to use instead of {@link DEFAULT_MODEL_OPTIONS} (tests)
 * @throws Error if the directory cannot be created or written (the underlying fs error, with its `code`)
 */
export async function ensureDefaultModel(opts: {dir?: string; model?: TinyModelOptions} = {}): Promise<string> {
    return generateCached(defaultModelDir(opts.dir), "keel-tiny", opts.model ?? DEFAULT_MODEL_OPTIONS);
}

/**
 * Returns the absolute path of the named tiny model (`<dir>/<name>-<hash>.gguf`), generating it if needed, with
 * the same cache directory and concurrency guarantees as {@link ensureDefaultModel} (`keel-tiny` gives the same
 * file as it).
 * @throws Error on an unknown name, or if the directory cannot be created or written
 */
export async function ensureTinyModel(name: string, opts: {dir?: string} = {}): Promise<string> {
    if (!isTinyModelName(name)) throw new Error(`unknown tiny model "${name}" (known: ${Object.keys(TINY_MODELS).join(", ")})`);
    return generateCached(defaultModelDir(opts.dir), name, TINY_MODELS[name]);
}

/** Builds `<dir>/<prefix>-<hash>.gguf` unless a complete copy is there: temp file + rename, so readers never see a partial one. */
async function generateCached(dir: string, prefix: string, modelOptions: TinyModelOptions): Promise<string> {
    const file = path.join(dir, `${prefix}-${tinyModelCacheKey(modelOptions)}.gguf`);
    if (await isCompleteGguf(file)) return file;
    makeDirsSync(dir);
    const tmp = path.join(dir, `.${path.basename(file)}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
    try {
        await writeFile(tmp, buildTinyModel(modelOptions));
        await rename(tmp, file);
    } catch (err) {
        await unlink(tmp).catch(() => undefined);
        throw err;
    }
    return file;
}
