/**
 * CORS (OVMS `--allowed_origins`, `--allowed_methods`, `--allowed_headers`, `--allow_credentials`; each csv, default
 * `*` as OVMS): the headers every response carries and the answer to a preflight (OPTIONS → 204, before the API key
 * is checked, since a browser's preflight carries no key).
 */

/** The CORS settings the gateway runs with. */
export interface CorsPolicy {
  /** Origins allowed to read responses; `*` allows any. */
  origins: string[];
  /** Methods a preflight allows; `*` allows any. */
  methods: string[];
  /** Request headers a preflight allows; `*` allows any. */
  headers: string[];
  /** Adds `Access-Control-Allow-Credentials: true` (then `*` is answered with the caller's origin, as browsers need). */
  credentials: boolean;
}

/** OVMS's defaults: any origin, method and header; no credentials. */
export const OPEN_CORS: CorsPolicy = { origins: ["*"], methods: ["*"], headers: ["*"], credentials: false };

/** Split a csv flag value into trimmed, non-empty items. @throws Error naming the flag when nothing is left. */
export function parseCsvFlag(flag: string, value: string): string[] {
  const items = value.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (items.length === 0) throw new Error(`--${flag} must list at least one value (comma-separated), got "${value}"`);
  return items;
}

/** What a request says about itself that CORS answers depend on. */
export interface CorsRequest {
  /** `Origin` (absent: not a browser's cross-origin request). */
  origin?: string | undefined;
  /** `Access-Control-Request-Method` of a preflight. */
  requestMethod?: string | undefined;
  /** `Access-Control-Request-Headers` of a preflight. */
  requestHeaders?: string | undefined;
}

/**
 * The CORS headers of a response to `req`. An origin that is not allowed gets no Access-Control-Allow-Origin, so
 * the browser withholds the response.
 */
export function corsHeaders(policy: CorsPolicy, req: CorsRequest, preflight: boolean): Record<string, string> {
  const out: Record<string, string> = {};
  const any = policy.origins.includes("*");
  const allowed = req.origin !== undefined && (any || policy.origins.includes(req.origin));
  // 1. Which origin may read: `*` literally (no credentials), else the caller's own origin when it is allowed.
  if (any && !policy.credentials) out["access-control-allow-origin"] = "*";
  else if (allowed) out["access-control-allow-origin"] = req.origin!;
  // The answer depends on the caller's origin unless it is a literal `*`: caches must keep them apart.
  if (out["access-control-allow-origin"] !== "*") out["vary"] = "Origin";
  if (policy.credentials && allowed) out["access-control-allow-credentials"] = "true";
  // 2. What a preflight allows (OVMS sends these on every response). A `*` is echoed as what the preflight asks for:
  //    browsers do not let `*` cover Authorization, nor take `*` literally at all when credentials are on.
  const echo = (list: string[], asked: string | undefined): string => (list.includes("*") && preflight && asked ? asked : list.join(", "));
  out["access-control-allow-methods"] = echo(policy.methods, req.requestMethod);
  out["access-control-allow-headers"] = echo(policy.headers, req.requestHeaders);
  if (preflight) out["access-control-max-age"] = "600";
  return out;
}
