// A fake engine for supervisor tests: speaks docs/protocol.md on fd 3 without a model. It reports ready, answers
// pings, holds every `add` without stepping (so requests stay in flight), and exits 0 on `shutdown`. In mode
// "validate" it prints the model check's result line and exits 0, so `keel serve` can start with it.
// Its start configuration (last argument) is echoed in `ready.limits`.
//
// FAKE_ENGINE_MALFORMED=<kind> makes its first process (generation 1) answer the first `add` with one frame that
// breaks the protocol, as a buggy engine would (later generations behave, so a resumed request stays in flight):
//   step     a step frame whose output has no `text` and a negative token id (valid JSON, invalid message);
//   version  a pong of protocol version 2;
//   junk     a frame whose payload is not JSON;
//   ready2   a second `ready` (valid on its own, with a 1-token context): an engine may report ready once;
//   twice    a step that reports the request twice (each entry valid on its own: its text would be applied twice).
// FAKE_ENGINE_CHUNK_STEPS=1 answers every read of its channel that carried adds with one step message giving each
// of those requests one token whose text is how many adds that read carried (what one step boundary would admit).
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
/** The protocol fault to commit on the first add, or null. */
let malformed = config.generation === 1 ? (process.env.FAKE_ENGINE_MALFORMED ?? null) : null;
/** Commit the configured fault in answer to `add`. */
const breakProtocol = (add) => {
  if (malformed === "step") send({ v: 1, type: "step", step: 1, batchTokens: 1, outputs: [{ id: add.id, tokens: [-1] }], stats: { waiting: 0, running: 1, activeSequences: 1, cachedSequences: 0, prefixCacheHitTokens: 0 } });
  if (malformed === "version") send({ v: 2, type: "pong", nonce: 0, step: 0 });
  if (malformed === "ready2") send({ ...readyMessage(), limits: { ...readyMessage().limits, maxModelLen: 1 } });
  if (malformed === "twice") {
    const out = { id: add.id, tokens: [5], text: "x" };
    send({ v: 1, type: "step", step: 1, batchTokens: 1, outputs: [out, out], stats: { waiting: 0, running: 1, activeSequences: 1, cachedSequences: 0, prefixCacheHitTokens: 0 } });
  }
  if (malformed === "junk") {
    const body = Buffer.from("{not json", "utf8");
    const head = Buffer.alloc(4);
    head.writeUInt32BE(body.length);
    channel.write(Buffer.concat([head, body]));
  }
  malformed = null;
};
let buf = Buffer.alloc(0);
let steps = 0;
channel.on("data", (chunk) => {
  buf = Buffer.concat([buf, chunk]);
  const adds = [];
  while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
    const len = buf.readUInt32BE(0);
    const msg = JSON.parse(buf.subarray(4, 4 + len).toString("utf8"));
    buf = buf.subarray(4 + len);
    if (msg.type === "ping") send({ v: 1, type: "pong", nonce: msg.nonce, step: 0 });
    if (msg.type === "shutdown") process.exit(0);
    if (msg.type === "add" && malformed) breakProtocol(msg);
    if (msg.type === "add") adds.push(msg.id);
  }
  if (process.env.FAKE_ENGINE_CHUNK_STEPS && adds.length > 0) {
    const outputs = adds.map((id) => ({ id, tokens: [5], text: String(adds.length) }));
    send({ v: 1, type: "step", step: ++steps, batchTokens: adds.length, outputs, stats: { waiting: 0, running: adds.length, activeSequences: adds.length, cachedSequences: 0, prefixCacheHitTokens: 0 } });
  }
});
channel.on("close", () => process.exit(0));
/** The engine's `ready` message. */
function readyMessage() {
  return {
    v: 1,
    type: "ready",
    pid: process.pid,
    model,
    // A fixed pool (kvBlocks, 32 tokens per block as on a CPU) is reported as the shared pool, as the OpenVINO engine does.
    limits: { maxNumSeqs: config.maxNumSeqs, maxNumBatchedTokens: config.maxNumBatchedTokens, maxModelLen: config.maxModelLen, ...(config.kvBlocks ? { kvPoolTokens: config.kvBlocks * 32 } : {}) },
    engine: "fake",
    capabilities: { exactSeededResume: true, maxTopLogprobs: 0, extendedSampling: false, grammars: false, sharedPrefill: false },
  };
}
send(readyMessage());
