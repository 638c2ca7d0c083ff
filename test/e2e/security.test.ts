/**
 * API key and CORS against a real `keel serve` (keel-tiny): 401 in the OpenAI envelope on the API routes, health and
 * metrics open, the preflight answered before auth, the key never in the logs; and a real browser (headless
 * chromium, which must be installed: `apt-get install chromium`) calling Keel from an allowed and from another origin.
 */
import { execFile } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { metrics, startServer, type ServerHandle } from "../support/server.js";

const KEY = "sk-keel-e2e-" + Math.random().toString(36).slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "keel-sec-"));
const keyFile = path.join(tmp, "key.txt");
fs.writeFileSync(keyFile, `${KEY}  \nignored second line\n`);

/** A page that calls Keel (with the key, so the browser sends a preflight) and writes the outcome into its DOM. */
function page(keelUrl: string): string {
  return `<!doctype html><html><body><pre id="out">pending</pre><script>
fetch(${JSON.stringify(keelUrl + "/v3/chat/completions")}, {
  method: "POST",
  headers: { "content-type": "application/json", authorization: "Bearer ${KEY}" },
  body: JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 3 }),
}).then((r) => r.json()).then((j) => { document.getElementById("out").textContent = "OK " + j.object + " " + j.usage.completion_tokens; })
  .catch((e) => { document.getElementById("out").textContent = "BLOCKED " + e.name; });
</script></body></html>`;
}

/** A static server for the page (its own origin: another port on 127.0.0.1). */
async function pageServer(html: () => string): Promise<{ origin: string; close(): void }> {
  const srv = http.createServer((_req, res) => res.writeHead(200, { "content-type": "text/html" }).end(html()));
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  return { origin: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, close: () => srv.close() };
}

/** Load `url` in headless chromium and return the DOM once its scripts and fetches settled. */
function dumpDom(url: string): Promise<string> {
  const args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", `--user-data-dir=${fs.mkdtempSync(path.join(tmp, "chr-"))}`, "--virtual-time-budget=20000", "--dump-dom", url];
  return new Promise((resolve, reject) => execFile("chromium", args, { timeout: 60_000 }, (err, stdout) => (err ? reject(err) : resolve(stdout))));
}

let server: ServerHandle;
let keelUrl = "";
const allowedPage = await pageServer(() => page(keelUrl));
const otherPage = await pageServer(() => page(keelUrl));

beforeAll(async () => {
  server = await startServer(["--api_key_file", keyFile, "--allowed_origins", allowedPage.origin]);
  keelUrl = server.baseUrl;
});
afterAll(async () => {
  await server?.stop();
  allowedPage.close();
  otherPage.close();
});

