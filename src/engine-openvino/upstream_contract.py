"""Contract checks of OpenVINO GenAI behaviours the worker works around (docs/upstream.md, "OpenVINO GenAI").

Run by upstream.contract.test.ts as `python upstream_contract.py MODEL CHECK`; prints one JSON object. MODEL is the
tiny GGUF, or for the hybrid checks (`hybrid_*`, and `batch_variance` / `resume_variance` on either) the tiny hybrid
IR folder. Each check shows the raw upstream behaviour, so a fixed release makes the contract test fail and the
workaround can go.
"""
from __future__ import annotations

import json
import re
import sys

import numpy as np
import openvino as ov
import openvino_genai as g

EXACT = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0", "INFERENCE_NUM_THREADS": 1}


def pipeline(model: str, blocks: int):
    sc = g.SchedulerConfig()
    sc.num_kv_blocks = blocks
    sc.max_num_batched_tokens = 64
    sc.max_num_seqs = 4
    sc.enable_prefix_caching = False
    return g.ContinuousBatchingPipeline(model, sc, "CPU", EXACT)


def ids_tensor(p, text: str):
    ids = list(p.get_tokenizer().encode(text, add_special_tokens=False).input_ids.data[0])
    return ov.Tensor(np.array([ids], dtype=np.int64)), ids


def config(max_new: int, **kw):
    c = g.GenerationConfig()
    c.max_new_tokens = max_new
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def drain(p, handles, max_steps=2000):
    outs = {i: [] for i in range(len(handles))}
    for _ in range(max_steps):
        if not p.has_non_finished_requests():
            break
        p.step()
        for i, h in enumerate(handles):
            while h.can_read():
                for s in h.read().values():
                    outs[i].extend(int(t) for t in s.generated_ids)
    return outs


def reused_id(model: str) -> dict:
    """A live request id added twice wedges the pipeline: every later step() raises."""
    p = pipeline(model, 64)
    t, _ = ids_tensor(p, "hello there")
    h1 = p.add_request(7, t, config(50, ignore_eos=True))
    h2 = p.add_request(7, t, config(50, ignore_eos=True))
    errors = []
    for _ in range(3):
        try:
            p.step()
            errors.append(None)
        except RuntimeError as err:
            errors.append(str(err)[:120])
    del h1, h2
    return {"stepErrors": errors}


def outgrow_pool(model: str) -> dict:
    """A sequence growing past the whole pool ends IGNORED mid-generation: no exception, no error, a truncated
    answer (research §7 saw every in-flight request turned IGNORED; 2026.4.1 here ends the outgrowing one)."""
    p = pipeline(model, 8)  # 8 blocks of 32 tokens
    t, _ = ids_tensor(p, "hello there")
    small = p.add_request(0, t, config(60, ignore_eos=True))
    big = p.add_request(1, t, config(400, ignore_eos=True))
    raised = None
    outs = {}
    try:
        outs = drain(p, [small, big])
    except RuntimeError as err:
        raised = str(err)
    return {"statuses": [str(h.get_status()).rsplit(".", 1)[-1] for h in (small, big)], "generated": [len(outs.get(i, [])) for i in (0, 1)], "raised": raised}


def ignore_eos_stop_ids(model: str) -> dict:
    """ignore_eos also ignores custom stop_token_ids: a stop token does not end the request."""
    p = pipeline(model, 64)
    t, _ = ids_tensor(p, "stop here")
    first = drain(p, [p.add_request(0, t, config(4, ignore_eos=True))])[0]
    stop = first[0]
    h = p.add_request(1, t, config(4, ignore_eos=True, stop_token_ids={stop}))
    return {"stopToken": stop, "generated": drain(p, [h])[0]}


def detok_drops_invalid_utf8(model: str) -> dict:
    """decode() drops a byte that is not valid UTF-8 instead of writing U+FFFD."""
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model_meta import model_metadata, token_bytes_table

    model_metadata(model)
    table = token_bytes_table(model)
    lone = table.index(b"\x80")  # a lone continuation byte: never valid UTF-8
    p = pipeline(model, 16)
    return {"token": lone, "text": p.get_tokenizer().decode([lone], skip_special_tokens=False)}


def vocab_vector_fails(model: str) -> dict:
    """get_vocab_vector() raises on byte tokens that are not valid UTF-8 (so token bytes come from the GGUF)."""
    p = pipeline(model, 16)
    try:
        p.get_tokenizer().get_vocab_vector()
        return {"raised": None}
    except UnicodeDecodeError as err:
        return {"raised": type(err).__name__}


