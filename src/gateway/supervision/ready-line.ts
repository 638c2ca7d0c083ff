/**
 * The "engine ready" log line the supervisor writes when an engine process reports ready, and the server's one
 * "ready: URL (…)" line once every model's engine is ready.
 *
 * @module
 */
import type { EngineConfig } from "../../protocol/engine-config.js";
import type { ReadyMessage } from "../../protocol/messages.js";
import { llamaKvCacheBytes } from "../../model/kv-bytes.js";

/** The backend an engine reported, as the log lines name it: "cpu", the GPU backend's name, or "unknown". */
function backendName(msg: ReadyMessage): string {
  return msg.backend ? (msg.backend.gpu === false ? "cpu" : msg.backend.gpu) : "unknown";
}

/** The URL clients reach a listening address at (an IPv6 address in brackets). */
export function serverUrl(address: { address: string; family: string; port: number }): string {
  return `http://${address.family === "IPv6" ? `[${address.address}]` : address.address}:${address.port}`;
}

/**
 * The line that says the server is ready: where, and what answers there — `ready: URL (model NAME, engine E, backend
 * B)`, or with several models `ready: URL (models A: engine E, backend B; C: …)`.
 */
export function describeServerReady(url: string, models: { name: string; ready: ReadyMessage }[]): string {
  const each = models.map((m) => `engine ${m.ready.engine}, backend ${backendName(m.ready)}`);
  if (models.length === 1) return `ready: ${url} (model ${models[0]!.name}, ${each[0]!})`;
  return `ready: ${url} (models ${models.map((m, i) => `${m.name}: ${each[i]!}`).join("; ")})`;
}

/**
 * The line's text and fields: load time, backend and devices, KV capacity (tokens per sequence × sequences, and
 * bytes when the model gives its KV shape).
 */
export function describeReady(msg: ReadyMessage, kvCacheType: EngineConfig["kvCacheType"]): { text: string; fields: Record<string, unknown> } {
  const { maxModelLen, maxNumSeqs, kvPoolTokens } = msg.limits;
  // A shared pool (the OpenVINO engine) is sized by the engine itself, whose element type the gateway does not know.
  const kvBytes = kvPoolTokens !== undefined ? null : llamaKvCacheBytes(msg.model.kvElementsPerToken, kvCacheType, maxModelLen, maxNumSeqs);
  const backend = backendName(msg);
  const devices = msg.backend?.devices ?? [];
  const parts = [
    msg.loadMs !== undefined ? `in ${(msg.loadMs / 1000).toFixed(1)} s` : null,
    msg.warmupMs !== undefined ? `warm-up ${(msg.warmupMs / 1000).toFixed(2)} s` : null,
    `backend ${backend}${devices.length > 0 ? ` (${devices.join(", ")})` : ""}`,
    kvPoolTokens !== undefined
      ? `KV pool ${kvPoolTokens} tokens shared by ${maxNumSeqs} sequences (up to ${maxModelLen} per sequence)`
      : `KV capacity ${maxModelLen} tokens per sequence x ${maxNumSeqs} sequences${kvBytes !== null ? ` (${(kvBytes / 1e6).toFixed(1)} MB ${kvCacheType})` : ""}`,
  ].filter((p) => p !== null);
  return { text: `engine ready ${parts.join("; ")}`, fields: { loadMs: msg.loadMs ?? null, ...(msg.warmupMs !== undefined ? { warmupMs: msg.warmupMs } : {}), backend, devices, ...(msg.backend?.addon ? { addon: msg.backend.addon } : {}), kvBytes, ...(kvPoolTokens !== undefined ? { kvPoolTokens } : {}) } };
}
