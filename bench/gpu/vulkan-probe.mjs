#!/usr/bin/env node
// Why does node-llama-cpp's prebuilt Vulkan binary load or not on this machine? Runs its own compatibility test with
// the child's output piped (getLlama hides it), then getLlama({gpu: "vulkan"}) with debug logs, and lists the devices.
//   node bench/gpu/vulkan-probe.mjs
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const NLC = path.join(ROOT, "node_modules/node-llama-cpp/dist");
const bin = path.join(ROOT, "node_modules/@node-llama-cpp/linux-x64-vulkan/bins/linux-x64-vulkan/llama-addon.node");
const { execSync } = await import("node:child_process");
const { createRequire } = await import("node:module");
console.log("0. ldd (missing or vulkan):\n" + execSync(`ldd ${path.dirname(bin)}/*.so ${bin} 2>&1 | grep -iE "^/|not found|vulkan" || true`, { encoding: "utf8" }));
try {
  const binding = createRequire(import.meta.url)(bin);
  console.log("0. dlopen ok; exports:", Object.keys(binding).slice(0, 12).join(" "));
} catch (err) {
  console.log("0. dlopen failed:", err.message);
}
const { testBindingBinary } = await import(path.join(NLC, "bindings/utils/testBindingBinary.js"));
console.log("1. testBindingBinary(vulkan):", await testBindingBinary(bin, undefined, "vulkan", 120_000, true));
const { getLlama } = await import(path.join(NLC, "index.js"));
try {
  const llama = await getLlama({ gpu: "vulkan", build: "never", debug: true, progressLogs: "stderr" });
  console.log("2. getLlama:", llama.gpu, await llama.getGpuDeviceNames(), (await llama.getVramState()).total);
} catch (err) {
  console.log("2. getLlama failed:", err?.message ?? err);
}
