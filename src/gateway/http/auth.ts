/**
 * API key (OVMS `--api_key_file`, env `API_KEY`): when a key is set, every route under /v1/ and /v3/ (generation,
 * messages, tokenize, models, config) needs `Authorization: Bearer <key>` or `x-api-key: <key>` (Anthropic's header);
 * health (/v2/health/*, KServe /v2 readiness) and /metrics stay open so probes and scrapers need no secret. The key is
 * compared in constant time and never logged.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import fs from "node:fs";

/**
 * The server's API key: the first line of `keyFile` (trailing whitespace trimmed), else env `API_KEY`, else null
 * (no auth) — OVMS's order. @throws Error naming the file when it is unreadable or its first line is empty.
 */
export function loadApiKey(keyFile: string | undefined, env: NodeJS.ProcessEnv): string | null {
  if (keyFile !== undefined) {
    let text: string;
    try {
      text = fs.readFileSync(keyFile, "utf8");
    } catch (err) {
      throw new Error(`--api_key_file ${keyFile} cannot be read: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    const key = (text.split(/\r?\n/, 1)[0] ?? "").replace(/\s+$/, "");
    if (key === "") throw new Error(`--api_key_file ${keyFile}: its first line is empty (the key is the first line)`);
    return key;
  }
  const fromEnv = env["API_KEY"];
  return fromEnv !== undefined && fromEnv !== "" ? fromEnv : null;
}

/** Whether a request to `url` needs the API key (the OpenAI/OVMS API under /v1/ and /v3/; not health or metrics). */
export function needsApiKey(url: string): boolean {
  const path = url.split("?", 1)[0] ?? "";
  return path.startsWith("/v1/") || path.startsWith("/v3/") || path === "/v1" || path === "/v3";
}

/** Outcome of checking a request's Authorization header. */
export type KeyCheck = { ok: true } | { ok: false; present: boolean };

/**
 * A checker of a request's credentials against `key`: `Authorization: Bearer <key>` (OpenAI, OVMS) or
 * `x-api-key: <key>` (Anthropic); either one matching is enough. Both sides are hashed (SHA-256) and compared with
 * timingSafeEqual, so neither the key's length nor a matching prefix shows in the time taken.
 */
export function apiKeyChecker(key: string): (authorization: string | undefined, xApiKey?: string) => KeyCheck {
  const expected = createHash("sha256").update(key, "utf8").digest();
  const matches = (token: string): boolean => timingSafeEqual(createHash("sha256").update(token, "utf8").digest(), expected);
  return (authorization, xApiKey) => {
    // 1. The scheme is case-insensitive (RFC 9110); the token is taken as is.
    const m = authorization === undefined ? null : /^Bearer\s+(.+)$/i.exec(authorization.trim());
    // 2. Compare digests of equal length in constant time; every credential sent is checked.
    const bearerOk = m !== null && matches(m[1]!);
    const xOk = xApiKey !== undefined && xApiKey !== "" && matches(xApiKey);
    if (bearerOk || xOk) return { ok: true };
    const present = (authorization !== undefined && authorization.trim() !== "") || (xApiKey !== undefined && xApiKey !== "");
    return { ok: false, present };
  };
}
