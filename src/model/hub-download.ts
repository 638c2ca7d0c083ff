/**
 * Pulls a GGUF model from the Hugging Face hub (or anything that speaks its HTTP API: `HF_ENDPOINT`) into an OVMS-style
 * model repository: `--source_model ORG/NAME --model_repository_path DIR` → `DIR/ORG/NAME/<file>.gguf`.
 *
 * Steps of a pull: (1) a file already in place is used as is — no network — unless `overwrite`; (2) the repository's
 * file list (`GET {endpoint}/api/models/{repo}?blobs=true`) picks the GGUF (`--gguf_filename`, or the only one);
 * (3) the file is downloaded from `{endpoint}/{repo}/resolve/main/{file}` (redirects followed) into `<file>.part`,
 * resuming with a `Range` request after a dropped connection or from a `.part` a killed process left, with bounded
 * retries and exponential backoff; (4) it is verified — the sha256 of the hub's LFS metadata (the `lfs.sha256` of the
 * file list, else a 64-hex `X-Linked-Etag`/`ETag`), else the size alone — and (5) renamed to its final name
 * (atomic), so a reader never sees a partial or unverified file. Two pulls into one directory at once take turns
 * (a lock file holding the puller's pid); the second finds the file in place.
 *
 * `HF_TOKEN` is sent as `Authorization: Bearer`; fetch drops it on a redirect to another origin (the hub's CDN).
 *
 * @module
 */
import {createHash, type Hash} from "node:crypto";
import {createReadStream} from "node:fs";
import {open, readdir, rename, rm, stat, truncate} from "node:fs/promises";
import path from "node:path";
import {setTimeout as delay} from "node:timers/promises";
import type {ProgressSink} from "./download-progress.js";
import {acquireLock} from "./model-cache.js";
import {makeDirsSync} from "./make-dirs.js";

/** Why a pull failed (also in the message). */
export type HubFailure =
    /** `--source_model` or `--gguf_filename` is malformed. */
    | "bad-request"
    /** The hub answered 401/403: the repository is gated or private and HF_TOKEN is missing or not allowed. */
    | "unauthorized"
    /** The hub answered 404: no such repository or file. */
    | "not-found"
    /** The repository has no `.gguf` file, or several and none was chosen, or the chosen one is not there. */
    | "no-gguf"
    /** The hub could not be reached or kept failing after the retries. */
    | "download-failed"
    /** The downloaded file's size or sha256 differs from the hub's (the partial file is removed). */
    | "checksum-mismatch";

/** A pull that failed, with a user-facing message. */
export class HubError extends Error {
    constructor(readonly failure: HubFailure, message: string, options?: {cause?: unknown}) {
        super(message, options);
        this.name = "HubError";
    }
}

/** One file of a hub repository as its file list describes it. */
export interface HubFile {
    /** Path inside the repository (`rfilename`), e.g. `model-Q4_K_M.gguf`. */
    name: string;
    /** Size in bytes, when the hub gives it. */
    size: number | null;
    /** sha256 of the content (lower-case hex) for an LFS file, when the hub gives it. */
    sha256: string | null;
}

/** Options of the hub client. */
export interface HubOptions {
    /** Hub base URL (default `HF_ENDPOINT`, else https://huggingface.co). */
    endpoint?: string;
    /** Access token (default `HF_TOKEN`); sent as `Authorization: Bearer`. */
    token?: string;
    /** Log lines (start, resume, retries, verification). */
    log?: (line: string) => void;
    /** Makes the progress sink of one file download (label = the file name). */
    progress?: (label: string) => ProgressSink;
    /** Attempts per download after the first before giving up (default 5). */
    retries?: number;
    /** Backoff before retry k is backoffMs * 2^(k-1) (default 1000 ms). */
    backoffMs?: number;
    /** A connection that delivers nothing for this long is dropped and retried (default 60 s). */
    idleTimeoutMs?: number;
    /** Milliseconds between looks at another process's pull lock (default 500). */
    lockPollMs?: number;
}

/** What {@link pullHubModel} is asked to pull. */
export interface PullRequest {
    /** `ORG/NAME` of the hub repository. */
    sourceModel: string;
    /** Root of the model repository; the file lands in `<root>/ORG/NAME/`. */
    repositoryPath: string;
    /** The GGUF file to take (required when the repository has several). */
    ggufFilename?: string;
    /** Download again even when the file is already there (OVMS `--overwrite_models`). */
    overwrite?: boolean;
}

