/**
 * The KV side of llama.cpp: which models can rewind a sequence to a shorter prefix (attention KV) and which cannot
 * (recurrent state), KV size per token for the gateway's capacity figures, and the slot trims and clears.
 */
import type { NativeCallGuard, NativeContext } from "./internals.js";

/**
 * GGUF architectures whose memory includes recurrent state (llama.cpp `llm_arch_is_recurrent` / `_is_hybrid`):
 * such state cannot be partially removed (`llama_memory_seq_rm` fails for a partial range).
 */
const RECURRENT_ARCHITECTURES = new Set([
  "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "jamba", "falcon-h1", "granitehybrid", "plamo2",
  "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen3next", "qwen35", "qwen35moe", "kimi-linear", "minimax-01",
]);

/** KV elements per token (K + V over all layers) from GGUF hyperparameters; null when they are missing. */
export function kvElementsPerToken(meta: Record<string, Record<string, unknown> | undefined>): number | null {
  const arch = String(meta["general"]?.["architecture"] ?? "");
  const h = meta[arch] as Record<string, unknown> | undefined;
  const att = (h?.["attention"] ?? {}) as Record<string, unknown>;
  const num = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const layers = num(h?.["block_count"]);
  const heads = num(att["head_count"]);
  const kvHeads = num(att["head_count_kv"]) ?? heads;
  const embd = num(h?.["embedding_length"]);
  if (layers === null || heads === null || kvHeads === null || embd === null || heads === 0) return null;
  const keyLen = num(att["key_length"]) ?? embd / heads;
  const valueLen = num(att["value_length"]) ?? embd / heads;
  return layers * kvHeads * (keyLen + valueLen);
}

/**
 * False for models with recurrent state (SSM / linear attention, alone or hybrid), whose state cannot be rewound to
 * a shorter prefix. node-llama-cpp's insights mirror llama.cpp's llm_arch_is_recurrent / _is_hybrid; the name list
 * is a fallback.
 */
export function supportsPartialTrim(insights: { isRecurrent?: boolean; isHybrid?: boolean }, architecture: string): boolean {
  if (insights.isRecurrent || insights.isHybrid) return false;
  return !RECURRENT_ARCHITECTURES.has(architecture);
}

/** Trims and clears of the context's sequences (slots); only between decodes. */
export class LlamaKv {
  constructor(
    private readonly ctx: NativeContext,
    private readonly guard: NativeCallGuard,
  ) {}

  /**
   * Keep the first `keep` tokens of a slot's KV and drop the rest (keep = 0 clears it). Returns false when llama.cpp
   * cannot trim this memory partially (recurrent state); the slot is then cleared completely.
   */
  trim(slot: number, keep: number): boolean {
    this.guard.assertIdle("trimSequence()");
    if (keep <= 0) {
      this.ctx.disposeSequence(slot);
      return true;
    }
    const ok = this.ctx.removeTokenCellsFromSequence(slot, keep, -1);
    if (!ok) this.ctx.disposeSequence(slot);
    return ok;
  }

  /** Free a slot's KV cells at once. */
  clear(slot: number): void {
    this.guard.assertIdle("clearSequence()");
    this.ctx.disposeSequence(slot);
  }
}