/** fetch with Keel's URL. */
const call = (p: string, init: RequestInit = {}): Promise<Response> => fetch(server.baseUrl + p, init);
const chatBody = JSON.stringify({ model: "keel-tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 2 });

describe("API key", () => {
  it("a generation route without the key or with a wrong one: 401 invalid_api_key in the OpenAI envelope", async () => {
    const missing = await call("/v3/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: chatBody });
    expect(missing.status).toBe(401);
    expect(missing.headers.get("www-authenticate")).toBe("Bearer");
    expect(await missing.json()).toEqual({ error: { message: expect.stringMatching(/^Missing API key/), type: "invalid_request_error", param: null, code: "invalid_api_key" } });
    const wrong = await call("/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${KEY}x` }, body: chatBody });
    expect(wrong.status).toBe(401);
    expect(((await wrong.json()) as { error: { message: string } }).error.message).toMatch(/^Incorrect API key/);
    // A percent-encoded path routes like its decoded form and is guarded like it.
    for (const p of ["/v3/models", "/v1/models", "/%763/models", "/v3/models?x=1"]) expect((await call(p)).status, p).toBe(401);
    const tok = await call("/v3/tokenize", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "keel-tiny", text: "a" }) });
    expect(tok.status).toBe(401);
  });

  it("the key from the file's first line (trailing spaces trimmed) is accepted", async () => {
    const ok = await call("/v3/chat/completions", { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` }, body: chatBody });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(2);
    expect((await call("/v3/models", { headers: { authorization: `Bearer ${KEY}` } })).status).toBe(200);
  });

  it("health and metrics stay open for probes and scrapers; refusals are counted; the key is never logged", async () => {
    expect((await call("/v2/health/live")).status).toBe(200);
    expect((await call("/v2/health/ready")).status).toBe(200);
    const m = await metrics(server.baseUrl);
    expect(m.get("keel_requests_unauthorized_total")).toBeGreaterThanOrEqual(5);
    expect(server.logs.some((l) => l.includes('"event":"security"') && l.includes('"apiKeyRequired":true'))).toBe(true);
    expect(server.logs.join("\n")).not.toContain(KEY);
  });

  it("KServe readiness stays open, but an unknown model's 404 names the served models only to a caller with the key", async () => {
    // Found by the attack round: the 404 of /v2/models/{unknown}/ready listed the served names to anyone.
    const anon = await call("/v2/models/no-such-model/ready");
    expect(anon.status).toBe(404);
    const anonError = ((await anon.json()) as { error: { code: string; message: string } }).error;
    expect(anonError.code).toBe("model_not_found");
    expect(anonError.message).not.toContain("keel-tiny");
    const wrong = await call("/v2/models/no-such-model/ready", { headers: { authorization: `Bearer ${KEY}x` } });
    expect(((await wrong.json()) as { error: { message: string } }).error.message).not.toContain("keel-tiny");
    const authorised = await call("/v2/models/no-such-model/ready", { headers: { authorization: `Bearer ${KEY}` } });
    expect(authorised.status).toBe(404);
    expect(((await authorised.json()) as { error: { message: string } }).error.message).toContain('Served models: "keel-tiny"');
    // A probe needs no secret for a model it names.
    expect((await call("/v2/models/keel-tiny/ready")).status).toBe(200);
  });

  it("an unreadable --api_key_file stops the start with a message naming it", async () => {
    const missing = path.join(tmp, "no-such-key");
    await expect(startServer(["--api_key_file", missing])).rejects.toThrow(new RegExp(`--api_key_file ${missing} cannot be read: ENOENT`));
  });
});

describe("CORS", () => {
  it("preflight (OPTIONS) from the allowed origin: 204 before auth, the asked method and headers allowed", async () => {
    const r = await call("/v3/chat/completions", { method: "OPTIONS", headers: { origin: allowedPage.origin, "access-control-request-method": "POST", "access-control-request-headers": "authorization,content-type" } });
    expect(r.status).toBe(204);
    expect(r.headers.get("access-control-allow-origin")).toBe(allowedPage.origin);
    expect(r.headers.get("access-control-allow-methods")).toBe("POST");
    expect(r.headers.get("access-control-allow-headers")).toBe("authorization,content-type");
    expect(r.headers.get("vary")).toBe("Origin");
  });

  it("another origin gets no Access-Control-Allow-Origin, on the preflight and on the response", async () => {
    const pre = await call("/v3/chat/completions", { method: "OPTIONS", headers: { origin: otherPage.origin, "access-control-request-method": "POST" } });
    expect(pre.status).toBe(204);
    expect(pre.headers.get("access-control-allow-origin")).toBeNull();
    const res = await call("/v3/models", { headers: { origin: otherPage.origin, authorization: `Bearer ${KEY}` } });
    expect(res.status).toBe(200);
    expect(res.headers.get("access-control-allow-origin")).toBeNull();
    // A URL that does not decode is refused before any hook: its 400 carries the CORS headers as well.
    const bad = await call("/v3/models/%E0%A4%A", { headers: { origin: allowedPage.origin } });
    expect(bad.status).toBe(400);
    expect(bad.headers.get("access-control-allow-origin")).toBe(allowedPage.origin);
    // Errors carry the CORS headers too, so a browser page can read its 401.
    const err = await call("/v3/models", { headers: { origin: allowedPage.origin } });
    expect(err.status).toBe(401);
    expect(err.headers.get("access-control-allow-origin")).toBe(allowedPage.origin);
  });

  it("a real browser: the page on the allowed origin reads Keel's answer; the same page on another origin is blocked", async () => {
    const allowed = await dumpDom(allowedPage.origin + "/");
    expect(allowed).toContain("OK chat.completion 3");
    const other = await dumpDom(otherPage.origin + "/");
    expect(other).toContain("BLOCKED TypeError");
  });
});