/** Result of {@link pullHubModel}. */
export interface PullResult {
    /** Absolute path of the GGUF file. */
    path: string;
    /** False when the file was already in place and nothing was downloaded. */
    downloaded: boolean;
    /** What was checked: the hub's sha256, the size only, or nothing (the file was already in place). */
    verified: "sha256" | "size" | "existing";
}

/** The hub base URL: `HF_ENDPOINT` without a trailing slash, else https://huggingface.co. */
export function hubEndpoint(env: NodeJS.ProcessEnv = process.env): string {
    return (env["HF_ENDPOINT"] || "https://huggingface.co").replace(/\/+$/, "");
}

/** A repository id as the hub spells it: `ORG/NAME`, letters, digits, `-`, `_`, `.`; no `..`. */
const REPO_ID = /^[A-Za-z0-9][A-Za-z0-9._-]*\/[A-Za-z0-9][A-Za-z0-9._-]*$/;

/** Checks `ORG/NAME`. @throws HubError("bad-request") */
export function checkRepoId(repo: string): void {
    if (!REPO_ID.test(repo) || repo.includes("..")) {
        throw new HubError("bad-request", `--source_model must be a hub repository id ORG/NAME (e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF), got "${repo}"`);
    }
}

/** Checks a repository file path (`--gguf_filename`): relative, no `..`, ends in `.gguf`. @throws HubError("bad-request") */
export function checkGgufFilename(name: string): void {
    const parts = name.split("/");
    if (name.startsWith("/") || parts.some((p) => p === "" || p === "." || p === "..") || !/\.gguf$/i.test(name)) {
        throw new HubError("bad-request", `--gguf_filename must be the relative path of a .gguf file in the repository, got "${name}"`);
    }
}

/** URL path of `file` (segments encoded, slashes kept). */
function encodePath(file: string): string {
    return file.split("/").map(encodeURIComponent).join("/");
}

/** Request headers: the token, if any. */
function authHeaders(opts: HubOptions): Record<string, string> {
    const token = opts.token ?? process.env["HF_TOKEN"];
    return token ? {authorization: `Bearer ${token}`} : {};
}

/** The HubError of a non-2xx hub answer. */
function statusError(status: number, what: string, opts: HubOptions): HubError {
    if (status === 401 || status === 403) {
        const hasToken = authHeaders(opts)["authorization"] !== undefined;
        return new HubError("unauthorized", `the hub refused ${what} (HTTP ${status}): ${hasToken ? "HF_TOKEN is not allowed to read it (gated model: accept its terms on the hub?)" : "it is gated or private; set HF_TOKEN to a token that may read it"}`);
    }
    if (status === 404) return new HubError("not-found", `the hub has no ${what} (HTTP 404)`);
    return new HubError("download-failed", `the hub answered HTTP ${status} for ${what}`);
}

