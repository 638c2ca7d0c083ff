import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { apiKeyChecker, loadApiKey, needsApiKey } from "./auth.js";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "keel-auth-"));
const write = (name: string, text: string): string => {
  const p = path.join(tmp, name);
  fs.writeFileSync(p, text);
  return p;
};

describe("loadApiKey (OVMS --api_key_file, env API_KEY)", () => {
  it("takes the file's first line with trailing whitespace trimmed, ahead of API_KEY", () => {
    const file = write("key", "s3cret-key \t\r\nsecond line\n");
    expect(loadApiKey(file, { API_KEY: "from-env" })).toBe("s3cret-key");
  });

  it("falls back to API_KEY, and to no auth when neither is set or API_KEY is empty", () => {
    expect(loadApiKey(undefined, { API_KEY: "from-env" })).toBe("from-env");
    expect(loadApiKey(undefined, {})).toBeNull();
    expect(loadApiKey(undefined, { API_KEY: "" })).toBeNull();
  });

  it("an unreadable file or an empty first line is a startup error naming the file", () => {
    const missing = path.join(tmp, "missing");
    expect(() => loadApiKey(missing, {})).toThrow(new RegExp(`--api_key_file ${missing} cannot be read: ENOENT`));
    expect(() => loadApiKey(tmp, {})).toThrow(/cannot be read: EISDIR/);
    expect(() => loadApiKey(write("empty", "   \nkey-on-line-2\n"), {})).toThrow(/first line is empty/);
  });
});

describe("needsApiKey: the OpenAI/OVMS API needs it; probes and scrapers do not", () => {
  it.each([
    ["/v3/chat/completions", true],
    ["/v3/v1/completions", true],
    ["/v1/chat/completions?x=1", true],
    ["/v3/models", true],
    ["/v1/models", true],
    ["/v3/tokenize", true],
    ["/v1/config", true],
    ["/v2/health/live", false],
    ["/v2/health/ready", false],
    ["/health", false],
    ["/v2/models/m/ready", false],
    ["/metrics", false],
    ["/v10/x", false],
  ])("%s → %s", (url, expected) => {
    expect(needsApiKey(url)).toBe(expected);
  });
});

describe("apiKeyChecker", () => {
  const check = apiKeyChecker("k-123");

  it("accepts the exact key after Bearer (scheme case-insensitive)", () => {
    expect(check("Bearer k-123")).toEqual({ ok: true });
    expect(check("bearer k-123")).toEqual({ ok: true });
  });

  it("refuses a wrong key, a prefix of it, a longer one, another scheme; says whether a key was sent", () => {
    for (const h of ["Bearer k-124", "Bearer k-12", "Bearer k-1234", "Bearer K-123", "Basic k-123"]) expect(check(h)).toEqual({ ok: false, present: true });
    for (const h of [undefined, "", "  "]) expect(check(h)).toEqual({ ok: false, present: false });
  });

  it("accepts the exact key in x-api-key (Anthropic's header) too; a wrong one is refused as present", () => {
    expect(check(undefined, "k-123")).toEqual({ ok: true });
    expect(check("Bearer wrong", "k-123")).toEqual({ ok: true });
    expect(check("Bearer k-123", "wrong")).toEqual({ ok: true });
    for (const k of ["k-124", "k-12", "Bearer k-123"]) expect(check(undefined, k)).toEqual({ ok: false, present: true });
    expect(check(undefined, "")).toEqual({ ok: false, present: false });
  });
});
