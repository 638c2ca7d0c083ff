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
  const sum = { decode: 0, sample: 0, step: 0, wall: 0 };
  let lastEmit = null;
  let done = null;
  const finished = new Promise((r) => (done = r));
  const loop = new StepLoop(adapter, { maxNumSeqs: 1, maxNumBatchedTokens: 256, maxModelLen: 2048, prefixCaching: false }, (msg) => {
    if (write) sink.stdin.write(encodeFrame(msg));
    if (msg.type !== "step") return;
    const now = performance.now();
    const ph = msg.stats.phaseUs;
    // Decoding steps only: each one's wall time is from the previous step message to its own, so the prefill step
    // (longer than a decode step) stays out of every figure.
    if (msg.step > 1 && ph && lastEmit !== null) {
      steps += 1;
      sum.decode += ph.decode;
      sum.sample += ph.sample;
      sum.step += ph.step;
      sum.wall += (now - lastEmit) * 1000;
    }
    lastEmit = now;
    if (msg.outputs.some((o) => o.finish)) done();
  });
  const running = loop.run();
  loop.submit({ v: 1, type: "add", id: `r${n}`, prompt: { text: "hello there, the river" }, params: { maxTokens: tokens, temperature: 0, topP: 1, topK: 0, seed: 1, ignoreEos: true, logitBias: bias } });
  await finished;
  loop.stop();
  await running;
  const per = (us) => us / 1000 / steps;
  return { wallMs: per(sum.wall), decode: per(sum.decode), sample: per(sum.sample), other: per(sum.step - sum.decode - sum.sample), between: per(sum.wall - sum.step) };
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