/** A 64-hex sha256 from an ETag-style header value (`"…"`, `W/"…"`), else null. */
function sha256FromEtag(value: string | null): string | null {
    const v = value?.replace(/^W\//, "").replace(/"/g, "").toLowerCase() ?? "";
    return /^[0-9a-f]{64}$/.test(v) ? v : null;
}

/** Lists the files of hub repository `repo` (with sizes and LFS sha256 where the hub gives them). @throws HubError */
export async function hubModelFiles(repo: string, opts: HubOptions = {}): Promise<HubFile[]> {
    checkRepoId(repo);
    const url = `${opts.endpoint ?? hubEndpoint()}/api/models/${repo}?blobs=true`;
    let res: Response;
    try {
        res = await fetch(url, {headers: authHeaders(opts)});
    } catch (err) {
        throw new HubError("download-failed", `cannot reach the hub at ${opts.endpoint ?? hubEndpoint()}: ${causeOf(err)} (set HF_ENDPOINT for a mirror)`, {cause: err});
    }
    if (!res.ok) throw statusError(res.status, `model repository ${repo}`, opts);
    const body = (await res.json().catch(() => null)) as {siblings?: unknown} | null;
    if (!body || !Array.isArray(body.siblings)) throw new HubError("download-failed", `the hub's answer for ${repo} has no file list (siblings)`);
    return body.siblings.flatMap((s: unknown): HubFile[] => {
        const o = s as {rfilename?: unknown; size?: unknown; lfs?: {sha256?: unknown; size?: unknown}};
        if (typeof o?.rfilename !== "string") return [];
        const size = typeof o.lfs?.size === "number" ? o.lfs.size : typeof o.size === "number" ? o.size : null;
        const sha = typeof o.lfs?.sha256 === "string" && /^[0-9a-f]{64}$/i.test(o.lfs.sha256) ? o.lfs.sha256.toLowerCase() : null;
        return [{name: o.rfilename, size, sha256: sha}];
    });
}

/**
 * Picks the GGUF file of a repository: `wanted` if given (it must be there), else the only `.gguf`.
 * @throws HubError("no-gguf") listing the `.gguf` files, or saying there are none
 */
export function pickGguf(repo: string, files: readonly HubFile[], wanted?: string): HubFile {
    const ggufs = files.filter((f) => /\.gguf$/i.test(f.name));
    const list = ggufs.map((f) => f.name).join(", ");
    if (wanted !== undefined) {
        const hit = ggufs.find((f) => f.name === wanted);
        if (hit) return hit;
        throw new HubError("no-gguf", ggufs.length === 0
            ? `${repo} has no file ${wanted}: it has no .gguf files at all (Keel serves GGUF models; OpenVINO IR repositories wait for issue #11)`
            : `${repo} has no file ${wanted}; its .gguf files: ${list}`);
    }
    if (ggufs.length === 1) return ggufs[0]!;
    if (ggufs.length === 0) throw new HubError("no-gguf", `${repo} has no .gguf file (Keel serves GGUF models; OpenVINO IR repositories wait for issue #11)`);
    throw new HubError("no-gguf", `${repo} has ${ggufs.length} .gguf files; pick one with --gguf_filename: ${list}`);
}

/** The message of an error and of its cause (fetch wraps the socket error in `cause`). */
function causeOf(err: unknown): string {
    const e = err as Error & {cause?: {code?: string; message?: string}};
    return e.cause ? `${e.message} (${e.cause.code ?? e.cause.message})` : String(e?.message ?? err);
}

/** Size of a file, or 0 when it does not exist. */
async function sizeOf(file: string): Promise<number> {
    try {
        return (await stat(file)).size;
    } catch {
        return 0;
    }
}

/** Hashes the first `bytes` bytes of `file` into a fresh sha256. */
async function hashPrefix(file: string, bytes: number): Promise<Hash> {
    const hash = createHash("sha256");
    if (bytes === 0) return hash;
    for await (const chunk of createReadStream(file, {start: 0, end: bytes - 1})) hash.update(chunk as Buffer);
    return hash;
}

/** Outcome of one HTTP attempt of a download. */
type AttemptOutcome =
    /** The whole file is in the `.part`. */
    | {kind: "complete"}
    /** The connection failed or dropped after `received` bytes of the whole file; worth another attempt. */
    | {kind: "dropped"; reason: string};

/**
 * Downloads `file` of `repo` to `dest` (resuming `dest.part`), verifies it and renames it into place.
 * @returns what was verified. @throws HubError
 */
export async function downloadHubFile(repo: string, file: HubFile, dest: string, opts: HubOptions = {}): Promise<"sha256" | "size"> {
    const endpoint = opts.endpoint ?? hubEndpoint();
    const url = `${endpoint}/${repo}/resolve/main/${encodePath(file.name)}`;
    const part = `${dest}.part`;
    const log = opts.log ?? (() => undefined);
    const retries = opts.retries ?? 5;
    const backoffMs = opts.backoffMs ?? 1000;
    const idleMs = opts.idleTimeoutMs ?? 60_000;
    makeDirsSync(path.dirname(dest));
    /** Expected size and sha256; the response headers may fill them when the file list did not. */
    const expect = {size: file.size, sha256: file.sha256};
    // A .part longer than the file is from another version of it: start over.
    if (expect.size !== null && (await sizeOf(part)) > expect.size) await rm(part, {force: true});
    /** Bytes of the .part covered by `hash` (the hash always covers exactly the .part's contents). */
    let hashed = await sizeOf(part);
    let hash = await hashPrefix(part, hashed);
    if (hashed > 0) log(`resuming ${file.name} at ${hashed} bytes (a partial download was left by an earlier run)`);
    const progress = opts.progress?.(file.name);
    /** Why the last attempt was interrupted, for the final message. */
    let lastReason = "";
    for (let attempt = 0; ; attempt++) {
        // 1. Back off before a retry; give up after `retries` retries.
        if (attempt > 0) {
            if (attempt > retries) throw new HubError("download-failed", `downloading ${file.name} of ${repo} was interrupted ${attempt} time${attempt > 1 ? "s" : ""} (${lastReason}); ${hashed > 0 ? `the partial file ${part} is kept and a later run continues it` : "nothing was received"}`);
            const wait = backoffMs * 2 ** (attempt - 1);
            log(`retrying ${file.name} in ${wait} ms (attempt ${attempt + 1} of ${retries + 1}) from byte ${hashed}`);
            await delay(wait);
        }
        // 2. One HTTP attempt from the current end of the .part.
        const outcome = await downloadAttempt();
        if (outcome.kind === "dropped") {
            lastReason = outcome.reason;
            log(`download of ${file.name} interrupted at ${hashed} bytes: ${outcome.reason}`);
            continue;
        }
        break;
    }
    // 3. Verify: sha256 when the hub gave it, else the size.
    const got = hash.digest("hex");
    const size = await sizeOf(part);
    if (expect.size !== null && size !== expect.size) {
        await rm(part, {force: true});
        throw new HubError("checksum-mismatch", `${file.name} of ${repo} has ${size} bytes, the hub says ${expect.size}; the download was removed`);
    }
    if (expect.sha256 !== null && got !== expect.sha256) {
        await rm(part, {force: true});
        throw new HubError("checksum-mismatch", `${file.name} of ${repo} has sha256 ${got}, the hub says ${expect.sha256}; the download was removed`);
    }
    // 4. Atomic rename: the final name only ever holds a verified file.
    await rename(part, dest);
    const verified = expect.sha256 !== null ? "sha256" : "size";
    log(`downloaded ${file.name} (${size} bytes, ${verified === "sha256" ? `sha256 ${got} verified` : "size verified; the hub gave no sha256"})`);
    return verified;

    /** One request: appends to the .part and updates `hashed`/`hash`; a dropped connection is an outcome, HTTP refusals throw. */
    async function downloadAttempt(): Promise<AttemptOutcome> {
        const abort = new AbortController();
        let idle = setTimeout(() => abort.abort(new Error(`no data for ${idleMs} ms`)), idleMs);
        const touch = (): void => {
            clearTimeout(idle);
            idle = setTimeout(() => abort.abort(new Error(`no data for ${idleMs} ms`)), idleMs);
        };
        try {
            const headers: Record<string, string> = {...authHeaders(opts), ...(hashed > 0 ? {range: `bytes=${hashed}-`} : {})};
            let res: Response;
            try {
                res = await fetch(url, {headers, signal: abort.signal, redirect: "follow"});
            } catch (err) {
                return {kind: "dropped", reason: causeOf(err)};
            }
            // a. The status: 206 continues, 200 restarts, 416 means the .part already holds everything (or is bogus).
            if (res.status === 416) {
                await res.body?.cancel();
                if (expect.size !== null && hashed === expect.size) return {kind: "complete"};
                log(`the hub refused to resume ${file.name} at byte ${hashed}; starting over`);
                await truncate(part, 0);
                hashed = 0;
                hash = createHash("sha256");
                return {kind: "dropped", reason: "range not satisfiable"};
            }
            if (res.status >= 500 || res.status === 429) {
                await res.body?.cancel();
                return {kind: "dropped", reason: `HTTP ${res.status}`};
            }
            if (res.status !== 200 && res.status !== 206) {
                await res.body?.cancel();
                throw statusError(res.status, `file ${file.name} in ${repo}`, opts);
            }
            if (res.status === 200 && hashed > 0) {
                log(`the server does not resume ${file.name}; starting over`);
                await truncate(part, 0);
                hashed = 0;
                hash = createHash("sha256");
            }
            if (res.status === 206) {
                const start = Number(/bytes (\d+)-/.exec(res.headers.get("content-range") ?? "")?.[1]);
                if (start !== hashed) {
                    await res.body?.cancel();
                    throw new HubError("download-failed", `the hub resumed ${file.name} at byte ${start}, not ${hashed} as asked`);
                }
            }
            // b. Fill what the file list lacked from the headers: the whole size and an sha256 ETag.
            const total = res.status === 206 ? Number(/\/(\d+)$/.exec(res.headers.get("content-range") ?? "")?.[1]) : Number(res.headers.get("content-length"));
            if (expect.size === null && Number.isSafeInteger(total) && total > 0) expect.size = total;
            expect.sha256 ??= sha256FromEtag(res.headers.get("x-linked-etag")) ?? sha256FromEtag(res.headers.get("etag"));
            // c. Stream the body onto the end of the .part, hashing what was written.
            const out = await open(part, "a");
            try {
                progress?.(hashed, expect.size);
                if (!res.body) return {kind: "dropped", reason: "empty response"};
                for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
                    touch();
                    await out.write(chunk);
                    hash.update(chunk);
                    hashed += chunk.byteLength;
                    if (expect.size !== null && hashed > expect.size) {
                        throw new HubError("checksum-mismatch", `${file.name} of ${repo} is longer than the ${expect.size} bytes the hub says`);
                    }
                    progress?.(hashed, expect.size);
                }
            } catch (err) {
                if (err instanceof HubError) {
                    await rm(part, {force: true});
                    throw err;
                }
                return {kind: "dropped", reason: causeOf(err)};
            } finally {
                await out.close();
            }
            // d. A body that ended early without an error (a proxy that closes cleanly) is a drop too.
            if (expect.size !== null && hashed < expect.size) return {kind: "dropped", reason: `the connection closed after ${hashed} of ${expect.size} bytes`};
            return {kind: "complete"};
        } finally {
            clearTimeout(idle);
        }
    }
}

