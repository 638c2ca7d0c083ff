import { describe, expect, it } from "vitest";
import { corsHeaders, OPEN_CORS, parseCsvFlag, type CorsPolicy } from "./cors.js";

const only: CorsPolicy = { origins: ["http://app.example", "http://b.example"], methods: ["GET", "POST"], headers: ["content-type", "authorization"], credentials: false };

describe("corsHeaders", () => {
  it("OVMS defaults: any origin reads (literal *), a preflight is told what it asked for", () => {
    const h = corsHeaders(OPEN_CORS, { origin: "http://x.example", requestMethod: "POST", requestHeaders: "authorization, content-type" }, true);
    expect(h["access-control-allow-origin"]).toBe("*");
    expect(h["access-control-allow-methods"]).toBe("POST");
    // Authorization is never covered by a literal `*`, so the asked headers are echoed.
    expect(h["access-control-allow-headers"]).toBe("authorization, content-type");
    expect(h["access-control-max-age"]).toBe("600");
    expect(h["vary"]).toBeUndefined();
  });

  it("a listed origin is echoed with Vary: Origin; an unlisted one gets no Allow-Origin", () => {
    expect(corsHeaders(only, { origin: "http://b.example" }, false)).toMatchObject({ "access-control-allow-origin": "http://b.example", vary: "Origin" });
    const refused = corsHeaders(only, { origin: "http://evil.example" }, false);
    expect(refused["access-control-allow-origin"]).toBeUndefined();
    expect(refused["vary"]).toBe("Origin");
    expect(refused["access-control-allow-credentials"]).toBeUndefined();
  });

  it("lists are sent as configured (not echoed) when they are not *", () => {
    const h = corsHeaders(only, { origin: "http://app.example", requestMethod: "DELETE", requestHeaders: "x-other" }, true);
    expect(h["access-control-allow-methods"]).toBe("GET, POST");
    expect(h["access-control-allow-headers"]).toBe("content-type, authorization");
  });

  it("with credentials, * answers with the caller's origin (browsers refuse a literal * then) and allows credentials", () => {
    const h = corsHeaders({ ...OPEN_CORS, credentials: true }, { origin: "http://x.example" }, false);
    expect(h).toMatchObject({ "access-control-allow-origin": "http://x.example", "access-control-allow-credentials": "true", vary: "Origin" });
    const noOrigin = corsHeaders({ ...OPEN_CORS, credentials: true }, {}, false);
    expect(noOrigin["access-control-allow-origin"]).toBeUndefined();
    expect(noOrigin["access-control-allow-credentials"]).toBeUndefined();
  });
});

describe("parseCsvFlag", () => {
  it("splits and trims; an empty list is refused naming the flag", () => {
    expect(parseCsvFlag("allowed_origins", " http://a , http://b,")).toEqual(["http://a", "http://b"]);
    expect(() => parseCsvFlag("allowed_origins", " , ")).toThrow(/--allowed_origins must list at least one value/);
  });
});
