#!/usr/bin/env node
// Usage: node scripts/prepare.mjs && nice node bench/logprobs-split.mjs MODEL.gguf
// Splits adapter.logprobs into its native calls on one model: which one carries the cost.
import { LlamaAdapter } from "../dist/engine/llama/adapter.js";
const adapter = await LlamaAdapter.open({ modelPath: process.argv[2], sequences: 1, contextSize: 512, batchSize: 256, threads: 1, flashAttention: false, kvCacheType: "f16", gpu: "cpu" });
const prompt = adapter.tokenize("<|im_start|>user\nWhat is the weather in Paris today?<|im_end|>\n<|im_start|>assistant\n");
const [at] = await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
const n = adapter.native, S = n.SamplerClass;
const topK = new S(n.model); topK.applyConfig({ temperature: 1, topK: 20, topP: 1, seed: 0 });
const greedy = new S(n.model); greedy.applyConfig({ temperature: 0 });
const t = async (f, k = 100) => { for (let i = 0; i < 10; i++) await f(); const t0 = performance.now(); for (let i = 0; i < k; i++) await f(); return ((performance.now() - t0) / k * 1000).toFixed(0); };
console.log(`vocab ${adapter.vocabSize}`);
console.log("greedy, plain                    µs", await t(() => n.ctx.sampleToken(at, greedy)));
console.log("greedy + confidence (full sort)  µs", await t(() => n.ctx.sampleToken(at, greedy, false, true)));
console.log("top-k 20 + probabilities         µs", await t(() => n.ctx.sampleToken(at, topK, true)));
console.log("greedy + all probabilities       µs", await t(() => n.ctx.sampleToken(at, greedy, true), 20));
await adapter.dispose();