/** The directory of `repo` inside the repository root: `<root>/ORG/NAME` (OVMS's layout). */
export function hubModelDir(repositoryPath: string, repo: string): string {
    return path.resolve(repositoryPath, ...repo.split("/"));
}

/** The `.gguf` files directly in `dir` (none if it does not exist). */
async function localGgufs(dir: string): Promise<string[]> {
    try {
        return (await readdir(dir)).filter((f) => /\.gguf$/i.test(f)).sort();
    } catch {
        return [];
    }
}

/**
 * Makes sure `<repositoryPath>/ORG/NAME/<gguf>` is there, downloading it from the hub if not (or if `overwrite`).
 * A file in place — the named one, or the only `.gguf` of the directory — is used without contacting the hub.
 * @throws HubError
 */
export async function pullHubModel(req: PullRequest, opts: HubOptions = {}): Promise<PullResult> {
    checkRepoId(req.sourceModel);
    if (req.ggufFilename !== undefined) checkGgufFilename(req.ggufFilename);
    const dir = hubModelDir(req.repositoryPath, req.sourceModel);
    const log = opts.log ?? (() => undefined);
    /** The file already in place (the named one, or the directory's only `.gguf`), or null. */
    const present = async (): Promise<string | null> => {
        const found = req.ggufFilename !== undefined ? ((await sizeOf(path.join(dir, req.ggufFilename))) > 0 ? [req.ggufFilename] : []) : await localGgufs(dir);
        return found.length === 1 ? path.join(dir, found[0]!) : null;
    };
    // 1. Already pulled: no network (as OVMS, a present model is not downloaded again without --overwrite_models).
    const hit = req.overwrite ? null : await present();
    if (hit) return {path: hit, downloaded: false, verified: "existing"};
    // 2. The file list picks the GGUF (before anything is created on disk: a wrong name leaves no empty directory).
    log(`pulling ${req.sourceModel} from ${opts.endpoint ?? hubEndpoint()} into ${dir}`);
    const file = pickGguf(req.sourceModel, await hubModelFiles(req.sourceModel, opts), req.ggufFilename);
    const dest = path.join(dir, file.name);
    // 3. One puller per repository directory: two pulls appending to one .part would corrupt it. A lock whose
    //    process is gone is taken over.
    makeDirsSync(dir);
    const release = await acquireLock(path.join(dir, ".keel-pull.lock"), opts.lockPollMs ?? 500, (pid) => log(`waiting for process ${pid}, which is pulling into ${dir}`));
    try {
        // a. Another pull may have finished it while this one waited.
        if (!req.overwrite && (await sizeOf(dest)) > 0) return {path: dest, downloaded: false, verified: "existing"};
        // b. Download, verify, rename. An overwrite starts from scratch rather than from an older .part.
        if (req.overwrite) await rm(`${dest}.part`, {force: true});
        const verified = await downloadHubFile(req.sourceModel, file, dest, opts);
        return {path: dest, downloaded: true, verified};
    } finally {
        await release();
    }
}
