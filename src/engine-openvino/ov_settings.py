"""OpenVINO settings from the EngineConfig: device, KV block size, prefix caching, compile properties."""
from __future__ import annotations

from typing import Mapping, Optional


#: KV block size of OpenVINO's paged cache (tokens): 32 on CPU, 16 on GPU (research §1).
def block_size(device: str) -> int:
    return 16 if device == "GPU" else 32


def ov_device(cfg: dict) -> str:
    return {"cpu": "CPU", "gpu": "GPU", "auto": "AUTO"}[cfg.get("device", "cpu")]


def resolve_device(cfg: dict) -> str:
    """CPU or GPU: AUTO takes an Intel GPU when OpenVINO sees one, else the CPU (said in `ready.backend`)."""
    device = ov_device(cfg)
    if device != "AUTO":
        return device
    import openvino as ov

    return "GPU" if any(d.startswith("GPU") for d in ov.Core().available_devices) else "CPU"


#: oneDNN's primitive cache: the JIT-compiled kernels the CPU plugin keeps (1,024 by default). Continuous batching
#: gives almost every step a new batch shape, and each new shape compiles primitives until the cache is full: that
#: cache filling was the CPU worker's memory growth in issue #22's soaks (+13 % to a plateau on a quiet host).
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
#: Keel's capacity on CPU (docs/benchmarks.md, "oneDNN's primitive cache"): 64 kept the worker flat (+0.7 % in 12 soak
#: minutes against +8.4 % with 1,024 and +7.1 % with 256) at the same tok/s; 0 was flat too but halved tok/s.
ONEDNN_CACHE_CPU = "64"


def runs_on_cpu(cfg: dict, gpu_render_node: bool) -> bool:
    """Whether the CPU plugin runs the model, as far as is known before OpenVINO loads: `--target_device CPU`, or AUTO
    on a machine without a GPU render node (/dev/dri/renderD*: AUTO cannot pick a GPU there)."""
    device = cfg.get("device", "cpu")
    return device == "cpu" or (device == "auto" and not gpu_render_node)


#: oneDNN verbose values that turn execution profiling on (legacy 1, 2 and -1, `profile`, `profile_exec`, `all`).
ONEDNN_EXEC_PROFILING = frozenset({"1", "2", "-1", "all", "profile", "profile_exec"})


def _profiles_execution(value: str) -> bool:
    """Whether a verbose value turns execution profiling on, read as oneDNN reads it: lower-cased, comma-separated,
    left to right, `0`/`none` clearing what came before."""
    on = False
    for token in value.lower().split(","):
        if token in ("0", "none"):
            on = False
        elif token in ONEDNN_EXEC_PROFILING:
            on = True
    return on


def onednn_exec_profiling(cfg: dict, env: Mapping[str, str], gpu_render_node: bool) -> list[str]:
    """The oneDNN verbose variables to take out of the environment on CPU so that execution profiling stays off: with
    it, OpenVINO 2026.4's CPU plugin fails to compile models most of the time (a constant's Reorder: "could not
    execute a primitive"; docs/upstream.md). oneDNN reads ONEDNN_VERBOSE, or DNNL_VERBOSE when that is unset or empty:
    so DNNL_VERBOSE counts only once ONEDNN_VERBOSE is absent, empty or taken out."""
    if not runs_on_cpu(cfg, gpu_render_node):
        return []
    out: list[str] = []
    for name in ("ONEDNN_VERBOSE", "DNNL_VERBOSE"):
        # oneDNN takes an empty value for an unset one (and falls back to DNNL_VERBOSE).
        if env.get(name, "") == "":
            continue
        if not _profiles_execution(env[name]):
            break
        out.append(name)
    return out


def onednn_cache_capacity(cfg: dict, env: Mapping[str, str], gpu_render_node: bool) -> Optional[str]:
    """The primitive-cache capacity to put in the environment before OpenVINO loads, or None to leave it.

    On CPU only (the GPU plugin's kernels are OpenCL programs, costly to rebuild): `--target_device CPU`, or AUTO on a
    machine without a GPU render node (/dev/dri/renderD*: AUTO cannot pick a GPU there; where there is one, only
    OpenVINO can tell, after this must be set, so the default stays). And only when the environment names no capacity
    of its own (oneDNN reads ONEDNN_ and DNNL_ names): a user's setting wins.
    """
    if not runs_on_cpu(cfg, gpu_render_node):
        return None
    if user_onednn_cache(env) is not None:
        return None
    return ONEDNN_CACHE_CPU


def user_onednn_cache(env: Mapping[str, str]) -> Optional[str]:
    """The primitive-cache capacity the environment sets (ONEDNN_ first, as oneDNN reads it), or None."""
    for name in (ONEDNN_CACHE_ENV, "DNNL_PRIMITIVE_CACHE_CAPACITY"):
        if name in env:
            return env[name]
    return None


def compile_properties(cfg: dict, device: str = "CPU") -> tuple[dict, list[str]]:
    """Properties for compile_model and the notes to log about them.

    On CPU the engine is exact by default: f32 inference and KV, no dynamic quantisation (bf16 and dynamic
    quantisation make a sequence's logits depend on its batch neighbours, research §7, so a resumed stream or a
    bystander next to a preemption would drift). `--kv_cache_precision u8` keeps a u8 KV, and a `--plugin_config` that
    sets any of the three keys takes over all three (OpenVINO then picks the others: bf16 inference needs a matching
    KV type) — both trade exactness for speed or memory, with a note saying so.
    """
    notes: list[str] = []
    props: dict = {"INFERENCE_NUM_THREADS": int(cfg["threads"]), "sampler_num_threads": max(1, int(cfg["threads"]))}
    kv = {"f16": "f16", "f32": "f32", "q8_0": "u8", "q4_0": "u4"}[cfg.get("kvCacheType", "f16")]
    plugin = cfg.get("pluginConfig") or {}
    exact_keys = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE")
    overridden = [k for k in exact_keys if k in plugin]
    if device == "CPU" and not overridden:
        props.update({"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})
        props["KV_CACHE_PRECISION"] = "u8" if kv == "u8" else "f32"
        if kv == "u8":
            notes.append("--kv_cache_precision u8: a u8 KV cache makes batched and resumed streams differ slightly from an uninterrupted solo run")
    elif not overridden:
        props["KV_CACHE_PRECISION"] = kv
    if device == "CPU":
        # The CPU plugin caches an executor per input shape (up to 5,000), and continuous batching makes a new shape
        # of almost every step: that cache was the worker's memory climbing for most of an hour under load (issue
        # #22's soak: +77 %, flat only from minute 48), and turning it off measured no slower (docs/openvino.md).
        props["CPU_RUNTIME_CACHE_CAPACITY"] = "0"
    props.update(plugin)
    if overridden:
        notes.append(f"--plugin_config sets {', '.join(overridden)}: OpenVINO's own defaults apply to the rest of {', '.join(exact_keys)}; resumed and batched streams may then differ from an uninterrupted solo run")
    return props, notes


def kv_element_bytes(props: dict) -> float:
    return {"f32": 4, "f16": 2, "bf16": 2, "u8": 1, "u4": 0.5}.get(str(props.get("KV_CACHE_PRECISION", "f16")).lower(), 2)
