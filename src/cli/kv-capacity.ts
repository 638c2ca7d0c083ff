/**
 * The capacity rule of one model's engine, shared by `keel serve` flags (cli.ts) and `--config_path` entries
 * (serve-config.ts): tokens per sequence from an explicit max_model_len, the model's trained context and the KV
 * budget (`cache_size`, GB over all sequences, as OVMS's).
 */

/** What the rule reads from the model (the startup model check). */
export interface CapacityModel {
  trainContextSize: number;
  /** KV elements per token over all layers, or null when the GGUF does not say. */
  kvElementsPerToken: number | null;
}

/** Tokens per sequence and why (for the start log). @throws Error with a flag-neutral reason (callers prefix it). */
export function kvCapacity(
  meta: CapacityModel,
  opts: { maxModelLen?: number | undefined; cacheGb: number; maxNumSeqs: number; u8: boolean },
): { maxModelLen: number; note: string } {
  const explicit = opts.maxModelLen;
  // As vLLM: a context longer than the model was trained for gives garbage and costs memory.
  if (explicit !== undefined && explicit > meta.trainContextSize) throw new Error(`max_model_len ${explicit} exceeds the model's trained context of ${meta.trainContextSize} tokens`);
  if (opts.cacheGb <= 0) {
    return explicit !== undefined
      ? { maxModelLen: explicit, note: "--max_model_len" }
      : { maxModelLen: Math.min(meta.trainContextSize, 4096), note: `the default max_model_len min(trained context ${meta.trainContextSize}, 4096)` };
  }
  // Split the KV budget evenly across sequences (node-llama-cpp gives each sequence its own KV partition).
  if (meta.kvElementsPerToken === null) throw new Error("cache_size needs the model's KV shape, which its GGUF metadata does not give");
  const bytesPerToken = meta.kvElementsPerToken * (opts.u8 ? 34 / 32 : 2); // q8_0 blocks: 32 values in 34 bytes
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
