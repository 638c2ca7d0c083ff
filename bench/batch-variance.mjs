#!/usr/bin/env node
// Batch-variance harness: does a greedy request produce the same tokens alone as when it shares decode batches
// with other requests?
//
//   node bench/batch-variance.mjs [--model '{"hidden":258,...}'] [--kv f16|f32] [--fa off|on] [--requests 256]
//        [--tokens 96] [--rounds 1] [--slots 8] [--budget 256] [--seed 1] [--ctx 768] [--threads 1]
//        [--mixed-threads N] [--sensitivity 64] [--label name]
// (--mixed-threads: run the mixed rounds on a second context with another thread count; default: same context)
//
// Plain JS on purpose (Node 20 cannot run .ts): it compiles src/model/*.ts with tsc into bench/results/.build/
// and imports the model builder from there. Results (JSON) go to bench/results/<label>.json.
//
// Method: a minimal step loop on node-llama-cpp's internal native context (the same shape as Keel's engine):
// one decodeBatch per step, decoding sequences first (1 token each), then prefill chunks under the step's token
// budget; sequential sampleToken with one greedy AddonSampler per sequence; disposeSequence when a request ends.
//  - solo: every request alone (fixed budget), one after another.
//  - mixed: all requests arrive over time (seeded random gaps of 0..5 steps) into `slots` sequences; each step's
//    token budget is random in [8, budget] so prompts are chunked differently and prefill mixes with decodes.
// For each request we compare the mixed token sequence with the solo one ("flip" = any difference), and, token by
// token while they still agree, the two largest probabilities (a fingerprint of the logits: equal bits => the
// logits were very likely bit-identical). Solo runs also record the top-2 logit gap of every generated token.
// Sensitivity check (--sensitivity K): for K prompts, one prompt token is replaced (a third of the way in, and
// separately the first token) and the solo continuation is compared with the original one: the fraction that
// changes shows how strongly the output depends on (distant) context through attention.
import {execFileSync} from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const RESULTS = path.join(ROOT, "bench", "results");

function parseArgs(argv) {
    const o = {model: {}, kv: "f16", fa: "off", requests: 256, tokens: 96, rounds: 1, slots: 8, budget: 256, seed: 1,
        ctx: 768, threads: 1, mixedThreads: null, sensitivity: 64, label: null, modelFile: null};
    for (let i = 0; i < argv.length; i++) {
        const a = argv[i], v = () => argv[++i];
        if (a === "--model") o.model = JSON.parse(v());
        else if (a === "--model-file") o.modelFile = v();
        else if (a === "--kv") o.kv = v();
        else if (a === "--fa") o.fa = v();
        else if (a === "--label") o.label = v();
        else if (a === "--mixed-threads") o.mixedThreads = Number(v());
        else if (["--requests", "--tokens", "--rounds", "--slots", "--budget", "--seed", "--ctx", "--threads", "--sensitivity"].includes(a)) o[a.slice(2)] = Number(v());
        else throw new Error("unknown arg " + a);
    }
    return o;
}

/** Compiles src/model (non-test files) to bench/results/.build and imports tiny-model.js. */
async function importModelBuilder() {
    const out = path.join(RESULTS, ".build");
    const files = fs.readdirSync(path.join(ROOT, "src", "model"))
        .filter((f) => f.endsWith(".ts") && !f.endsWith(".test.ts")).map((f) => path.join(ROOT, "src", "model", f));
    execFileSync(path.join(ROOT, "node_modules", ".bin", "tsc"), [...files, "--outDir", out, "--module", "nodenext",
        "--moduleResolution", "nodenext", "--target", "es2022", "--skipLibCheck", "--types", "node", "--strict", "--ignoreConfig"], {stdio: "inherit"});
    return import(pathToFileURL(path.join(out, "tiny-model.js")).href);
}

// seeded uniform PRNG (mulberry32-like mixing) for prompts and schedules
function prng(seed) {
    let s = seed >>> 0;
    return () => {
        s = (s + 0x9e3779b9) >>> 0;
        let z = s;
        z = Math.imul(z ^ (z >>> 16), 0x21f0aaad);
        z = Math.imul(z ^ (z >>> 15), 0x735a2d97);
        return ((z ^ (z >>> 15)) >>> 0) / 4294967296;
    };
}

