import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import pino from "pino";
import { afterAll, describe, expect, it } from "vitest";
import type { ReadyMessage } from "../../protocol/messages.js";
import { defaultLogFormat, formatLogLine, logDestination } from "./logging.js";
import { describeReady, describeServerReady, serverUrl } from "../supervision/ready-line.js";

describe("log format", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "keel-log-"));
  afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

  it("JSON unless stdout is a terminal", () => {
    expect([defaultLogFormat(true), defaultLogFormat(false)]).toEqual(["text", "json"]);
  });

  it("a pino line becomes time, level, component, message and key=value fields", () => {
    const line = JSON.stringify({ level: 40, time: Date.UTC(2026, 0, 2, 3, 4, 5, 6), pid: 7, component: "gateway", msg: "slow client", requestId: "r 1", bytes: 12, nested: { a: 1 } });
    expect(formatLogLine(line)).toBe('03:04:05.006 WARN  gateway slow client requestId="r 1" bytes=12 nested={"a":1}');
    expect(formatLogLine("not json")).toBe("not json");
  });

  it("an engine line the gateway relays (under `engine`) prints as the engine's, with its fields", () => {
    const engine = { level: "info", time: 1, component: "engine", pid: 9, msg: "model loaded", event: "creating_context" };
    const line = JSON.stringify({ level: 30, time: Date.UTC(2026, 0, 2, 3, 4, 5, 6), pid: 7, component: "gateway", engine, msg: "model loaded", model: "m" });
    expect(formatLogLine(line)).toBe("03:04:05.006 INFO  engine model loaded model=m event=creating_context");
  });

  it("a multi-line message stays one line (its breaks as \\n, trailing blank lines dropped); an engine's stderr line is the engine's", () => {
    const fatal = JSON.stringify({ level: 50, time: Date.UTC(2026, 0, 2, 3, 4, 5, 6), component: "gateway", engine: { level: "fatal", msg: "x" }, msg: "engine failed: A:\nB:\nC\n\n\n" });
    expect(formatLogLine(fatal)).toBe("03:04:05.006 ERROR engine engine failed: A:\\nB:\\nC");
    const stderr = JSON.stringify({ level: 30, time: Date.UTC(2026, 0, 2, 3, 4, 5, 6), component: "gateway", engineStream: "stderr", msg: "onednn_verbose,v1,info" });
    expect(formatLogLine(stderr)).toBe("03:04:05.006 INFO  engine onednn_verbose,v1,info engineStream=stderr");
  });

  it("--log_path writes the log to that file, in the chosen format", () => {
    const file = path.join(dir, "keel.log");
    const log = pino({ base: { component: "gateway" } }, logDestination({ format: "text", path: file }));
    log.info({ event: "x" }, "hello");
    const json = pino({ base: { component: "gateway" } }, logDestination({ format: "json", path: file }));
    json.warn("second");
    const lines = fs.readFileSync(file, "utf8").trim().split("\n");
    expect(lines[0]).toMatch(/^\d\d:\d\d:\d\d\.\d{3} INFO  gateway hello event=x$/);
    expect(JSON.parse(lines[1]!)).toMatchObject({ level: 40, msg: "second" });
  });

  it("--log_path creates missing folders; one that cannot be made (e.g. under /proc) is an error, never a spin", () => {
    const nested = path.join(dir, "a", "b", "keel.log");
    pino(logDestination({ format: "json", path: nested })).info("x");
    expect(fs.readFileSync(nested, "utf8")).toContain('"msg":"x"');
    expect(() => logDestination({ format: "json", path: "/proc/keel-no-such-pid/x.log" })).toThrow(/ENOENT|EACCES|EROFS/);
  });
});