# --- Hybrid (linear-attention) models: the seed's assert and exactness (docs/upstream.md, "hybrid models") ---

def hybrid_pipeline(model: str, prefix: bool = True, blocks: int = 27, seqs: int = 8, mbt: int = 4096, split_fuse: bool = True,
                    la_blocks: int | None = 8, cim: int = 64):
    """The seed's scheduler settings (research/hybrid-model.md), scaled to the CPU block size (32 tokens); la_blocks
    None leaves GenAI's default (the only value an attention-only model accepts)."""
    sc = g.SchedulerConfig()
    sc.enable_prefix_caching = prefix
    sc.dynamic_split_fuse = split_fuse
    sc.cache_interval_multiplier = cim
    sc.num_kv_blocks = blocks
    if la_blocks is not None:
        sc.num_linear_attention_blocks = la_blocks
    sc.cache_size = 0
    sc.max_num_batched_tokens = mbt
    sc.max_num_seqs = seqs
    return g.ContinuousBatchingPipeline(model, sc, "CPU", EXACT)


def random_prompt(n: int, seed: int) -> list:
    """Token ids valid in both tiny vocabularies (hybrid: 400, keel-tiny: ~1,000), no special tokens."""
    return [int(x) for x in np.random.default_rng(seed).integers(10, 390, n)]


def add(p, rid: int, ids: list, cfg):
    return p.add_request(rid, ov.Tensor(np.array([ids], dtype=np.int64)), cfg)


def short_error(err: Exception) -> str:
    """"Check 'X' failed at file.hpp:N: message" without the build machine's path."""
    m = re.search(r"Check '(.*?)' failed at .*?([\w.]+:\d+):\s*(.*)", str(err), re.S)
    return f"Check '{m.group(1)}' failed at {m.group(2)}: {m.group(3).strip()}" if m else str(err)[:200]


def seed_schedule(model: str, prefix: bool, blocks: int, steps: int = 6) -> dict:
    """Three greedy 8-token requests of 320, 320 and 200 tokens added at once: 10 + 10 + 7 KV blocks."""
    p = hybrid_pipeline(model, prefix=prefix, blocks=blocks)
    handles = [add(p, i, random_prompt(n, i + 1), config(8, ignore_eos=True)) for i, n in enumerate((320, 320, 200))]
    errors, usage = [], []
    for _ in range(steps):
        if not p.has_non_finished_requests():
            break
        try:
            p.step()
            errors.append(None)
        except RuntimeError as err:
            errors.append(short_error(err))
        usage.append(round(p.get_metrics().cache_usage, 1))
    generated = [0, 0, 0]
    if all(e is None for e in errors):  # read only a pipeline that never raised (a wedged one can block readers)
        for i, h in enumerate(handles):
            while h.can_read():
                for s in h.read().values():
                    generated[i] += len(s.generated_ids)
    return {"stepErrors": errors, "cacheUsage": usage, "unfinished": p.has_non_finished_requests(), "generated": generated}


def hybrid_seed_assert(model: str) -> dict:
    """The seed's crash: with prefix caching on and the pool exactly full after step 1, step 2 asserts in the block
    manager and every later step raises (wedged for good); prefix caching off, or one spare block, runs through."""
    return {
        "traced": seed_schedule(model, prefix=True, blocks=27),
        "prefixOff": seed_schedule(model, prefix=False, blocks=27, steps=40),
        "spareBlock": seed_schedule(model, prefix=True, blocks=28, steps=40),
    }


def run_greedy(p, schedule: list, max_new: int) -> dict:
    """schedule: (name, prompt ids, step at which it is added). Returns name -> (token ids, sampled log-probs)."""
    out = {name: ([], []) for name, _, _ in schedule}
    handles, step = {}, 0
    while True:
        for rid, (name, ids, at) in enumerate(schedule):
            if at == step:
                handles[name] = add(p, 100 + rid, ids, config(max_new, ignore_eos=True, logprobs=1))
        if not p.has_non_finished_requests() and all(at <= step for _, _, at in schedule):
            return out
        p.step()
        step += 1
        for name, h in handles.items():
            while h.can_read():
                for s in h.read().values():
                    out[name][0].extend(int(t) for t in s.generated_ids)
                    out[name][1].extend(float(x) for x in s.generated_log_probs)


