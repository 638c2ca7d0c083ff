"""Model preparation for the OpenVINO engine: turns what `--model_path` names into a directory OpenVINO GenAI loads fast.

OpenVINO GenAI reads GGUF files directly, but (measured, openvino-genai 2026.4.1, CPU):
- only some tensor types load: matrices in F16, Q8_0, Q4_0, Q4_1, Q4_K or Q6_K; F32 and BF16 matrices fail
  (`Unsupported quantization type`), Q5_0 and Q5_1 fail (`gguf_tensor_to_f16 failed`);
- only the llama, qwen2 and qwen3 architectures load, and `general.file_type` must be present;
- converting a GGUF on every start is slower than loading the OpenVINO IR it can save (`enable_save_ov_model`),
  which gives the same tokens: Qwen2.5-Coder-0.5B 18 s vs 4.6 s, SmolLM2-135M 9.5 s vs 6.8 s
  (bench/openvino_prep.py, 2 shared cores).

So `prepare()` re-encodes the tensors OpenVINO cannot load (quantized ones to Q8_0, float matrices to F16, vectors to
F32), has OpenVINO GenAI convert the result once, keeps only the IR (model + tokenizer + detokenizer), and caches it
under `<cache_dir>/openvino/<stem>-<key12>/` with a manifest written last. Later starts reuse the folder after a cheap
check. Concurrent preparers each build in a private temp folder and rename it into place; the loser uses the winner's.

Only the standard library, numpy, gguf and openvino_genai (imported when a conversion runs) are used: the worker
imports this module, and `python prep.py MODEL_PATH CACHE_DIR` prints the path to load. The GGUF header reader is
gguf_layout.py, the tensor re-encoding reencode.py; this file is the cache (key, manifest, publishing) and `prepare`.
"""
from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import re
import secrets
import shutil
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_layout import PrepError, read_gguf_layout  # noqa: E402
from reencode import Log, Reencoding, _file_type_after, _no_log, plan_reencoding, reencode_gguf  # noqa: E402

#: Bump when the prepared folder's content or layout changes: it is part of the cache key, so old folders are not reused.
PREP_FORMAT_VERSION = 1
#: Architectures OpenVINO GenAI builds from a GGUF (src/gguf_utils/gguf_modeling.cpp).
OPENVINO_GGUF_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
#: The IR file whose presence makes a directory loadable as-is.
IR_MODEL_FILE = "openvino_model.xml"
#: What a prepared folder must hold: the model and the (de)tokenizer IR (text in, text out, stop strings, grammars).
IR_REQUIRED_FILES = (IR_MODEL_FILE, "openvino_model.bin", "openvino_tokenizer.xml", "openvino_tokenizer.bin",
                     "openvino_detokenizer.xml", "openvino_detokenizer.bin")
#: Written last into a prepared folder: its presence (with matching sizes) is what "complete" means.
MANIFEST_FILE = "manifest.json"
#: The intermediate GGUF inside a folder being prepared (OpenVINO saves the IR next to the file it loads).
STAGED_GGUF = "model.gguf"
#: Bytes hashed at each end of the source for its fingerprint: cheap, and catches a file replaced in place.
FINGERPRINT_SPAN = 1 << 20


# ---------------------------------------------------------------------------------------------------------------------
# Identity of a source file


def source_key(model_path: str) -> str:
    """Cache key of a GGUF: sha256 of its real path, size and mtime (no content read), the format version and the
    openvino-genai version (an IR saved by another version is not reused)."""
    real = os.path.realpath(model_path)
    st = os.stat(real)
    text = "\n".join([real, str(st.st_size), str(st.st_mtime_ns), f"prep-v{PREP_FORMAT_VERSION}", _genai_version()])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def source_fingerprint(model_path: str) -> dict:
    """Size and sha256 of the first and last MiB of a file: recorded in the manifest, checked before reuse."""
    size = os.path.getsize(model_path)
    h = hashlib.sha256()
    with open(model_path, "rb") as f:
        h.update(f.read(FINGERPRINT_SPAN))
        if size > FINGERPRINT_SPAN:
            f.seek(max(FINGERPRINT_SPAN, size - FINGERPRINT_SPAN))
            h.update(f.read(FINGERPRINT_SPAN))
    return {"size": size, "sha256_head_tail": h.hexdigest()}


def _genai_version() -> str:
    """Version of the installed openvino-genai distribution, read from its metadata (importing it costs ~1 s)."""
    try:
        from importlib.metadata import version

        return version("openvino-genai")
    except Exception:  # noqa: BLE001 -- not installed: prepare() fails later with OpenVINO's own error
        return "unknown"


def prepared_dir(model_path: str, cache_dir: str) -> str:
    """Where the prepared IR of `model_path` lives: `<cache_dir>/openvino/<stem>-<key12>`."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.splitext(os.path.basename(os.path.realpath(model_path)))[0])[:64]
    return os.path.join(os.path.abspath(cache_dir), "openvino", f"{stem}-{source_key(model_path)[:12]}")


def is_ir_dir(path: str) -> bool:
    """True if `path` is a directory OpenVINO GenAI loads as it is (it holds openvino_model.xml)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, IR_MODEL_FILE))


