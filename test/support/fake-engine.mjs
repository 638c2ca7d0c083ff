// A fake engine for supervisor tests: speaks docs/protocol.md on fd 3 without a model. It reports ready, answers
// pings, holds every `add` without stepping (so requests stay in flight), and exits 0 on `shutdown`. In mode
// "validate" it prints the model check's result line and exits 0, so `keel serve` can start with it.
// Its start configuration (last argument) is echoed in `ready.limits`.
import net from "node:net";

const config = JSON.parse(process.argv.at(-1));
/** What the fake says it serves (a 4096-token context, no KV shape). */
const model = { path: config.modelPath, name: null, architecture: "fake", trainContextSize: 4096, vocabSize: 100, chatTemplate: null, kvElementsPerToken: null, bosToken: "<s>", eosToken: "</s>" };
// The startup model check (mode "validate"): the result line on stdout, exit 0, no channel.
if (config.mode === "validate") {
  process.stdout.write(JSON.stringify({ ok: true, metadata: model, backend: { gpu: false, devices: [] } }) + "\n");
  process.exit(0);
}
const channel = new net.Socket({ fd: 3, readable: true, writable: true });
const send = (msg) => {
  const body = Buffer.from(JSON.stringify(msg), "utf8");
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  channel.write(Buffer.concat([head, body]));
};
let buf = Buffer.alloc(0);
channel.on("data", (chunk) => {
  buf = Buffer.concat([buf, chunk]);
  while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
    const len = buf.readUInt32BE(0);
    const msg = JSON.parse(buf.subarray(4, 4 + len).toString("utf8"));
    buf = buf.subarray(4 + len);
    if (msg.type === "ping") send({ v: 1, type: "pong", nonce: msg.nonce, step: 0 });
    if (msg.type === "shutdown") process.exit(0);
  }
});
channel.on("close", () => process.exit(0));
send({
  v: 1,
  type: "ready",
  pid: process.pid,
  model,
  // A fixed pool (kvBlocks, 32 tokens per block as on a CPU) is reported as the shared pool, as the OpenVINO engine does.
  limits: { maxNumSeqs: config.maxNumSeqs, maxNumBatchedTokens: config.maxNumBatchedTokens, maxModelLen: config.maxModelLen, ...(config.kvBlocks ? { kvPoolTokens: config.kvBlocks * 32 } : {}) },
  engine: "fake",
  capabilities: { exactSeededResume: true, maxTopLogprobs: 0, extendedSampling: false, grammars: false, sharedPrefill: false },
});