def lp_gap(a, b) -> float:
    """Largest log-prob difference over the tokens both runs share before their first different token."""
    n = next((i for i, (x, y) in enumerate(zip(a[0], b[0])) if x != y), min(len(a[0]), len(b[0])))
    return max([abs(x - y) for x, y in zip(a[1][:n], b[1][:n])] or [0.0])


def batch_variance(model: str) -> dict:
    """Greedy A (100 tokens) alone vs with B (150 tokens) added one step later, prefix caching and split-fuse off:
    the log-prob gap, the same with a B of other content and the same length (a leak would change A), and with
    max_num_seqs=1 (one sequence per step)."""
    a, b, b2, n = random_prompt(100, 1), random_prompt(150, 2), random_prompt(150, 99), 12

    def go(schedule, seqs=4):
        return run_greedy(hybrid_pipeline(model, prefix=False, blocks=64, seqs=seqs, split_fuse=False, la_blocks=None), schedule, n)

    solo = go([("A", a, 0)])["A"]
    batched = go([("A", a, 0), ("B", b, 1)])["A"]
    other = go([("A", a, 0), ("B", b2, 1)])["A"]
    serial = go([("A", a, 0), ("B", b, 0), ("C", random_prompt(60, 3), 1)], seqs=1)["A"]
    return {"soloVsBatched": lp_gap(solo, batched), "sameTokens": solo[0] == batched[0][: len(solo[0])],
            "otherContentVsBatched": lp_gap(batched, other) if other[0] == batched[0] else None,
            "serialVsSolo": lp_gap(solo, serial) if serial[0] == solo[0] else None}


def resume_variance(model: str) -> dict:
    """A stream resumed the way Keel resumes it (prompt + the tokens generated so far, as a new request) vs the
    uninterrupted run: the log-prob gap over the continuation, and the gap of a whole vs a chunked prefill."""
    a, n, k = random_prompt(100, 1), 12, 4

    def go(ids, max_new, mbt=4096):
        return run_greedy(hybrid_pipeline(model, prefix=False, blocks=64, seqs=4, mbt=mbt, la_blocks=None), [("A", ids, 0)], max_new)["A"]

    whole = go(a, n)
    resumed = go(a + whole[0][:k], n - k)
    chunked = go(a, n, mbt=32)
    return {"resumedVsUninterrupted": lp_gap((whole[0][k:], whole[1][k:]), resumed), "chunkedVsWhole": lp_gap(whole, chunked)}


def prefix_hits(model: str) -> dict:
    """A 100-token prompt run twice on one pipeline with prefix caching: how many steps the second run needs before
    its first token with 32-token prefill chunks (cold: 4; fewer = a hit), and its log-prob gap to the first run, for
    cache_interval_multiplier 1, 2, 4; and the gap with 48-token chunks (the cold run's chunk ends miss the
    linear-attention checkpoints)."""
    a, n = random_prompt(100, 1), 8

    def one(p, rid):
        h = add(p, rid, a, config(n, ignore_eos=True, logprobs=1))
        ids, lps, step, first = [], [], 0, None
        while p.has_non_finished_requests():
            p.step()
            step += 1
            while h.can_read():
                for s in h.read().values():
                    ids.extend(int(t) for t in s.generated_ids)
                    lps.extend(float(x) for x in s.generated_log_probs)
            if first is None and ids:
                first = step
        return first, (ids, lps)

    out = {}
    for mbt, cim in ((32, 1), (32, 2), (32, 4), (48, 2)):
        p = hybrid_pipeline(model, prefix=True, blocks=64, seqs=4, mbt=mbt, la_blocks=None, cim=cim)
        cold_steps, cold = one(p, 1)
        warm_steps, warm = one(p, 2)
        out[f"mbt{mbt}_cim{cim}"] = {"coldSteps": cold_steps, "repeatSteps": warm_steps, "gap": lp_gap(cold, warm), "sameTokens": cold[0] == warm[0]}
    return out


def hybrid_positions(model: str) -> dict:
    """The export's fault behind batch_variance / resume_variance: the IR's position_ids input is unused (rotary
    positions come from an in-graph arange). Rewired by rope_positions.py, the paged model is batch-, chunk- and
    resume-invariant and matches the stateful model."""
    import os
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rope_positions import rewire_folder

    ir = ov.Core().read_model(f"{model}/openvino_model.xml")
    unused = [len(p.output(0).get_target_inputs()) == 0 for p in ir.get_parameters() if p.get_friendly_name() == "position_ids"]
    with tempfile.TemporaryDirectory() as fixed:
        rewired = rewire_folder(model, fixed)
        if not rewired:
            return {"positionIdsUnused": unused == [True], "rewired": []}
        with tempfile.TemporaryDirectory() as again:
            idempotent = rewire_folder(fixed, again) == []
        return {"positionIdsUnused": unused == [True], "rewired": rewired, "rewiredTwice": not idempotent,
                "fixed": {**batch_variance(fixed), **resume_variance(fixed), **hybrid_vs_stateful(fixed)}}


