#!/usr/bin/env node
// Benchmark: what the OpenVINO worker pays at add to map a gateway-built guide onto XGrammar (src/engine-openvino/
// guides.py: GBNF read and re-written, derivatives, the free-text automaton), per guide shape, with the parsed grammar
// cold and cached. Prints a table; does not assert. Usage: node node_modules/typescript/bin/tsc -p tsconfig.build.json
// && node bench/openvino-guide-plan.mjs
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
console.log("| guide | GBNF bytes | plan ms (cold) | plan ms (cached: same guide again) |\n|---|---|---|---|");
process.stdout.write(execFileSync(await ensureOpenvinoVenv(), ["-c", script], { input: JSON.stringify(guides) }).toString());