const WORDS = ("the server request queue token model client answer weather river bridge morning story fox light " +
    "keeper map garden station train letter sea cold warm rain wind sun cloud number byte second step batch " +
    "prompt reply message system user assistant JSON object array value key name city count time memory error " +
    "cancel stream slot engine gateway metric log health ready busy full empty small large first last every " +
    "quickly slowly never always because while until after before and or but with from into over under").split(" ");
const PUNCT = [".", ",", "?", "!", ":", ";", " -", "\n"];

function makePrompts(n, seed, model) {
    const r = prng(seed);
    const prompts = [];
    for (let i = 0; i < n; i++) {
        // word counts from 2 to ~220, skewed towards short prompts, plus a few long ones
        const len = r() < 0.15 ? 120 + Math.floor(r() * 100) : 2 + Math.floor(r() * r() * 80);
        const words = [];
        for (let k = 0; k < len; k++) {
            let w = WORDS[Math.floor(r() * WORDS.length)];
            if (r() < 0.08) w = String(Math.floor(r() * 5000));
            if (r() < 0.1) w = w[0].toUpperCase() + w.slice(1);
            words.push(w + (r() < 0.12 ? PUNCT[Math.floor(r() * PUNCT.length)] : ""));
        }
        const user = `#${i} ` + words.join(" ");
        const sys = r() < 0.5 ? `<|im_start|>system\nYou are assistant number ${i % 17}.<|im_end|>\n` : "";
        const text = `${sys}<|im_start|>user\n${user}<|im_end|>\n<|im_start|>assistant\n`;
        prompts.push(Array.from(model.tokenize(text, true)));
    }
    return prompts;
}

/**
 * Minimal step engine. requests: [{prompt, arrival (step index)}]. Returns per request {tokens, fp, gaps}.
 * budgetFn(step) -> token budget of that step.
 */
async function runSteps(ctx, requests, {slots, maxTokens, budgetFn, record}) {
    const native = ctx._ctx;
    const bindings = ctx.model._llama._bindings;
    const free = Array.from({length: slots}, (_, i) => i);
    const pending = requests.map((r, idx) => ({...r, idx, pos: 0, out: [], fp: [], gaps: [], id: null, sampler: null}))
        .sort((a, b) => a.arrival - b.arrival || a.idx - b.idx);
    const active = [];
    const results = new Array(requests.length);
    let step = 0, decodes = 0, batchTokens = 0, mixedSteps = 0;
    while (pending.length || active.length) {
        while (pending.length && free.length && pending[0].arrival <= step) {
            const r = pending.shift();
            r.id = free.shift();
            r.sampler = new bindings.AddonSampler(ctx.model._model);
            r.sampler.applyConfig({temperature: 0});
            active.push(r);
        }
        step++;
        if (!active.length) continue;
        let left = budgetFn(step);
        const items = [];
        for (const r of active) if (r.pos >= r.prompt.length && left > 0) { items.push({r, toks: [r.out.at(-1)], logits: true}); left--; }
        for (const r of active) {
            if (r.pos >= r.prompt.length || left <= 0) continue;
            const n = Math.min(left, r.prompt.length - r.pos);
            items.push({r, toks: r.prompt.slice(r.pos, r.pos + n), logits: r.pos + n === r.prompt.length});
            left -= n;
        }
        if (!items.length) continue;
        const total = items.reduce((a, it) => a + it.toks.length, 0);
        native.initBatch(total);
        for (const it of items) {
            const li = it.logits ? Uint32Array.of(it.toks.length - 1) : new Uint32Array(0);
            it.batchIdx = native.addToBatch(it.r.id, it.r.pos, Uint32Array.from(it.toks), li)[0];
        }
        const guard = ctx._backendContextDisposeGuard.createPreventDisposalHandle();
        try { await native.decodeBatch(); } finally { guard.dispose(); }
        decodes++; batchTokens += total;
        if (items.length > 1) mixedSteps++;
        for (const it of items) it.r.pos += it.toks.length;
        for (const it of items) {
            if (!it.logits) continue;
            const r = it.r;
            let tok;
            if (record) {
                const [t, probs] = await native.sampleToken(it.batchIdx, r.sampler, true);
                tok = t;
                // probs = [tok0, p0, tok1, p1, ...] sorted by logit, descending
                const p1 = probs[1], p2 = probs[3];
                r.fp.push([p1, p2]);
                r.gaps.push(Math.log(p1) - Math.log(p2));
            } else tok = await native.sampleToken(it.batchIdx, r.sampler);
            r.out.push(tok);
            if (r.out.length >= maxTokens || ctx.model.isEogToken(tok)) {
                native.disposeSequence(r.id);
                free.push(r.id);
                r.sampler.dispose();
                active.splice(active.indexOf(r), 1);
                results[r.idx] = {tokens: r.out, fp: r.fp, gaps: r.gaps};
            }
        }
    }
    return {results, decodes, batchTokens, mixedSteps};
}

