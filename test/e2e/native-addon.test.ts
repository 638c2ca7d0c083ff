/**
 * End to end: `keel serve` runs Keel's native addon (one synchronous call samples a step; src/native) and says so in
 * its engine_ready event; with KEEL_NATIVE_SAMPLING=off it runs node-llama-cpp's own addon, says that, and logs the
 * reason once. Generation works either way.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { buildNativeAddon, getLlamaBinDir } from "../../src/native/build.js";
import { chat } from "../support/chat-client.js";
import { startServer } from "../support/server.js";

beforeAll(async () => {
  // The directories the engine's getLlama loads from (device cpu and auto), as `node scripts/prepare.mjs` builds them.
  for (const gpu of [false, "auto"] as const) {
    const dir = await getLlamaBinDir(gpu);
    if (dir !== null) await buildNativeAddon({ binDir: dir });
  }
}, 300_000);

/** Parsed JSON log lines with `event` (gateway and engine). */
const events = (logs: string[]) =>
  logs.flatMap((l) => {
    try {
      return [JSON.parse(l) as Record<string, unknown>];
    } catch {
      return [];
    }
  });

describe("Keel's native addon in the served engine", () => {
  for (const mode of ["keel", "off"] as const) {
    it(mode === "keel" ? "runs Keel's addon by default and names it in engine_ready" : "KEEL_NATIVE_SAMPLING=off: node-llama-cpp's addon, named, with one reason line", async () => {
      const server = await startServer([], mode === "off" ? { KEEL_NATIVE_SAMPLING: "off" } : {});
      try {
        const r = await chat(server.baseUrl, { model: "keel-tiny", messages: [{ role: "user", content: "hello" }], max_tokens: 8, temperature: 0 });
        expect(r.status).toBe(200);
        expect(r.text.length).toBeGreaterThan(0);
        const all = events(server.logs);
        const ready = all.filter((e) => e["event"] === "engine_ready");
        expect(ready).toHaveLength(1);
        expect(ready[0]!["addon"]).toBe(mode === "keel" ? "keel" : "node-llama-cpp");
        const fallback = server.logs.filter((l) => l.includes("native_addon_fallback"));
        if (mode === "keel") expect(fallback).toHaveLength(0);
        else {
          expect(fallback).toHaveLength(1);
          expect(fallback[0]).toContain("KEEL_NATIVE_SAMPLING=off");
        }
      } finally {
        await server.stop();
      }
    });
  }
});
