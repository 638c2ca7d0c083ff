#!/usr/bin/env node
// Summarises V8 .cpuprofile files (node --cpu-prof): busy time (everything but "(idle)"), and the top functions by
// self time and by inclusive time, so a per-token cost can be read off as busy µs / generated tokens.
//
//   NODE_OPTIONS="--cpu-prof --cpu-prof-dir=/tmp/prof" node bin/keel.mjs serve ...   # gateway and engine both
//   node bench/cpuprof-summary.mjs /tmp/prof/*.cpuprofile [--tokens N] [--top 25]
//
// With --tokens N (generated tokens during the profile) it also prints µs per token for each line.
import { readFileSync } from "node:fs";
import path from "node:path";

const args = process.argv.slice(2);
const files = [];
let tokens = 0;
let top = 25;
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--tokens") tokens = Number(args[++i]);
  else if (args[i] === "--top") top = Number(args[++i]);
  else files.push(args[i]);
}
if (files.length === 0) {
  console.error("usage: node bench/cpuprof-summary.mjs FILE.cpuprofile... [--tokens N] [--top N]");
  process.exit(2);
}

for (const file of files) {
  const prof = JSON.parse(readFileSync(file, "utf8"));
  // 1. Self time per node from the sample stream (timeDeltas[i] is the time before sample i, in µs).
  const self = new Map();
  for (let i = 0; i < prof.samples.length; i++) self.set(prof.samples[i], (self.get(prof.samples[i]) ?? 0) + (prof.timeDeltas[i] ?? 0));
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const parent = new Map();
  for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const label = (n) => {
    const f = n.callFrame;
    const where = f.url ? `${path.basename(f.url)}:${f.lineNumber + 1}` : "";
    return `${f.functionName || "(anonymous)"} ${where}`.trim();
  };
  // 2. Aggregate self and inclusive time by function label (inclusive counted once per sample stack).
  const selfBy = new Map();
  const inclBy = new Map();
  let total = 0;
  let idle = 0;
  for (const [id, us] of self) {
    const n = byId.get(id);
    total += us;
    if (n.callFrame.functionName === "(idle)") {
      idle += us;
      continue;
    }
    selfBy.set(label(n), (selfBy.get(label(n)) ?? 0) + us);
    const seen = new Set();
    for (let cur = id; cur !== undefined; cur = parent.get(cur)) {
      const l = label(byId.get(cur));
      if (seen.has(l)) continue;
      seen.add(l);
      inclBy.set(l, (inclBy.get(l) ?? 0) + us);
    }
  }
  const busy = total - idle;
  const perTok = (us) => (tokens ? ` ${(us / tokens).toFixed(1).padStart(8)} µs/tok` : "");
  console.log(`\n== ${path.basename(file)}: ${(total / 1e6).toFixed(2)} s profiled, busy ${(busy / 1e6).toFixed(2)} s (${((100 * busy) / total).toFixed(1)} %)${perTok(busy)}`);
  const show = (title, m) => {
    console.log(`-- ${title}`);
    for (const [l, us] of [...m].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${(us / 1000).toFixed(1).padStart(9)} ms ${((100 * us) / busy).toFixed(1).padStart(5)} %${perTok(us)}  ${l}`);
  };
  show("self time", selfBy);
  show("inclusive time", inclBy);
}
