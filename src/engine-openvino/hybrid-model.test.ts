import { readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { HYBRID_MODEL_NAME, ensureHybridModel, hybridModelDir } from "./hybrid-model.js";

describe("keel-hybrid-tiny (the hybrid IR the OpenVINO suites serve)", () => {
  it("is an OpenVINO IR of a Qwen3.5-text model mixing linear-attention and full-attention layers, with its tokenizer", async () => {
    const dir = await ensureHybridModel();
    expect(dir).toBe(hybridModelDir());
    expect(path.basename(dir)).toMatch(new RegExp(`^${HYBRID_MODEL_NAME}-[0-9a-f]{12}$`));
    const cfg = JSON.parse(readFileSync(path.join(dir, "config.json"), "utf8")) as { model_type: string; layer_types: string[] };
    expect(cfg.model_type).toBe("qwen3_5_text");
    expect(new Set(cfg.layer_types)).toEqual(new Set(["linear_attention", "full_attention"]));
    // The exported graph carries the recurrent state GenAI turns into its linear-attention cache.
    const xml = readFileSync(path.join(dir, "openvino_model.xml"), "utf8");
    expect(xml).toMatch(/cache_params\.past\.ssm\.\d/); // Gated DeltaNet state
    expect(xml).toMatch(/cache_params\.past\.conv\.\d/); // its short convolution's state
    expect(xml).toMatch(/cache_params\.past\.key\.\d/); // the attention layer's KV
    expect(readFileSync(path.join(dir, "openvino_tokenizer.xml"), "utf8").length).toBeGreaterThan(1000);
  }, 600_000);

  it("lives under a name that changes with the making script's lock (a stale model is never reused)", () => {
    const a = hybridModelDir({ KEEL_CACHE_DIR: "/c" });
    expect(a.startsWith(path.join("/c", "openvino", `${HYBRID_MODEL_NAME}-`))).toBe(true);
  });
});
