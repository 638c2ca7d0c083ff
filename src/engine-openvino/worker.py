#!/usr/bin/env python3
"""Keel's OpenVINO GenAI engine: continuous batching (ContinuousBatchingPipeline) behind Keel's engine protocol.

Run as `python worker.py <EngineConfig JSON>` by the gateway (src/engine-openvino/venv.ts builds the venv). The
channel is fd 3 (docs/protocol.md); stdout is not private (OpenVINO logs to std::cout), so fd 1 is pointed at
stderr at start and the validate result goes to a private duplicate of the original stdout.

One thread owns every call into OpenVINO; the loop reads the channel itself between steps (pings answered at once,
everything else applied at that step boundary): step_loop.py. Modules: engine.py (the pipeline, the KV pool, adds),
request_state.py, inbox.py, detokenize.py, model_meta.py (what `ready` announces), ov_settings.py, faults.py
(test-only fault injection), logline.py; channel.py and messages.py speak the protocol. This file is the entry point
and the `ready` message.

Guards (issue #11; each pinned by a test in test/conformance or test/e2e):
  - OpenVINO request ids come from a counter that never repeats (a reused live id wedges the pipeline for good);
  - prompt + max new tokens above the KV pool is refused at add (one sequence outgrowing the pool turns EVERY
    in-flight request IGNORED); an IGNORED status that still happens is an engine fault: exit, resume elsewhere;
  - hybrid (linear-attention) models run with prefix caching off (the seed's assert needs partial preemption of
    recurrent state with prefix caching), logged;
  - exact numerics by default on CPU (f32 inference and KV, no dynamic quantisation): resumed streams and
    bystanders are token-identical; --plugin_config may trade that for speed (logged).
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glob  # noqa: E402
from ov_settings import ONEDNN_CACHE_CPU, ONEDNN_CACHE_ENV, onednn_cache_capacity, onednn_exec_profiling, user_onednn_cache  # noqa: E402


def _onednn_before_openvino_loads() -> tuple[str | None, dict[str, str]]:
    """oneDNN reads its settings from the environment once: set the primitive-cache capacity, and take out execution
    profiling (it breaks the CPU plugin's compile), before OpenVINO is imported. Returns (capacity set, removed)."""
    try:
        cfg = json.loads(sys.argv[-1])
        gpu = bool(glob.glob("/dev/dri/renderD*"))
        capacity = onednn_cache_capacity(cfg, os.environ, gpu)
        profiling = onednn_exec_profiling(cfg, os.environ, gpu)
    except Exception:  # noqa: BLE001 - not a config: main() reports that as a fatal line
        return None, {}
    if capacity is not None:
        os.environ[ONEDNN_CACHE_ENV] = capacity
    return capacity, {name: os.environ.pop(name) for name in profiling}


#: The capacity Keel set (None: oneDNN's default or the user's), and the verbose settings it took out, for the log.
ONEDNN_CACHE_SET, ONEDNN_VERBOSE_REMOVED = _onednn_before_openvino_loads()
import step_loop  # noqa: E402
from channel import Channel  # noqa: E402
from engine import ENGINE_NAME, V, Engine  # noqa: E402
from inbox import Inbox  # noqa: E402
from logline import log  # noqa: E402


def main() -> None:
    started = time.monotonic()
    cfg = json.loads(sys.argv[-1])
    # OpenVINO prints to std::cout: keep a private stdout for the validate result and point fd 1 at stderr.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    serve = cfg.get("mode", "serve") == "serve"
    channel = Channel(3) if serve else None
    if channel:
        channel.send({"v": V, "type": "loading", "progress": 0})
    for name, value in ONEDNN_VERBOSE_REMOVED.items():
        log("warn", f"{name}={value} not applied: oneDNN's execution profiling makes OpenVINO's CPU plugin fail to compile the model (\"could not execute a primitive\"); dispatch, profile_create, check, warn and error work", event="onednn_verbose", name=name, value=value)
    engine = Engine(cfg, channel)
    if not serve:
        os.write(result_fd, (json.dumps({"ok": True, "metadata": engine.meta, "backend": engine.backend()}) + "\n").encode("utf-8"))
        os._exit(0)
    warm = engine.warm_up()
    if "skipped" in warm:
        log("warn", f"warm-up skipped: OpenVINO GenAI refused its prompt ({warm['skipped']}); memory for the largest batch is then taken under the first heavy load", event="warm_up", **warm)
    else:
        log("info", f"warm-up: one {warm['tokens']}-token prompt in {warm['steps']} step(s), {warm['ms']} ms (buffers sized for the largest batch before the first request)", event="warm_up", **warm)
    engine.inbox = Inbox(3, engine)
    engine.emit({
        "type": "ready",
        "pid": os.getpid(),
        "model": engine.meta,
        "limits": {"maxNumSeqs": int(cfg["maxNumSeqs"]), "maxNumBatchedTokens": int(cfg["maxNumBatchedTokens"]), "maxModelLen": engine.max_len, "kvPoolTokens": engine.pool_tokens},
        "engine": f"{ENGINE_NAME}@{engine.ov.__version__.split('-')[0]}",
        "capabilities": engine.capabilities(),
        "backend": engine.backend(),
        "loadMs": round((time.monotonic() - started) * 1000),
    })
    user_cache = user_onednn_cache(os.environ) if ONEDNN_CACHE_SET is None else None
    if ONEDNN_CACHE_SET is not None:
        log("info", f"oneDNN primitive cache: {ONEDNN_CACHE_SET} primitives (bounds the CPU worker's memory; {ONEDNN_CACHE_ENV} in the environment changes it)", event="onednn_cache", capacity=int(ONEDNN_CACHE_SET))
    elif user_cache is not None:
        log("info", f"oneDNN primitive cache: {user_cache!r} from the environment (Keel's CPU default is {ONEDNN_CACHE_CPU}; 0 recompiles every step, about half the tok/s; empty or unset is oneDNN's 1,024)", event="onednn_cache", capacity=user_cache, source="environment")
    log("info", "OpenVINO engine ready", event="ready", kvBlocks=engine.kv_blocks, blockTokens=engine.block, poolTokens=engine.pool_tokens, device=engine.device)
    step_loop.run(engine)
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as err:  # noqa: BLE001 - last resort: report and exit non-zero (the gateway restarts us)
        log("fatal", f"engine failed: {err}")
        os._exit(1)
