#!/usr/bin/env node
// Benchmark: what the OpenVINO worker pays at add to map a gateway-built guide onto XGrammar (src/engine-openvino/
// guides.py: GBNF read and re-written, derivatives, the free-text automaton), per guide shape, cold and for the same
// guide again; with a GGUF argument also greedy ms per token under each guide on raw OpenVINO GenAI (2 threads).
// Prints tables; does not assert. Usage: node node_modules/typescript/bin/tsc -p tsconfig.build.json &&
// node bench/openvino-guide-plan.mjs [model.gguf]
import { execFileSync } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { buildGuide } from "../dist/gateway/guided/guide.js";
import { ensureOpenvinoVenv } from "../dist/engine-openvino/venv.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const weather = { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string", maxLength: 10 }, days: { type: "integer", minimum: 1, maximum: 7 } }, required: ["city"], additionalProperties: false } };
const order = { name: "place_order", parameters: { type: "object", properties: { item: { type: "string", enum: ["tea", "coffee"] }, qty: { type: "integer", minimum: 1, maximum: 9 }, note: { type: "string", maxLength: 6 } }, required: ["item", "qty"], additionalProperties: false } };
const base = { tools: [], toolChoice: { kind: "auto" }, responseFormat: { kind: "text" }, toolParser: null, reasoning: null, guideAuto: false, parallelToolCalls: true };
const tools = { ...base, tools: [weather, order] };
const guides = {
  json_object: buildGuide({ ...base, responseFormat: { kind: "json_object" } }),
  json_schema: buildGuide({ ...base, responseFormat: { kind: "json_schema", name: "w", schema: weather.parameters, strict: true } }),
  "required qwen3coder": buildGuide({ ...tools, toolChoice: { kind: "required" }, toolParser: "qwen3coder" }),
  "named hermes3 + reasoning": buildGuide({ ...tools, toolChoice: { kind: "function", name: "get_weather" }, toolParser: "hermes3", reasoning: { parser: "qwen3", open: false } }),
  "auto qwen3coder + reasoning": buildGuide({ ...tools, toolParser: "qwen3coder", guideAuto: true, reasoning: { parser: "qwen3", open: false } }),
  "auto hermes3 (start-only {)": buildGuide({ ...tools, toolParser: "hermes3", guideAuto: true }),
  "auto qwen3coder": buildGuide({ ...tools, toolParser: "qwen3coder", guideAuto: true }),
};
const script = `
import json, sys, time
sys.path.insert(0, ${JSON.stringify(path.join(root, "src/engine-openvino"))})
import guides
for name, g in json.loads(sys.stdin.read()).items():
    n = 100
    t = time.perf_counter()
    for _ in range(n):
        guides._cache.clear(); guides._plans.clear(); guides.plan_for(g, "")
    cold = (time.perf_counter() - t) / n * 1000
    t = time.perf_counter()
    for _ in range(n):
        guides.plan_for(g, "")
    warm = (time.perf_counter() - t) / n * 1000
    print(f"| {name} | {len(g['grammar'])} | {cold:.2f} | {warm:.2f} |")
`;
const perToken = `
import json, sys, time
import numpy as np, openvino as ov, openvino_genai as g
sys.path.insert(0, ${JSON.stringify(path.join(root, "src/engine-openvino"))})
import guides, prep
model = prep.prepare(sys.argv[1], sys.argv[2], lambda m: None)
sc = g.SchedulerConfig(); sc.num_kv_blocks = 64; sc.max_num_seqs = 2; sc.max_num_batched_tokens = 256
pipe = g.ContinuousBatchingPipeline(model, sc, "CPU", {"INFERENCE_NUM_THREADS": 2}, {})
tok = pipe.get_tokenizer()
ids = list(tok.encode("<|im_start|>user\\nWrite a long story about rivers.<|im_end|>\\n<|im_start|>assistant\\n", add_special_tokens=False).input_ids.data[0])
def run(rid, structured):
    c = g.GenerationConfig(); c.max_new_tokens = 60; c.do_sample = False
    if structured is not None: c.structured_output_config = structured
    h = pipe.add_request(rid, ov.Tensor(np.array([ids], dtype=np.int64)), c)
    out, steps, t0 = [], 0, 0.0
    while pipe.has_non_finished_requests():
        pipe.step(); steps += 1
        if steps == 1: t0 = time.perf_counter()
        while h.can_read():
            for s in h.read().values(): out += list(s.generated_ids)
    return len(out), 1000 * (time.perf_counter() - t0) / max(1, len(out) - 1)
rows = [("unguided", None)] + [(k, guides.to_structured_config(guides.plan_for(v, ""), g)) for k, v in json.loads(sys.stdin.read()).items()]
for i, (name, structured) in enumerate(rows):
    n, ms = run(i, structured)
    print(f"| {name} | {n} | {ms:.1f} |")
`;
const python = await ensureOpenvinoVenv();
console.log("| guide | GBNF bytes | plan ms (cold) | plan ms (cached: same guide again) |\n|---|---|---|---|");
process.stdout.write(execFileSync(python, ["-c", script], { input: JSON.stringify(guides) }).toString());
if (process.argv[2]) {
  console.log(`\n${path.basename(process.argv[2])}, greedy, 60 tokens at most\n| guide | tokens | ms per token |\n|---|---|---|`);
  const cache = process.env.KEEL_CACHE_DIR ?? path.join(process.env.HOME ?? "", ".cache", "keel");
  process.stdout.write(execFileSync(python, ["-c", perToken, process.argv[2], cache], { input: JSON.stringify(guides), stdio: ["pipe", "pipe", "ignore"] }).toString());
}