# ---------------------------------------------------------------------------------------------------------------------
# Manifest


def read_complete_manifest(folder: str, fingerprint: dict) -> dict | None:
    """The folder's manifest if the folder is complete: every listed file present with its size, and the source
    fingerprint equal to `fingerprint`. None otherwise (missing, partial, or made from other bytes)."""
    try:
        with open(os.path.join(folder, MANIFEST_FILE), encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        if manifest.get("format") != PREP_FORMAT_VERSION or manifest["source"]["fingerprint"] != fingerprint:
            return None
        if any(name not in files for name in IR_REQUIRED_FILES):
            return None
        for name, size in files.items():
            if os.path.getsize(os.path.join(folder, name)) != size:
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_manifest(folder: str, source: str, fingerprint: dict, reencoded: list[Reencoding], timings: dict) -> None:
    """Writes manifest.json last, through a temp file and a rename, so a reader sees the whole manifest or none."""
    files = {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
    manifest = {
        "format": PREP_FORMAT_VERSION,
        "openvino_genai": _genai_version(),
        "source": {"path": os.path.realpath(source), "fingerprint": fingerprint},
        "reencoded": [{"name": r.name, "from": r.source_type.name, "to": r.target_type.name} for r in reencoded],
        "seconds": timings,
        "files": files,
    }
    tmp = os.path.join(folder, f".{MANIFEST_FILE}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(folder, MANIFEST_FILE))



# ---------------------------------------------------------------------------------------------------------------------
# Conversion to IR


def save_ir_next_to(gguf_path: str) -> None:
    """Has OpenVINO GenAI load `gguf_path` once with enable_save_ov_model, which writes openvino_model.xml/.bin and
    the (de)tokenizer IR next to it (the tokenizer IR only when the key is in tokenizer_properties too)."""
    import openvino_genai as ov_genai  # heavy (~1 s); only a conversion needs it

    scheduler = ov_genai.SchedulerConfig()
    scheduler.num_kv_blocks = 8  # the pipeline only has to exist: a tiny fixed KV pool
    save = {"enable_save_ov_model": True}
    pipe = ov_genai.ContinuousBatchingPipeline(gguf_path, scheduler, "CPU", dict(save), dict(save))
    del pipe


# ---------------------------------------------------------------------------------------------------------------------
# Publishing


def _pid_alive(pid: int) -> bool:
    """True if a process with this id exists on this host (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _temp_prefix(final: str) -> str:
    """Name prefix of this host's temp folders for `final`: `.<name>.tmp-<host>-` (then `<pid>-<random>`). The host
    name keeps a preparer on another machine or container sharing the cache (whose pids mean nothing here) safe from
    the sweep."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())
    return f".{os.path.basename(final)}.tmp-{host}-"


def _sweep_abandoned(final: str, log: Log) -> None:
    """Removes this host's temp folders next to `final` whose preparer process is gone (crashed or killed mid-build)."""
    parent, prefix = os.path.dirname(final), _temp_prefix(final)
    for name in os.listdir(parent):
        m = re.fullmatch(re.escape(prefix) + r"(\d+)-[0-9a-f]+", name)
        if m and not _pid_alive(int(m.group(1))):
            log(f"prep: removing {name}, left by process {m.group(1)} that is gone")
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _publish(tmp: str, final: str, fingerprint: dict, log: Log) -> str:
    """Renames the complete folder `tmp` to `final` (atomic). If a complete `final` appeared meanwhile (a concurrent
    preparer won), drops `tmp` and returns the winner's; an incomplete `final` (damaged) is moved aside and replaced."""
    for _attempt in range(2):
        try:
            os.rename(tmp, final)
            return final
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if read_complete_manifest(final, fingerprint) is not None:
            log(f"prep: another process prepared {final} first; using it")
            shutil.rmtree(tmp, ignore_errors=True)
            return final
        aside = f"{final}.damaged-{os.getpid()}-{secrets.token_hex(4)}"
        log(f"prep: {final} is incomplete; replacing it")
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            pass
        shutil.rmtree(aside, ignore_errors=True)
    raise PrepError(f"could not move the prepared model into {final}")


def _drop_older_versions(final: str, source: str, log: Log) -> None:
    """Removes the other prepared folders of the same source path (made before the file changed: another size or
    mtime gives another key), so that updating a model in place does not pile up IRs in the cache."""
    parent, real = os.path.dirname(final), os.path.realpath(source)
    stem = os.path.basename(final)[:-13]  # "<stem>-<key12>"
    for name in os.listdir(parent):
        folder = os.path.join(parent, name)
        if name == os.path.basename(final) or not re.fullmatch(re.escape(stem) + r"-[0-9a-f]{12}", name):
            continue
        try:
            with open(os.path.join(folder, MANIFEST_FILE), encoding="utf-8") as f:
                if json.load(f)["source"]["path"] != real:
                    continue
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a folder this code completed: left alone
        log(f"prep: removing {folder}, prepared from an earlier version of {real}")
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------------
# Entry point


def prepare(model_path: str, cache_dir: str, log: Log = _no_log) -> str:
    """Returns the path OpenVINO GenAI should load for `model_path` (see the module doc).

    An IR directory is returned as is. A GGUF is prepared once into `<cache_dir>/openvino/<stem>-<key12>/` and that
    folder is returned (reused while its manifest matches the source).
    :raises PrepError: not a GGUF or IR directory, or an architecture OpenVINO cannot build from a GGUF
    """
    # 1. What was given.
    if is_ir_dir(model_path):
        return model_path
    if os.path.isdir(model_path):
        raise PrepError(f"{model_path} is a directory without {IR_MODEL_FILE}: give an OpenVINO IR directory or a GGUF file")
    if not os.path.isfile(model_path):
        raise PrepError(f"{model_path} does not exist")
    with open(model_path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise PrepError(f"{model_path} is not a GGUF file")

    # 2. Reuse a complete prepared folder.
    final = prepared_dir(model_path, cache_dir)
    fingerprint = source_fingerprint(model_path)
    if read_complete_manifest(final, fingerprint) is not None:
        log(f"prep: using the prepared model in {final}")
        return final

    # 3. Build it in a private temp folder next to the final one.
    os.makedirs(os.path.dirname(final), exist_ok=True)
    _sweep_abandoned(final, log)
    tmp = os.path.join(os.path.dirname(final), f"{_temp_prefix(final)}{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(tmp)
    try:
        started = time.monotonic()
        with open(model_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            layout = read_gguf_layout(buf)
        arch = str(layout.value("general.architecture"))
        if arch not in OPENVINO_GGUF_ARCHITECTURES:
            raise PrepError(f"{model_path}: OpenVINO GenAI builds only {', '.join(sorted(OPENVINO_GGUF_ARCHITECTURES))} "
                            f"models from a GGUF; this one is {arch!r} (convert it to OpenVINO IR with optimum-intel)")
        plan = plan_reencoding(layout)
        needs_file_type = _file_type_after(layout, plan) is not None
        staged = os.path.join(tmp, STAGED_GGUF)
        if plan or needs_file_type:
            log(f"prep: {os.path.basename(model_path)}: re-encoding {len(plan)} tensors OpenVINO cannot load"
                + (" and setting general.file_type" if needs_file_type else ""))
            reencode_gguf(model_path, staged, plan, log)
        else:
            _link_or_copy(model_path, staged)
        reencoded_at = time.monotonic()
        log(f"prep: converting to OpenVINO IR in {tmp}")
        try:
            save_ir_next_to(staged)
        except Exception as err:  # noqa: BLE001 -- OpenVINO raises RuntimeError, IndexError (missing keys), ...
            raise PrepError(f"OpenVINO GenAI cannot convert {model_path}: {type(err).__name__}: {err}".rstrip()) from err
        converted_at = time.monotonic()
        missing = [name for name in IR_REQUIRED_FILES if not os.path.isfile(os.path.join(tmp, name))]
        if missing:
            raise PrepError(f"OpenVINO GenAI did not save {', '.join(missing)} for {model_path}")
        # The IR alone loads and gives the GGUF's greedy tokens (src/engine-openvino/prep.test.ts checks it), so the
        # intermediate GGUF is dropped: it would double the disk use of a prepared model.
        os.unlink(staged)
        timings = {"reencode": round(reencoded_at - started, 3), "convert": round(converted_at - reencoded_at, 3)}
        # 4. Manifest last, then the atomic rename.
        _write_manifest(tmp, model_path, fingerprint, plan, timings)
        published = _publish(tmp, final, fingerprint, log)
        _drop_older_versions(published, model_path, log)
        log(f"prep: ready: {published} (this run: {time.monotonic() - started:.1f} s; "
            f"re-encode {timings['reencode']} s, conversion {timings['convert']} s)")
        return published
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _link_or_copy(source: str, target: str) -> None:
    """Hard-links `source` as `target` (no copy of a large file); copies when linking is impossible (another device)."""
    try:
        os.link(os.path.realpath(source), target)
    except OSError:
        shutil.copyfile(source, target)


def main(argv: list[str]) -> int:
    """`python prep.py MODEL_PATH CACHE_DIR`: prepares the model, prints the path to load; log lines go to stderr."""
    if len(argv) != 2:
        print("usage: python prep.py MODEL_PATH CACHE_DIR", file=sys.stderr)
        return 2
    try:
        path = prepare(argv[0], argv[1], lambda line: print(line, file=sys.stderr, flush=True))
    except PrepError as err:
        print(f"prep: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