def prefix_checkpoint_leak(model: str) -> dict:
    """Prefix caching with cache_interval_multiplier 2 (64-token checkpoints): A (100 tokens), then X sharing its
    first `shared` tokens, then A again. A's repeat vs A's cold run (greedy log-probs), for two X tails."""
    a, n = random_prompt(100, 1), 24
    cold = run_greedy(hybrid_pipeline(model, prefix=False, blocks=64, seqs=4, la_blocks=None), [("A", a, 0)], n)["A"]

    def repeat_after(x: list, cim: int):
        p = hybrid_pipeline(model, prefix=True, blocks=64, seqs=4, la_blocks=None, cim=cim)
        for ids in (a, x):
            run_greedy(p, [("R", ids, 0)], n)
        return run_greedy(p, [("A", a, 0)], n)["A"]

    out = {}
    for shared, cim, tail in ((40, 2, 8), (40, 2, 77), (20, 2, 8), (70, 2, 8), (40, 1, 8)):
        again = repeat_after(a[:shared] + random_prompt(130 - shared, tail), cim)
        out[f"shared{shared}_cim{cim}_tail{tail}"] = {"gap": abs(again[1][0] - cold[1][0]), "firstLogprob": again[1][0]}
    return out


def la_blocks_on_attention_model(model: str) -> dict:
    """num_linear_attention_blocks set for a model without linear attention: the pipeline refuses to load."""
    try:
        hybrid_pipeline(model, prefix=False, blocks=16, la_blocks=8)
        return {"raised": None}
    except RuntimeError as err:
        return {"raised": short_error(err)}


def hybrid_vs_stateful(model: str) -> dict:
    """The paged (continuous-batching) hybrid vs the same IR run as its own stateful model (no paging, ov.Core):
    the first token's log-prob after a 1-token and after a 4-token prompt."""
    core = ov.Core()
    compiled = core.compile_model(core.read_model(f"{model}/openvino_model.xml"), "CPU", {k: v for k, v in EXACT.items() if k != "KV_CACHE_PRECISION"})
    gaps = {}
    for n in (1, 4):
        ids = random_prompt(n, 11)
        paged = run_greedy(hybrid_pipeline(model, prefix=False, blocks=64, seqs=4), [("A", ids, 0)], 1)["A"]
        r = compiled.create_infer_request()
        r.infer({"input_ids": np.array([ids], dtype=np.int64), "attention_mask": np.ones((1, n), dtype=np.int64),
                 "position_ids": np.arange(n, dtype=np.int64)[None], "beam_idx": np.zeros(1, dtype=np.int32)})
        lg = r.get_tensor("logits").data[0, -1].astype(np.float64)
        ls = lg - lg.max() - np.log(np.exp(lg - lg.max()).sum())
        gaps[f"prompt{n}"] = abs(float(ls[paged[0][0]]) - paged[1][0])
    return gaps


def tokenizer_cuts_long_text(model: str) -> dict:
    """encode() cuts a long text at a fixed count without a word, whatever max_length or truncation ask (worker:
    tokenizer_limit.py finds the cut and refuses a prompt that reaches it)."""
    tok = pipeline(model, 64).get_tokenizer()
    count = lambda **kw: len(tok.encode("hello world " * 5000, add_special_tokens=False, **kw).input_ids.data[0])  # noqa: E731
    return {"plain": count(), "maxLength": count(max_length=100000), "noTruncation": count(truncation=False), "words": 10000}


CHECKS = {f.__name__: f for f in (
    tokenizer_cuts_long_text, reused_id, outgrow_pool, ignore_eos_stop_ids, detok_drops_invalid_utf8, vocab_vector_fails,
    hybrid_seed_assert, batch_variance, resume_variance, hybrid_vs_stateful, la_blocks_on_attention_model, prefix_hits, hybrid_positions, prefix_checkpoint_leak,
)}

if __name__ == "__main__":
    print(json.dumps(CHECKS[sys.argv[2]](sys.argv[1])))
