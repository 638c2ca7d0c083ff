"""Contract checks of OpenVINO GenAI behaviours the worker works around (docs/upstream.md, "OpenVINO GenAI").

Run by upstream.contract.test.ts as `python upstream_contract.py MODEL.gguf CHECK`; prints one JSON object. Each
check shows the raw upstream behaviour, so a fixed release makes the contract test fail and the workaround can go.
"""
from __future__ import annotations

import json
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


CHECKS = {f.__name__: f for f in (reused_id, outgrow_pool, ignore_eos_stop_ids, detok_drops_invalid_utf8, vocab_vector_fails)}

if __name__ == "__main__":
    print(json.dumps(CHECKS[sys.argv[2]](sys.argv[1])))