describe("engine ready line", () => {
  const ready = (over: Partial<ReadyMessage>): ReadyMessage => ({
    v: 1, type: "ready", pid: 1, engine: "e",
    model: { path: "m", name: null, architecture: "llama", trainContextSize: 2048, vocabSize: 10, chatTemplate: null, kvElementsPerToken: 1000, bosToken: "", eosToken: "" },
    limits: { maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 512 },
    capabilities: { exactSeededResume: true, maxTopLogprobs: 0, extendedSampling: true, grammars: true, sharedPrefill: false },
    ...over,
  });

  it("says load time, backend and devices, and KV capacity in tokens and bytes", () => {
    const r = describeReady(ready({ loadMs: 5250, backend: { gpu: "cuda", devices: ["NVIDIA H200"] } }), "f16");
    expect(r.text).toBe("engine ready in 5.3 s; backend cuda (NVIDIA H200); KV capacity 512 tokens per sequence x 4 sequences (4.1 MB f16)");
    expect(r.fields).toMatchObject({ kvBytes: 1000 * 2 * 512 * 4, backend: "cuda", devices: ["NVIDIA H200"] });
    const q8 = describeReady(ready({ backend: { gpu: false, devices: [] } }), "q8_0");
    expect(q8.fields["kvBytes"]).toBe((1000 * 34 * 512 * 4) / 32);
    expect(q8.text).toMatch(/^engine ready backend cpu; KV capacity/);
  });

  it("names the native addon the llama.cpp engine runs (Keel's build or node-llama-cpp's own) in a field", () => {
    const keel = describeReady(ready({ backend: { gpu: false, devices: [], addon: "keel" } }), "f16");
    expect(keel.fields).toMatchObject({ addon: "keel", backend: "cpu" });
    const own = describeReady(ready({ backend: { gpu: "cuda", devices: ["NVIDIA H200"], addon: "node-llama-cpp" } }), "f16");
    expect(own.fields).toMatchObject({ addon: "node-llama-cpp", backend: "cuda" });
    // An engine that does not say (OpenVINO, older engines) gets no field.
    expect(describeReady(ready({ backend: { gpu: false, devices: [] } }), "f16").fields).not.toHaveProperty("addon");
  });

  it("an engine with one shared KV pool (limits.kvPoolTokens) is described by its pool", () => {
    const r = describeReady(ready({ limits: { maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 512, kvPoolTokens: 2048 }, backend: { gpu: false, devices: [] } }), "f16");
    expect(r.text).toBe("engine ready backend cpu; KV pool 2048 tokens shared by 4 sequences (up to 512 per sequence)");
    expect(r.fields).toMatchObject({ kvPoolTokens: 2048, kvBytes: null });
  });
});

describe("server ready line", () => {
  const ready = (engine: string, backend?: ReadyMessage["backend"]): ReadyMessage => ({
    v: 1, type: "ready", pid: 1, engine,
    model: { path: "m", name: null, architecture: "llama", trainContextSize: 2048, vocabSize: 10, chatTemplate: null, kvElementsPerToken: 1000, bosToken: "", eosToken: "" },
    limits: { maxNumSeqs: 4, maxNumBatchedTokens: 64, maxModelLen: 512 },
    capabilities: { exactSeededResume: true, maxTopLogprobs: 0, extendedSampling: true, grammars: true, sharedPrefill: false },
    ...(backend ? { backend } : {}),
  });

  it("names the URL, the model, its engine and its backend", () => {
    const url = serverUrl({ address: "0.0.0.0", family: "IPv4", port: 8000 });
    expect(describeServerReady(url, [{ name: "SmolLM2-135M-Instruct", ready: ready("node-llama-cpp@3.21.1", { gpu: false, devices: [] }) }])).toBe(
      "ready: http://0.0.0.0:8000 (model SmolLM2-135M-Instruct, engine node-llama-cpp@3.21.1, backend cpu)",
    );
  });

  it("names every model with several, and an IPv6 address in brackets", () => {
    const url = serverUrl({ address: "::1", family: "IPv6", port: 9 });
    const line = describeServerReady(url, [
      { name: "a", ready: ready("node-llama-cpp@3.21.1", { gpu: "cuda", devices: ["NVIDIA H200"] }) },
      { name: "b", ready: ready("openvino-genai@2026.2.0") },
    ]);
    expect(line).toBe("ready: http://[::1]:9 (models a: engine node-llama-cpp@3.21.1, backend cuda; b: engine openvino-genai@2026.2.0, backend unknown)");
  });
});
