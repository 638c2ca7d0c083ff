/**
 * The capacity rule of one model's engine, shared by `keel serve` flags (cli.ts) and `--config_path` entries
 * (cli/serve-config.ts): tokens per sequence from an explicit max_model_len, the model's trained context and the KV
 * budget (`cache_size`, GB over all sequences, as OVMS's).
 *
 * llama.cpp splits the budget evenly (one KV partition per sequence). The OpenVINO engine has one pool shared by all
 * sequences (`num_kv_blocks` blocks, else `cache_size` GB, else max_model_len × max_num_seqs): one sequence may use all of it,
 * never more, so max_model_len defaults to min(trained context, 4096, pool) and a longer explicit one is refused —
 * a sequence outgrowing the pool would turn every request in flight IGNORED (openvino-engine.md §7).
 *
 * @module
 */
import { kvBytesPerToken, llamaKvElementBytes, OPENVINO_KV_ELEMENT_BYTES } from "../model/kv-bytes.js";

/** What the rule reads from the model (the startup model check). */
export interface CapacityModel {
  trainContextSize: number;
  /** KV elements per token over all layers, or null when the GGUF does not say. */
  kvElementsPerToken: number | null;
}

/** Tokens per sequence and why (for the start log). @throws Error with a flag-neutral reason (callers prefix it). */
export function kvCapacity(
  meta: CapacityModel,
  opts: {
    maxModelLen?: number | undefined;
    cacheGb: number;
    maxNumSeqs: number;
    u8: boolean;
    /** Default llama.cpp (a partition per sequence). */
    engine?: "llama.cpp" | "openvino";
    /** OpenVINO: `--num_kv_blocks` (wins over cacheGb, as in OpenVINO GenAI). */
    kvBlocks?: number | undefined;
    /** OpenVINO: tokens per KV block (32 on CPU, 16 on GPU). */
    blockTokens?: number;
    /** OpenVINO: bytes per KV element for `cacheGb` (default: u8 1, else 2). */
    kvElementBytes?: number;
  },
): { maxModelLen: number; note: string; poolTokens?: number } {
  const explicit = opts.maxModelLen;
  // As vLLM: a context longer than the model was trained for gives garbage and costs memory.
  if (explicit !== undefined && explicit > meta.trainContextSize) throw new Error(`max_model_len ${explicit} exceeds the model's trained context of ${meta.trainContextSize} tokens`);
  if (opts.engine === "openvino") return sharedPoolCapacity(meta, explicit, opts);
  if (opts.cacheGb <= 0) {
    return explicit !== undefined
      ? { maxModelLen: explicit, note: "--max_model_len" }
      : { maxModelLen: Math.min(meta.trainContextSize, 4096), note: `the default max_model_len min(trained context ${meta.trainContextSize}, 4096)` };
  }
  // Split the KV budget evenly across sequences (node-llama-cpp gives each sequence its own KV partition).
  if (meta.kvElementsPerToken === null) throw new Error("cache_size needs the model's KV shape, which its GGUF metadata does not give");
  const bytesPerToken = kvBytesPerToken(meta.kvElementsPerToken, llamaKvElementBytes(opts.u8 ? "q8_0" : "f16"));
  const perSequence = Math.floor((opts.cacheGb * 1e9) / opts.maxNumSeqs / bytesPerToken);
  if (perSequence < 16) {
    throw new Error(`cache_size ${opts.cacheGb} GB gives ${perSequence} tokens per sequence for ${opts.maxNumSeqs} sequences (${bytesPerToken} bytes per token); raise it or lower max_num_seqs`);
  }
  // The budget decides the capacity (as OVMS's cache_size), bounded by an explicit max_model_len and by the model's
  // trained context.
  const bound = explicit ?? meta.trainContextSize;
  if (perSequence < bound) {
    return { maxModelLen: perSequence, note: `--cache_size ${opts.cacheGb} GB / ${opts.maxNumSeqs} sequences / ${bytesPerToken.toFixed(0)} bytes per token` };
  }
  const by = explicit !== undefined ? "--max_model_len" : `the model's trained context ${meta.trainContextSize}`;
  return { maxModelLen: bound, note: `${by} (--cache_size ${opts.cacheGb} GB would hold ${perSequence} tokens per sequence; the unused budget is not allocated)` };
}

/** The OpenVINO engine's rule: one pool shared by every sequence; a sequence may fill it but never outgrow it. */
function sharedPoolCapacity(
  meta: CapacityModel,
  explicit: number | undefined,
  opts: { cacheGb: number; u8: boolean; kvBlocks?: number | undefined; blockTokens?: number; kvElementBytes?: number },
): { maxModelLen: number; note: string; poolTokens?: number } {
  // 1. The pool in tokens: blocks × block size, else the GB budget over the model's KV bytes per token, else not
  //    fixed by a flag (the engine then sizes it max_model_len × max_num_seqs, which always holds one sequence).
  let pool: number | null = null;
  let what = "";
  /** The flag that sized the pool (error messages start with it; the CLI adds the dashes). */
  let flag = "";
  const blockTokens = opts.blockTokens ?? 32;
  if (opts.kvBlocks !== undefined) {
    pool = opts.kvBlocks * blockTokens;
    what = `--num_kv_blocks ${opts.kvBlocks} x ${blockTokens} tokens`;
    flag = `num_kv_blocks ${opts.kvBlocks}`;
  } else if (opts.cacheGb > 0) {
    if (meta.kvElementsPerToken === null) throw new Error("cache_size needs the model's KV shape, which its metadata does not give; use num_kv_blocks");
    const bytesPerToken = kvBytesPerToken(meta.kvElementsPerToken, opts.kvElementBytes ?? OPENVINO_KV_ELEMENT_BYTES[opts.u8 ? "u8" : "f16"]!);
    // Whole blocks (the engine allocates blocks, never more than the budget).
    pool = Math.floor((opts.cacheGb * 1e9) / bytesPerToken / blockTokens) * blockTokens;
    what = `--cache_size ${opts.cacheGb} GB / ${bytesPerToken.toFixed(0)} bytes per token`;
    flag = `cache_size ${opts.cacheGb}`;
  }
  const byDefault = `the default max_model_len min(trained context ${meta.trainContextSize}, 4096)`;
  if (pool === null) return explicit !== undefined ? { maxModelLen: explicit, note: "--max_model_len" } : { maxModelLen: Math.min(meta.trainContextSize, 4096), note: byDefault };
  // 2. One sequence must fit the pool less one block (the engine keeps a block of headroom for the next token: a
  //    sequence outgrowing the pool ends IGNORED in OpenVINO GenAI).
  const usable = pool - blockTokens;
  if (usable < 16) throw new Error(`${flag} gives a KV pool of ${pool} tokens (${what}), too small for one sequence of 16 tokens plus a block of headroom; raise it`);
  if (explicit !== undefined) {
    if (explicit > usable) throw new Error(`max_model_len ${explicit} exceeds what one sequence may hold in the KV pool of ${pool} tokens (${what}) less one block of headroom: ${usable}; lower it or enlarge the pool`);
    return { maxModelLen: explicit, note: `--max_model_len (KV pool ${pool} tokens shared by all sequences: ${what})`, poolTokens: pool };
  }
  const fallback = Math.min(meta.trainContextSize, 4096);
  return usable < fallback
    ? { maxModelLen: usable, note: `the KV pool of ${pool} tokens shared by all sequences, less one block of headroom (${what})`, poolTokens: pool }
    : { maxModelLen: fallback, note: `${byDefault}; KV pool ${pool} tokens shared by all sequences (${what})`, poolTokens: pool };
}