function quantiles(xs, qs) {
    const s = [...xs].sort((a, b) => a - b);
    return Object.fromEntries(qs.map((q) => [q, s[Math.min(s.length - 1, Math.floor(q * s.length))]]));
}

async function main() {
    const o = parseArgs(process.argv.slice(2));
    fs.mkdirSync(RESULTS, {recursive: true});
    let modelPath = o.modelFile, modelInfo = null;
    if (!modelPath) {
        const tm = await importModelBuilder();
        const buf = tm.buildTinyModel(o.model);
        modelInfo = tm.resolveTinyModelOptions(o.model);
        delete modelInfo.chatTemplate;
        modelPath = path.join(RESULTS, `bv-model-${process.pid}.gguf`);
        fs.writeFileSync(modelPath, buf);
    }
    const label = o.label ?? `bv-${o.kv}-fa${o.fa}-${Date.now()}`;
    const llama = await getLlama({gpu: false, build: "never", maxThreads: Math.max(o.threads, o.mixedThreads ?? 1), logLevel: LlamaLogLevel.error});
    const model = await llama.loadModel({modelPath});
    const kvType = o.kv.toUpperCase();
    const ctx = await model.createContext({contextSize: o.ctx, sequences: o.slots, batchSize: o.budget, threads: o.threads,
        flashAttention: o.fa === "on", experimentalKvCacheKeyType: kvType, experimentalKvCacheValueType: kvType});
    const mixedCtx = o.mixedThreads == null ? ctx : await model.createContext({contextSize: o.ctx, sequences: o.slots,
        batchSize: o.budget, threads: o.mixedThreads, flashAttention: o.fa === "on", experimentalKvCacheKeyType: kvType,
        experimentalKvCacheValueType: kvType});
    const prompts = makePrompts(o.requests, o.seed, model);
    const promptLens = prompts.map((p) => p.length);
    const t0 = performance.now();
    const solo = [];
    for (const p of prompts) {
        const {results} = await runSteps(ctx, [{prompt: p, arrival: 0}], {slots: 1, maxTokens: o.tokens,
            budgetFn: () => o.budget, record: true});
        solo.push(results[0]);
    }
    const tSolo = performance.now() - t0;
    const gaps = solo.flatMap((s) => s.gaps);
    const rounds = [];
    let flips = 0, numericDiffReqs = 0, numericDiffTokens = 0, compared = 0, eogs = 0;
    const flipDetails = [];
    for (let round = 0; round < o.rounds; round++) {
        const r = prng(o.seed * 1000 + round + 7);
        let t = 0;
        const reqs = prompts.map((p) => ({prompt: p, arrival: (t += Math.floor(r() * 6))}));
        const t1 = performance.now();
        const run = await runSteps(mixedCtx, reqs, {slots: o.slots, maxTokens: o.tokens,
            budgetFn: () => 8 + Math.floor(r() * (o.budget - 7)), record: true});
        let roundFlips = 0;
        run.results.forEach((m, i) => {
            const s = solo[i];
            if (s.tokens.length < o.tokens) eogs++;
            let firstDiff = -1;
            for (let j = 0; j < Math.max(s.tokens.length, m.tokens.length); j++) if (s.tokens[j] !== m.tokens[j]) { firstDiff = j; break; }
            const agreeUpTo = firstDiff < 0 ? s.tokens.length : firstDiff + 1; // fingerprint of the diverging token too
            let nd = 0;
            for (let j = 0; j < agreeUpTo; j++) {
                compared++;
                if (s.fp[j][0] !== m.fp[j][0] || s.fp[j][1] !== m.fp[j][1]) nd++;
            }
            numericDiffTokens += nd;
            if (nd) numericDiffReqs++;
            if (firstDiff >= 0) {
                roundFlips++;
                flipDetails.push({round, req: i, promptLen: prompts[i].length, firstDiff, soloGap: s.gaps[firstDiff]});
            }
        });
        flips += roundFlips;
        rounds.push({round, flips: roundFlips, ms: Math.round(performance.now() - t1), decodes: run.decodes,
            avgBatchTokens: +(run.batchTokens / run.decodes).toFixed(2), mixedSteps: run.mixedSteps});
    }
    // sensitivity: does replacing one context token change the continuation?
    const special = new Set([model.tokens.bos, model.tokens.eos, ...model.tokenize("<|im_start|>", true)]);
    const sens = {checked: 0, changedMid: 0, changedFirst: 0, firstDiffMid: [], firstDiffFirst: []};
    const soloRun = async (p) => (await runSteps(ctx, [{prompt: p, arrival: 0}], {slots: 1, maxTokens: o.tokens,
        budgetFn: () => o.budget, record: false})).results[0].tokens;
    for (let i = 0; i < Math.min(o.sensitivity, prompts.length); i++) {
        const p = prompts[i];
        const userStart = p.findIndex((t, k) => k > 0 && special.has(p[k - 1]) && !special.has(t)); // after a marker
        const mid = Math.max(userStart + 2, Math.floor(p.length / 3));
        if (mid >= p.length - 6) continue;
        const swap = (k) => { const q = [...p]; let t = (q[k] + 1 + (i % 97)) % model.tokens.bos; q[k] = special.has(t) ? 65 : t; return q; };
        const a = await soloRun(swap(mid)), b = await soloRun(swap(0));
        const fd = (x) => { for (let j = 0; j < x.length; j++) if (x[j] !== solo[i].tokens[j]) return j; return -1; };
        sens.checked++;
        const da = fd(a), db = fd(b);
        if (da >= 0) { sens.changedMid++; sens.firstDiffMid.push(da); }
        if (db >= 0) { sens.changedFirst++; sens.firstDiffFirst.push(db); }
    }
    const med = (xs) => (xs.length ? quantiles(xs, [0.5])[0.5] : null);
    const sensitivity = {checked: sens.checked, changedWhenMidTokenReplaced: sens.changedMid,
        changedWhenFirstTokenReplaced: sens.changedFirst, medianFirstDiffMid: med(sens.firstDiffMid),
        medianFirstDiffFirst: med(sens.firstDiffFirst)};
    const total = o.requests * o.rounds;
    const finite = gaps.filter(Number.isFinite);
    const summary = {
        label, model: modelInfo ?? modelPath, kv: o.kv, flashAttention: o.fa, slots: o.slots, budget: o.budget,
        tokensPerRequest: o.tokens, requests: o.requests, rounds: o.rounds, mixedRequests: total,
        flips, flipRate: flips / total, requestsWithNumericDiff: numericDiffReqs, tokensCompared: compared,
        tokensWithNumericDiff: numericDiffTokens, soloRequestsEndingInEog: eogs / o.rounds,
        promptTokens: quantiles(promptLens, [0, 0.5, 0.9, 1]),
        soloGap: {n: gaps.length, infinite: gaps.length - finite.length, min: Math.min(...finite),
            quantiles: quantiles(finite, [0.001, 0.01, 0.1, 0.5]),
            below: Object.fromEntries([1e-4, 1e-3, 1e-2, 1e-1].map((e) => [e, finite.filter((g) => g < e).length]))},
        sensitivity, threads: o.threads, mixedThreads: o.mixedThreads ?? o.threads,
        throughput: {soloGenTokPerSec: Math.round(o.requests * o.tokens / (tSolo / 1000)),
            mixedGenTokPerSec: Math.round(o.requests * o.tokens * o.rounds / (rounds.reduce((a, r) => a + r.ms, 0) / 1000)),
            promptTokensTotal: promptLens.reduce((a, b) => a + b, 0)},
        soloMs: Math.round(tSolo), roundStats: rounds, flipDetails: flipDetails.slice(0, 50)
    };
    fs.writeFileSync(path.join(RESULTS, `${label}.json`), JSON.stringify(summary, null, 1));
    const {flipDetails: _fd, ...short} = summary;
    console.log(JSON.stringify(short));
    if (mixedCtx !== ctx) await mixedCtx.dispose();
    await ctx.dispose(); await model.dispose(); await llama.dispose();
    if (!o.modelFile) fs.rmSync(modelPath, {force: true});
}

await main();
