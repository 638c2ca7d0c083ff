import { openAdapter } from "./lib.mjs";
const adapter = await openAdapter(process.argv[2], { sequences: 1, contextSize: 1024 });
const prompt = adapter.tokenize("hello there, the river");
await adapter.decode([{ slot: 0, pos: 0, tokens: prompt, wantsLogits: true }]);
const n = Number(process.argv[3] ?? 100);
const times = [];
for (let k = 0; k < n; k++) {
  const t = performance.now();
  await adapter.decode([{ slot: 0, pos: prompt.length + k, tokens: [42], wantsLogits: true }]);
  times.push(performance.now() - t);
}
times.sort((a, b) => a - b);
console.log(`decode only: median ${times[n >> 1].toFixed(2)} ms, mean ${(times.reduce((a, b) => a + b, 0) / n).toFixed(2)} ms, min ${times[0].toFixed(2)}`);
process.exit(0);
