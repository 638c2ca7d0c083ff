"""Test support: observations about models under OpenVINO GenAI, each printed as one JSON line for a vitest test.

Subcommands (the tests assert on the JSON; this script decides nothing):
  generate PATH [TOKENS]      load PATH (GGUF or IR folder) in a ContinuousBatchingPipeline, greedy-generate TOKENS
                              tokens for two fixed chats: {"ok", "ids", "texts", "eos", "load_s"} or {"ok": false, "error"}
  reencode SRC OUT            prep.py's re-encoding of SRC into OUT: {"plan": [[name, from, to], ...]}
  same-values A B             dequantize every tensor of GGUFs A and B with gguf.GGUFReader (independent of prep.py's
                              own GGUF parser): {"compared", "differing": [names], "types_a", "types_b"}
  publish SRC_DIR FINAL TAG   copy the prepared folder SRC_DIR into a fresh temp folder next to FINAL, mark it with
                              owner.txt = TAG, publish it with prep's rename: {"returned", "log", "temp_left"}
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "engine-openvino"))

import prep  # noqa: E402

CHATS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "def add(a, b):"}],
]


def generate(path: str, tokens: str = "24") -> dict:
    import openvino_genai as ov_genai

    scheduler = ov_genai.SchedulerConfig()
    scheduler.num_kv_blocks = 16
    started = time.monotonic()
    try:
        pipe = ov_genai.ContinuousBatchingPipeline(path, scheduler, "CPU")
    except RuntimeError as err:
        return {"ok": False, "error": str(err)}
    load_s = time.monotonic() - started
    tok = pipe.get_tokenizer()
    inputs = [tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True), add_special_tokens=False).input_ids
              for chat in CHATS]
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = int(tokens)
    config.do_sample = False
    results = pipe.generate(inputs, [config] * len(inputs))
    ids = [list(map(int, r.m_generation_ids[0])) for r in results]
    return {"ok": True, "ids": ids, "texts": [tok.decode(i) for i in ids], "eos": tok.get_eos_token_id(), "load_s": load_s}


def reencode(src: str, out: str) -> dict:
    import mmap

    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        layout = prep.read_gguf_layout(buf)
    plan = prep.plan_reencoding(layout)
    prep.reencode_gguf(src, out, plan)
    return {"plan": [[r.name, r.source_type.name, r.target_type.name] for r in plan]}


def same_values(a: str, b: str) -> dict:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    ra, rb = GGUFReader(a), GGUFReader(b)
    tb = {t.name: t for t in rb.tensors}
    differing = []
    for t in ra.tensors:
        u = tb.get(t.name)
        if u is None or not np.array_equal(dequantize(t.data, t.tensor_type), dequantize(u.data, u.tensor_type)):
            differing.append(t.name)
    keys_a = {k: f.contents() for k, f in ra.fields.items() if not k.startswith("GGUF.") and k != "general.file_type"}
    keys_b = {k: f.contents() for k, f in rb.fields.items() if not k.startswith("GGUF.") and k != "general.file_type"}
    return {
        "compared": len(ra.tensors),
        "differing": differing,
        "types_a": sorted({t.tensor_type.name for t in ra.tensors}),
        "types_b": sorted({t.tensor_type.name for t in rb.tensors}),
        "same_keys": keys_a == keys_b,
        "file_type_b": int(rb.fields["general.file_type"].contents()),
    }


def publish(src_dir: str, final: str, tag: str) -> dict:
    lines: list[str] = []
    tmp = os.path.join(os.path.dirname(final), f"{prep._temp_prefix(final)}{os.getpid()}-{tag.encode().hex()}")
    shutil.copytree(src_dir, tmp)
    with open(os.path.join(tmp, "owner.txt"), "w", encoding="utf-8") as f:
        f.write(tag)
    with open(os.path.join(src_dir, prep.MANIFEST_FILE), encoding="utf-8") as f:
        fingerprint = json.load(f)["source"]["fingerprint"]
    returned = prep._publish(tmp, final, fingerprint, lines.append)
    return {"returned": returned, "log": lines, "temp_left": os.path.exists(tmp)}


COMMANDS = {"generate": generate, "reencode": reencode, "same-values": same_values, "publish": publish}

if __name__ == "__main__":
    print(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])))
