"""Hybrid IR folders load through rope_positions.py's rewiring (the rotary reads `position_ids`), cached.

Why: the optimum-intel export of Qwen3.5-style text models ignores `position_ids`, so under OpenVINO GenAI's paged
attention every token of a step gets one rotary position and a greedy request's text depends on its batch
neighbours, its prefill chunking and whether it was resumed (docs/upstream.md). The rewired copy is exact (batched
== solo, chunked == whole, bitwise). It is made once per source into `<cache_dir>/openvino/rope-<key12>/` (a marker
written last means complete; concurrent makers each write a private folder and rename it into place).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from typing import Callable

#: Bump when the rewiring changes: it is part of the cache key.
REWIRE_VERSION = 1
#: Written last into a rewired folder.
MARKER = "rope_positions.json"


def _key(src: str) -> str:
    h = hashlib.sha256(f"{REWIRE_VERSION}:{os.path.realpath(src)}".encode())
    for name in ("openvino_model.xml", "openvino_model.bin"):
        st = os.stat(os.path.join(src, name))
        h.update(f":{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def rewired_path(src: str, cache_dir: str, log: Callable[[str, dict], None]) -> tuple[str, list[str]]:
    """The folder to load for IR folder `src` (its rewired copy, or `src` itself when nothing needs rewiring) and
    the rewired nodes."""
    final = os.path.join(cache_dir, "openvino", f"rope-{_key(src)}")
    marker = os.path.join(final, MARKER)
    if os.path.exists(marker):
        with open(marker) as f:
            done = json.load(f)
        if done["rewired"]:
            log(f"loading the copy with rotary positions from position_ids ({', '.join(done['rewired'])})", {"rewired": done["rewired"], "path": final})
        return (final if done["rewired"] else src), done["rewired"]
    from rope_positions import rewire_folder  # imports openvino

    tmp = f"{final}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    rewired = rewire_folder(src, tmp)
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump({"source": os.path.realpath(src), "rewired": rewired}, f)
    try:
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another worker published it first: use theirs
    log(f"rotary positions rewired to position_ids ({', '.join(rewired) or 'nothing to rewire'})", {"rewired": rewired, "path": final})
    return (final if rewired else src), rewired
