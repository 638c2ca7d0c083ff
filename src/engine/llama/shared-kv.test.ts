/** When the llama.cpp engine refuses a shared KV buffer (`--kv_unified true`): no switch in the addon, or LongRoPE. */
import { describe, expect, it } from "vitest";
import { sharedKvRefusal } from "./adapter.js";

const keel = { kind: "keel" as const, path: "/cache/native/k/llama-addon.node", binDir: "/bins" };
const theirs = { kind: "node-llama-cpp" as const, reason: "KEEL_NATIVE_SAMPLING=off" };
const llamaTensors = ["token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight"];

describe("sharedKvRefusal", () => {
  it("allows a model without LongRoPE factors when the addon has the switch", () => {
    expect(sharedKvRefusal(llamaTensors, true, keel)).toBeNull();
  });

  it("refuses a LongRoPE model (rope_factors_long): its long-context factors would apply to every sequence", () => {
    expect(sharedKvRefusal([...llamaTensors, "rope_factors_long.weight", "rope_factors_short.weight"], true, keel)).toMatch(/LongRoPE factors \(rope_factors_long\)/);
    // Short factors alone are not the long-context switch.
    expect(sharedKvRefusal([...llamaTensors, "rope_factors_short.weight"], true, keel)).toBeNull();
  });

  it("names why the switch is missing: node-llama-cpp's own addon, or a Keel build without it", () => {
    expect(sharedKvRefusal(llamaTensors, false, theirs)).toBe("--kv_unified true needs Keel's native addon, which is not loaded here: KEEL_NATIVE_SAMPLING=off");
    expect(sharedKvRefusal(llamaTensors, false, keel)).toBe("--kv_unified true needs Keel's native addon, which is not loaded here: /cache/native/k/llama-addon.node has no keelContextOptions");
  });
});
