#!/usr/bin/env python3
"""Benchmark: OpenVINO model preparation (src/engine-openvino/prep.py) and what it buys at load time.

For each GGUF: a cold prepare() into a fresh cache (re-encode + conversion to IR), a warm prepare() (cache hit), and
the ContinuousBatchingPipeline constructor's time on the GGUF (the re-encoded one when the shipped file does not load)
vs on the prepared IR, each load in a fresh process, median of RUNS. Prints a Markdown table; asserts nothing.
Usage: $KEEL_OPENVINO_PYTHON bench/openvino_prep.py [--runs 3] MODEL.gguf...
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "engine-openvino"))
import prep  # noqa: E402

LOAD = """
import sys, time, openvino_genai as g
s = g.SchedulerConfig(); s.num_kv_blocks = 16
t = time.monotonic(); g.ContinuousBatchingPipeline(sys.argv[1], s, "CPU"); print(time.monotonic() - t)
"""


def load_seconds(path: str) -> float:
    """Seconds the pipeline constructor takes on `path`, in a fresh process (no warm caches of this one)."""
    out = subprocess.run([sys.executable, "-c", LOAD, path], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    print("| model | re-encoded tensors | cold prep s (re-encode + convert) | warm prep s | GGUF load s | IR load s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            # 1. Cold and warm prepare().
            started = time.monotonic()
            ir = prep.prepare(model, tmp)
            cold = time.monotonic() - started
            started = time.monotonic()
            prep.prepare(model, tmp)
            warm = time.monotonic() - started
            manifest_seconds = __import__("json").load(open(os.path.join(ir, prep.MANIFEST_FILE)))["seconds"]
            # 2. A GGUF OpenVINO loads: the shipped one, or its re-encoding.
            with open(model, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                plan = prep.plan_reencoding(prep.read_gguf_layout(buf))
            gguf = model
            if plan:
                gguf = os.path.join(tmp, "reencoded", "model.gguf")
                os.makedirs(os.path.dirname(gguf))
                prep.reencode_gguf(model, gguf, plan)
            # 3. Loads, alternating so that machine noise hits both alike.
            gguf_loads, ir_loads = [], []
            for _ in range(args.runs):
                gguf_loads.append(load_seconds(gguf))
                ir_loads.append(load_seconds(ir))
            print(f"| {os.path.basename(model)} | {len(plan)} | {cold:.1f} ({manifest_seconds['reencode']:.1f} + "
                  f"{manifest_seconds['convert']:.1f}) | {warm:.2f} | {statistics.median(gguf_loads):.2f} | "
                  f"{statistics.median(ir_loads):.2f} |", flush=True)


if __name__ == "__main__":
    main()
