/**
 * Test support: the real models the test command pre-fetches (scripts/prepare.mjs) into Keel's model cache.
 * Tests on real models take their file from here; they never download anything themselves.
 */
import fs from "node:fs";
import { cachedModelFile, catalogueModel, modelCacheDir } from "../../src/model/model-cache.js";

/** The catalogue models scripts/prepare.mjs fetches for the tests. */
export const TEST_REAL_MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"] as const;

/**
 * Path of the cached GGUF of catalogue model `name` (e.g. `qwen2.5-coder-0.5b-instruct`).
 * @throws Error with how to get it when it is not in the cache (or has the wrong size)
 */
export function realModelPath(name: string): string {
  const model = catalogueModel(name);
  const file = cachedModelFile(model, modelCacheDir());
  let size = -1;
  try {
    size = fs.statSync(file).size;
  } catch {
    /* reported below */
  }
  if (size !== model.bytes) {
    throw new Error(`the real model ${name} is not in the cache (${file}${size >= 0 ? ` has ${size} bytes, expected ${model.bytes}` : " is missing"}); run \`node scripts/prepare.mjs\` (as \`npm test\` does) or \`node bin/keel.mjs fetch ${name}\``);
  }
  return file;
}
