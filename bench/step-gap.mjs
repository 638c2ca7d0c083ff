#!/usr/bin/env node
// The engine's host work between two decodes at one stream, without the gateway: Keel's StepLoop on the real
// adapter (the embedded model by default) generating greedy tokens, its step messages encoded as frames and written
// to a pipe that a child process drains (as the gateway's channel), against the same loop with the messages
// dropped. Prints, per token: wall time, the step's own phases (decode, sample, other) and `between` (wall minus
// the step: the frame write, the event-loop turn between steps). Medians of interleaved rounds; asserts nothing.
//
//   node bench/step-gap.mjs [--model PATH] [--tokens 400] [--rounds 5]
import { spawn } from "node:child_process";
import path from "node:path";
import { ROOT, arg, benchModel, median, openAdapter } from "./lib.mjs";

const { StepLoop } = await import(path.join(ROOT, "dist/engine/step-loop.js"));
const { encodeFrame } = await import(path.join(ROOT, "dist/protocol/framing.js"));
const modelPath = await benchModel();
const tokens = Number(arg("tokens", "400"));
const rounds = Number(arg("rounds", "5"));
const adapter = await openAdapter(modelPath, { sequences: 1, contextSize: 2048 });
// A reader that drains the pipe, as the gateway does (it runs in another process, like the gateway).
const sink = spawn(process.execPath, ["-e", "process.stdin.resume()"], { stdio: ["pipe", "ignore", "inherit"] });
// Non-ASCII byte tokens banned (the embedded model is random), as bench/compare.mjs does.
const bias = Array.from({ length: 128 }, (_, i) => [128 + i, -100]);

async function round(write, n) {
  let steps = 0;
  const sum = { decode: 0, sample: 0, step: 0 };
  let done = null;
  const finished = new Promise((r) => (done = r));
  const loop = new StepLoop(adapter, { maxNumSeqs: 1, maxNumBatchedTokens: 256, maxModelLen: 2048, prefixCaching: false }, (msg) => {
    if (write) sink.stdin.write(encodeFrame(msg));
    if (msg.type !== "step") return;
    const ph = msg.stats.phaseUs;
    // The prefill step is not counted: decoding steps only.
    if (msg.step > 1 && ph) {
      steps += 1;
      sum.decode += ph.decode;
      sum.sample += ph.sample;
      sum.step += ph.step;
    }
    if (msg.outputs.some((o) => o.finish)) done();
  });
  const running = loop.run();
  loop.submit({ v: 1, type: "add", id: `r${n}`, prompt: { text: "hello there, the river" }, params: { maxTokens: tokens, temperature: 0, topP: 1, topK: 0, seed: 1, ignoreEos: true, logitBias: bias } });
  // Wall time from the second step's start: measured as the sum over decoding steps below.
  const start = performance.now();
  await finished;
  const wall = performance.now() - start;
  loop.stop();
  await running;
  const per = (us) => us / 1000 / steps;
  // The first (prefill) step's share of the wall time is taken out with its own step time estimate (decode-step mean).
  const wallPer = (wall - per(sum.step)) / steps;
  return { wallMs: wallPer, decode: per(sum.decode), sample: per(sum.sample), other: per(sum.step - sum.decode - sum.sample), between: wallPer - per(sum.step) };
}

const rows = { pipe: [], dropped: [] };
await round(true, -1); // warm-up
for (let r = 0; r < rounds; r++) {
  for (const kind of r % 2 === 0 ? ["pipe", "dropped"] : ["dropped", "pipe"]) rows[kind].push(await round(kind === "pipe", r));
}
const med = (rs) => Object.fromEntries(Object.keys(rs[0]).map((k) => [k, Math.round(median(rs.map((x) => x[k])) * 1000) / 1000]));
console.log(`${path.basename(modelPath)}; ${tokens} tokens per round, ${rounds} interleaved rounds; ms per token (medians)`);
console.table({ "frames written to a pipe": med(rows.pipe), "frames dropped": med(rows.dropped) });
sink.stdin.end();
await adapter.dispose();
