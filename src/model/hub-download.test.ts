/**
 * Hub pulls against a local fake hub (test/support/fake-hub.ts): the layout, checksum, token, resume after a dropped
 * connection and after a killed process, errors, and the no-op second run.
 */
import {randomBytes} from "node:crypto";
import {existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from "node:fs";
import {tmpdir} from "node:os";
import path from "node:path";
import {afterAll, beforeAll, beforeEach, describe, expect, it} from "vitest";
import {type FakeHub, sha256, startFakeHub} from "../../test/support/fake-hub.js";
import {HubError, pickGguf, pullHubModel, type HubOptions} from "./hub-download.js";

const tmp = mkdtempSync(path.join(tmpdir(), "keel-hub-test-"));
/** Random content: a dropped or resumed download that splices wrong bytes cannot match its sha256 by chance. */
const model = randomBytes(300_000);
const other = randomBytes(50_000);
let hub: FakeHub;
let logs: string[];
let n = 0;
/** A fresh repository root per test. */
let root: string;

beforeAll(async () => {
    hub = await startFakeHub({
        "org/tiny": {"tiny-Q8_0.gguf": {data: model}, "README.md": {data: Buffer.from("# tiny"), lfs: false}},
        "org/two": {"a.gguf": {data: model}, "sub/b.gguf": {data: other}},
        "org/none": {"openvino_model.xml": {data: Buffer.from("<xml/>")}},
        "org/plain": {"plain.gguf": {data: other, lfs: false}}
    });
});
afterAll(async () => {
    await hub.close();
    rmSync(tmp, {recursive: true, force: true});
});
beforeEach(() => {
    hub.requireToken(undefined);
    hub.requests.length = 0;
    logs = [];
    root = path.join(tmp, `repo-${n++}`);
});

const opts = (extra: HubOptions = {}): HubOptions => ({endpoint: hub.endpoint, token: "", backoffMs: 1, log: (l) => logs.push(l), ...extra});

describe("pullHubModel", () => {
    it("downloads into ROOT/ORG/NAME/FILE with the hub's sha256 verified, no .part left", async () => {
        const r = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts());
        const dest = path.join(root, "org", "tiny", "tiny-Q8_0.gguf");
        expect(r).toEqual({path: dest, downloaded: true, verified: "sha256"});
        expect(sha256(readFileSync(dest))).toBe(sha256(model));
        expect(existsSync(`${dest}.part`)).toBe(false);
    });

    it("sends HF_TOKEN as a bearer token; a hub that requires one answers a clear unauthorized error without it", async () => {
        hub.requireToken("s3cret");
        const r = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts({token: "s3cret"}));
        expect(sha256(readFileSync(r.path))).toBe(sha256(model));
        expect(hub.requests.length).toBeGreaterThanOrEqual(3); // file list, resolve, cdn
        expect(hub.requests.every((q) => q.authorization === "Bearer s3cret")).toBe(true);

        const err = await pullHubModel({sourceModel: "org/tiny", repositoryPath: path.join(root, "b")}, opts()).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(HubError);
        expect((err as HubError).failure).toBe("unauthorized");
        expect((err as HubError).message).toMatch(/HTTP 401.*set HF_TOKEN/);
        const wrong = await pullHubModel({sourceModel: "org/tiny", repositoryPath: path.join(root, "c")}, opts({token: "nope"})).catch((e: unknown) => e);
        expect((wrong as HubError).message).toMatch(/HTTP 401.*HF_TOKEN is not allowed/);
    });

    it("the token is not sent to the CDN of another origin that resolve redirects to", async () => {
        const cdn = await startFakeHub({"org/tiny": {"tiny-Q8_0.gguf": {data: model}}});
        try {
            hub.redirectCdnTo(cdn.endpoint);
            const r = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts({token: "s3cret"}));
            expect(sha256(readFileSync(r.path))).toBe(sha256(model));
            expect(hub.requests.map((q) => q.authorization)).toEqual(["Bearer s3cret", "Bearer s3cret"]); // file list, resolve
            expect(cdn.requests.map((q) => [q.url, q.authorization])).toEqual([["/cdn/org/tiny/tiny-Q8_0.gguf", undefined]]);
        } finally {
            hub.redirectCdnTo(undefined);
            await cdn.close();
        }
    });

    it("HTTP 503 from the CDN is retried with backoff; a 403 is not", async () => {
        hub.failNextFiles(2, 503);
        const r = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts());
        expect(sha256(readFileSync(r.path))).toBe(sha256(model));
        expect(hub.requests.filter((q) => q.url.startsWith("/cdn/")).length).toBe(3);
        expect(logs.filter((l) => l.endsWith(": HTTP 503")).length).toBe(2);
        hub.failNextFiles(1, 403);
        const err = (await pullHubModel({sourceModel: "org/tiny", repositoryPath: path.join(root, "b")}, opts()).catch((e: unknown) => e)) as HubError;
        expect(err.failure).toBe("unauthorized");
        expect(err.message).toBe("the hub refused file tiny-Q8_0.gguf in org/tiny (HTTP 403): it is gated or private; set HF_TOKEN to a token that may read it");
    });

    it("an unknown repository is a clear not-found error and leaves nothing on disk", async () => {
        await expect(pullHubModel({sourceModel: "org/missing", repositoryPath: root}, opts())).rejects.toThrow("the hub has no model repository org/missing (HTTP 404)");
        expect(existsSync(root)).toBe(false);
    });

    it("a connection dropped mid-file is resumed with a Range request and the file verifies", async () => {
        hub.dropNextFileAfter(120_000);
        const r = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts());
        expect(sha256(readFileSync(r.path))).toBe(sha256(model));
        const fileGets = hub.requests.filter((q) => q.url.startsWith("/cdn/"));
        expect(fileGets.length).toBe(2);
        expect(fileGets[0]!.range).toBeUndefined();
        // The second request continues where the first one stopped (at least the bytes the server flushed got there).
        const resumedAt = Number(/^bytes=(\d+)-$/.exec(fileGets[1]!.range ?? "")?.[1]);
        expect(resumedAt).toBeGreaterThan(0);
        expect(resumedAt).toBeLessThanOrEqual(120_000);
        expect(logs.some((l) => l.startsWith("download of tiny-Q8_0.gguf interrupted at"))).toBe(true);
    });

    it("a transfer that stalls is dropped after the idle timeout and resumed", async () => {
        hub.stallNextFileAfter(100_000);
        const r = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts({idleTimeoutMs: 300}));
        expect(sha256(readFileSync(r.path))).toBe(sha256(model));
        const ranges = hub.requests.filter((q) => q.url.startsWith("/cdn/")).map((q) => q.range);
        expect(ranges.length).toBe(2);
        expect(ranges[1]).toMatch(/^bytes=[1-9]\d*-$/);
        expect(logs.some((l) => /interrupted at \d+ bytes: .*no data for 300 ms/.test(l))).toBe(true);
    });

    it("retries are bounded: out of retries, the .part is kept and the next run continues it", async () => {
        hub.dropNextFileAfter(100_000);
        const err = (await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts({retries: 0})).catch((e: unknown) => e)) as HubError;
        expect(err.failure).toBe("download-failed");
        expect(err.message).toMatch(/^downloading tiny-Q8_0\.gguf of org\/tiny was interrupted 1 time \(.+\); the partial file .*tiny-Q8_0\.gguf\.part is kept and a later run continues it$/);
        const r = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts({retries: 0}));
        expect(sha256(readFileSync(r.path))).toBe(sha256(model));
        expect(hub.requests.filter((q) => q.url.startsWith("/cdn/")).map((q) => q.range)[1]).toMatch(/^bytes=[1-9]\d*-$/);
    });

    it("a .part left by a killed process is continued from its end, not downloaded again", async () => {
        const dir = path.join(root, "org", "tiny");
        mkdirSync(dir, {recursive: true});
        writeFileSync(path.join(dir, "tiny-Q8_0.gguf.part"), model.subarray(0, 100_000));
        const r = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts());
        expect(sha256(readFileSync(r.path))).toBe(sha256(model));
        expect(hub.requests.filter((q) => q.url.startsWith("/cdn/")).map((q) => q.range)).toEqual(["bytes=100000-"]);
        expect(logs).toContain("resuming tiny-Q8_0.gguf at 100000 bytes (a partial download was left by an earlier run)");
    });

    it("a leftover .part with wrong bytes fails the sha256 check and is removed", async () => {
        const dir = path.join(root, "org", "tiny");
        mkdirSync(dir, {recursive: true});
        writeFileSync(path.join(dir, "tiny-Q8_0.gguf.part"), Buffer.alloc(100_000, 7));
        const err = (await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts()).catch((e: unknown) => e)) as HubError;
        expect(err.failure).toBe("checksum-mismatch");
        expect(err.message).toContain(`the hub says ${sha256(model)}`);
        expect(existsSync(path.join(dir, "tiny-Q8_0.gguf.part"))).toBe(false);
        expect(existsSync(path.join(dir, "tiny-Q8_0.gguf"))).toBe(false);
    });

    it("a second run is a no-op without contacting the hub; --overwrite_models downloads again", async () => {
        const first = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts());
        hub.requests.length = 0;
        expect(await pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts())).toEqual({path: first.path, downloaded: false, verified: "existing"});
        expect(hub.requests).toEqual([]);
        const again = await pullHubModel({sourceModel: "org/tiny", repositoryPath: root, overwrite: true}, opts());
        expect(again.downloaded).toBe(true);
        expect(hub.requests.filter((q) => q.url.startsWith("/cdn/")).length).toBe(1);
    });

    it("two pulls of one model at once download it once (the second waits for the first's lock)", async () => {
        const [a, b] = await Promise.all([
            pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts({lockPollMs: 5})),
            pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts({lockPollMs: 5}))
        ]);
        expect(a.path).toBe(b.path);
        expect([a.downloaded, b.downloaded].sort()).toEqual([false, true]);
        expect(hub.requests.filter((q) => q.url.startsWith("/cdn/")).length).toBe(1);
        expect(sha256(readFileSync(a.path))).toBe(sha256(model));
        expect(existsSync(path.join(root, "org", "tiny", ".keel-pull.lock"))).toBe(false);
    });

    it("several GGUFs need --gguf_filename (listed); a named one in a subfolder is pulled there", async () => {
        await expect(pullHubModel({sourceModel: "org/two", repositoryPath: root}, opts())).rejects.toThrow("org/two has 2 .gguf files; pick one with --gguf_filename: a.gguf, sub/b.gguf");
        const r = await pullHubModel({sourceModel: "org/two", repositoryPath: root, ggufFilename: "sub/b.gguf"}, opts());
        expect(r.path).toBe(path.join(root, "org", "two", "sub", "b.gguf"));
        expect(sha256(readFileSync(r.path))).toBe(sha256(other));
        await expect(pullHubModel({sourceModel: "org/two", repositoryPath: root, ggufFilename: "c.gguf"}, opts())).rejects.toThrow("org/two has no file c.gguf; its .gguf files: a.gguf, sub/b.gguf");
    });

    it("a repository without GGUF files says so", async () => {
        await expect(pullHubModel({sourceModel: "org/none", repositoryPath: root}, opts())).rejects.toThrow(/^org\/none has no \.gguf file/);
    });

    it("a file without LFS metadata is verified by its size", async () => {
        const r = await pullHubModel({sourceModel: "org/plain", repositoryPath: root}, opts());
        expect(r.verified).toBe("size");
        expect(sha256(readFileSync(r.path))).toBe(sha256(other));
    });

    it("malformed repository ids and file names are refused before any request", async () => {
        await expect(pullHubModel({sourceModel: "../etc", repositoryPath: root}, opts())).rejects.toThrow(/--source_model must be a hub repository id ORG\/NAME/);
        await expect(pullHubModel({sourceModel: "org/tiny", repositoryPath: root, ggufFilename: "../x.gguf"}, opts())).rejects.toThrow(/--gguf_filename must be the relative path/);
        expect(hub.requests).toEqual([]);
    });

    it("an unreachable hub fails with a clear message after the bounded retries", async () => {
        const closed = await startFakeHub({});
        const endpoint = closed.endpoint;
        await closed.close();
        await expect(pullHubModel({sourceModel: "org/tiny", repositoryPath: root}, opts({endpoint}))).rejects.toThrow(`cannot reach the hub at ${endpoint}`);
    });
});

describe("pickGguf", () => {
    it("takes the only .gguf", () => {
        expect(pickGguf("o/n", [{name: "x.md", size: 1, sha256: null}, {name: "m.GGUF", size: 2, sha256: null}]).name).toBe("m.GGUF");
    });
});
