/**
 * Test support: a local HTTP server that imitates the Hugging Face hub's file endpoints, so that pulls are tested
 * without the internet.
 *
 * - `GET /api/models/ORG/NAME` → `{id, siblings: [{rfilename, size, lfs?: {sha256, size}}]}` (404 unknown repo)
 * - `GET|HEAD /ORG/NAME/resolve/main/FILE` → 302 to `/cdn/ORG/NAME/FILE` with `X-Linked-Etag` (sha256) and `X-Linked-Size`
 * - `GET /cdn/ORG/NAME/FILE` → the bytes, with `Range: bytes=N-` (206 + Content-Range) and an sha256 `ETag`
 * - a token mode: every route answers 401 unless `Authorization: Bearer <token>`
 * - a drop mode: the next file response sends part of the body and then destroys the socket (once per arm)
 * - a flaky mode: the next N file responses are an HTTP error (e.g. 503); a mode redirecting to another origin's CDN
 * - a stall mode: the next file response sends part of the body and then nothing more (once per arm)
 */
import {createHash} from "node:crypto";
import http from "node:http";
import type {AddressInfo} from "node:net";

/** One file of a fake repository. */
export interface FakeFile {
    /** Its content. */
    data: Buffer;
    /** List it as an LFS file (with sha256) in the file list; default true. */
    lfs?: boolean;
}

/** One request the fake hub saw. */
export interface SeenRequest {
    method: string;
    url: string;
    authorization: string | undefined;
    range: string | undefined;
}

/** A running fake hub. */
export interface FakeHub {
    /** Base URL for HF_ENDPOINT, e.g. http://127.0.0.1:PORT. */
    endpoint: string;
    /** Every request, in order. */
    requests: SeenRequest[];
    /** The next file body is cut after `afterBytes` bytes (the socket is destroyed), once. */
    dropNextFileAfter(afterBytes: number): void;
    /** The next file body stops after `afterBytes` bytes and the connection stays open, silent (a hung transfer), once. */
    stallNextFileAfter(afterBytes: number): void;
    /** The next `n` file responses answer HTTP `status` instead (a flaky CDN). */
    failNextFiles(n: number, status: number): void;
    /** `resolve` redirects to this base URL's `/cdn/…` (another fake hub: another origin) instead of its own. */
    redirectCdnTo(base: string | undefined): void;
    /** Require this bearer token from now on (undefined = none). */
    requireToken(token: string | undefined): void;
    close(): Promise<void>;
}

/** sha256 hex of a buffer. */
export function sha256(data: Buffer): string {
    return createHash("sha256").update(data).digest("hex");
}

/**
 * Starts a fake hub on a loopback ephemeral port serving `repos` (`"ORG/NAME"` → file path → file).
 */
export async function startFakeHub(repos: Record<string, Record<string, FakeFile>>): Promise<FakeHub> {
    const requests: SeenRequest[] = [];
    /** Bytes after which the next file body is cut, or null. */
    let dropAfter: number | null = null;
    /** Bytes after which the next file body stalls, or null. */
    let stallAfter: number | null = null;
    /** File responses still to fail, and with which status. */
    let failing = {n: 0, status: 503};
    /** Base URL of the CDN `resolve` redirects to ("" = this server). */
    let cdnBase = "";
    /** The bearer token required, or undefined. */
    let token: string | undefined;

    const server = http.createServer((req, res) => {
        const url = new URL(req.url ?? "/", "http://x");
        requests.push({method: req.method ?? "", url: url.pathname + url.search, authorization: req.headers.authorization, range: req.headers.range});
        if (token !== undefined && req.headers.authorization !== `Bearer ${token}`) {
            res.writeHead(401, {"content-type": "application/json"}).end(JSON.stringify({error: "Invalid credentials in Authorization header"}));
            return;
        }
        const parts = url.pathname.split("/").slice(1).map(decodeURIComponent);
        // 1. The file list.
        if (parts[0] === "api" && parts[1] === "models" && parts.length === 4) {
            const id = `${parts[2]}/${parts[3]}`;
            const files = repos[id];
            if (!files) {
                res.writeHead(404, {"content-type": "application/json"}).end(JSON.stringify({error: "Repository not found"}));
                return;
            }
            const siblings = Object.entries(files).map(([name, f]) => (f.lfs === false
                ? {rfilename: name, size: f.data.length}
                : {rfilename: name, size: f.data.length, lfs: {sha256: sha256(f.data), size: f.data.length}}));
            res.writeHead(200, {"content-type": "application/json"}).end(JSON.stringify({id, siblings}));
            return;
        }
        // 2. resolve → redirect to the "CDN", with the LFS headers the hub sends.
        if (parts.length >= 5 && parts[2] === "resolve" && parts[3] === "main") {
            const id = `${parts[0]}/${parts[1]}`;
            const name = parts.slice(4).join("/");
            const f = repos[id]?.[name];
            if (!f) {
                res.writeHead(404).end("Entry not found");
                return;
            }
            res.writeHead(302, {
                location: `${cdnBase}/cdn/${id}/${name.split("/").map(encodeURIComponent).join("/")}`,
                ...(f.lfs === false ? {} : {"x-linked-etag": `"${sha256(f.data)}"`, "x-linked-size": String(f.data.length)})
            }).end();
            return;
        }
        // 3. The "CDN": the bytes, with Range.
        if (parts[0] === "cdn" && parts.length >= 4) {
            const f = repos[`${parts[1]}/${parts[2]}`]?.[parts.slice(3).join("/")];
            if (!f) {
                res.writeHead(404).end();
                return;
            }
            if (failing.n > 0) {
                failing.n -= 1;
                res.writeHead(failing.status).end("try again");
                return;
            }
            const m = /^bytes=(\d+)-$/.exec(req.headers.range ?? "");
            const start = m ? Number(m[1]) : 0;
            if (start >= f.data.length && m) {
                res.writeHead(416, {"content-range": `bytes */${f.data.length}`}).end();
                return;
            }
            const body = f.data.subarray(start);
            res.writeHead(m ? 206 : 200, {
                "content-length": String(body.length),
                "accept-ranges": "bytes",
                etag: f.lfs === false ? `"w-${f.data.length}"` : `"${sha256(f.data)}"`,
                ...(m ? {"content-range": `bytes ${start}-${f.data.length - 1}/${f.data.length}`} : {})
            });
            if (req.method === "HEAD") {
                res.end();
                return;
            }
            if (dropAfter !== null && dropAfter < body.length) {
                const cut = dropAfter;
                dropAfter = null;
                // Send the first bytes, then kill the connection once they are flushed: a dropped connection mid-file.
                res.write(body.subarray(0, cut), () => res.socket?.destroy());
                return;
            }
            if (stallAfter !== null && stallAfter < body.length) {
                const cut = stallAfter;
                stallAfter = null;
                res.write(body.subarray(0, cut)); // and never the rest: close() ends the connection
                return;
            }
            res.end(body);
            return;
        }
        res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const {port} = server.address() as AddressInfo;
    return {
        endpoint: `http://127.0.0.1:${port}`,
        requests,
        dropNextFileAfter: (n) => (dropAfter = n),
        stallNextFileAfter: (n) => (stallAfter = n),
        failNextFiles: (n, status) => (failing = {n, status}),
        redirectCdnTo: (base) => (cdnBase = base ?? ""),
        requireToken: (t) => (token = t),
        close: () => new Promise<void>((resolve) => {
            server.closeAllConnections();
            server.close(() => resolve());
        })
    };
}
