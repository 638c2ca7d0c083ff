/**
 * The "engine ready" log line the supervisor writes when an engine process reports ready.
 *
 * @module
 */
import type { EngineConfig } from "../../protocol/engine-config.js";
import type { ReadyMessage } from "../../protocol/messages.js";
import { llamaKvCacheBytes } from "../../model/kv-bytes.js";

/**
 * The line's text and fields: load time, backend and devices, KV capacity (tokens per sequence × sequences, and
 * bytes when the model gives its KV shape).
 */
export function describeReady(msg: ReadyMessage, kvCacheType: EngineConfig["kvCacheType"]): { text: string; fields: Record<string, unknown> } {
  const { maxModelLen, maxNumSeqs, kvPoolTokens } = msg.limits;
  // A shared pool (the OpenVINO engine) is sized by the engine itself, whose element type the gateway does not know.
  const kvBytes = kvPoolTokens !== undefined ? null : llamaKvCacheBytes(msg.model.kvElementsPerToken, kvCacheType, maxModelLen, maxNumSeqs);
  const backend = msg.backend ? (msg.backend.gpu === false ? "cpu" : msg.backend.gpu) : "unknown";
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
