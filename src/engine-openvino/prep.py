"""Model preparation for the OpenVINO engine: turns what `--model_path` names into a directory OpenVINO GenAI loads fast.

OpenVINO GenAI reads GGUF files directly, but (measured, openvino-genai 2026.4.1, CPU):
- only some tensor types load: matrices in F16, Q8_0, Q4_0, Q4_1, Q4_K or Q6_K; F32 and BF16 matrices fail
  (`Unsupported quantization type`), Q5_0 and Q5_1 fail (`gguf_tensor_to_f16 failed`);
- only the llama, qwen2 and qwen3 architectures load, and `general.file_type` must be present;
- converting a GGUF on every start is 3-4x slower than loading the OpenVINO IR it can save
  (`enable_save_ov_model`), which gives the same tokens.

So `prepare()` re-encodes the tensors OpenVINO cannot load (quantized ones to Q8_0, float matrices to F16, vectors to
F32), has OpenVINO GenAI convert the result once, keeps only the IR (model + tokenizer + detokenizer), and caches it
under `<cache_dir>/openvino/<stem>-<key12>/` with a manifest written last. Later starts reuse the folder after a cheap
check. Concurrent preparers each build in a private temp folder and rename it into place; the loser uses the winner's.

Only the standard library, numpy, gguf and openvino_genai (imported when a conversion runs) are used: the worker
imports this module, and `python prep.py MODEL_PATH CACHE_DIR` prints the path to load.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

Log = Callable[[str], None]

#: Bump when the prepared folder's content or layout changes: it is part of the cache key, so old folders are not reused.
PREP_FORMAT_VERSION = 1
#: Matrix (2-D and up) tensor types OpenVINO GenAI's GGUF reader loads (measured, see the module doc).
OPENVINO_MATRIX_TYPES = frozenset({Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K})
#: Float matrix types that become F16 (lossless for F16-range weights) rather than Q8_0.
FLOAT_TYPES = frozenset({Q.F32, Q.BF16, Q.F64})
#: Architectures OpenVINO GenAI builds from a GGUF (src/gguf_utils/gguf_modeling.cpp).
OPENVINO_GGUF_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
#: `general.file_type` values written when the source has none or is ALL_F32 (llama.cpp's LLAMA_FTYPE numbering).
FILE_TYPE_MOSTLY_F16 = 1
FILE_TYPE_MOSTLY_Q8_0 = 7
#: The IR file whose presence makes a directory loadable as-is.
IR_MODEL_FILE = "openvino_model.xml"
#: Written last into a prepared folder: its presence (with matching sizes) is what "complete" means.
MANIFEST_FILE = "manifest.json"
#: The intermediate GGUF inside a folder being prepared (OpenVINO saves the IR next to the file it loads).
STAGED_GGUF = "model.gguf"
#: Bytes hashed at each end of the source for its fingerprint: cheap, and catches a file replaced in place.
FINGERPRINT_SPAN = 1 << 20
#: Rows re-encoded at a time: bounds the float32 copy of a large matrix (e.g. a 151936-row embedding) in memory.
REENCODE_ROWS_PER_CHUNK = 4096


class PrepError(Exception):
    """A model that cannot be prepared for OpenVINO; the message says why and what to do."""


@dataclass(frozen=True)
class Reencoding:
    """One tensor whose stored type changes so that OpenVINO can load it."""

    name: str
    source_type: Q
    target_type: Q


def _no_log(_line: str) -> None:
    """Default log sink: drops the line."""


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
        if IR_MODEL_FILE not in files:
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
# Re-encoding


def _is_matrix(shape) -> bool:
    """True for tensors with more than one non-trivial dimension (weights), false for vectors (norms, biases)."""
    return sum(1 for d in shape if int(d) > 1) > 1


def plan_reencoding(reader: GGUFReader) -> list[Reencoding]:
    """The tensors of a GGUF OpenVINO cannot load, each with the type it will be stored as.

    Quantized matrices of other types become Q8_0 (at least as precise as any 4-6 bit type; every block-quantized type
    has rows that are multiples of 32); float matrices become F16; vectors that are not F32 become F32.
    """
    plan: list[Reencoding] = []
    for t in reader.tensors:
        if _is_matrix(t.shape):
            if t.tensor_type in OPENVINO_MATRIX_TYPES:
                continue
            if t.tensor_type in FLOAT_TYPES or int(t.shape[0]) % 32 != 0:
                plan.append(Reencoding(t.name, t.tensor_type, Q.F16))
            else:
                plan.append(Reencoding(t.name, t.tensor_type, Q.Q8_0))
        elif t.tensor_type != Q.F32:
            plan.append(Reencoding(t.name, t.tensor_type, Q.F32))
    return plan


def _field_value(reader: GGUFReader, key: str):
    """The decoded value of a GGUF key, or None when absent."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _reencode_rows(data: np.ndarray, source: Q, target: Q) -> np.ndarray:
    """Re-encodes a tensor's stored rows from `source` to `target`, a chunk of rows at a time (bounded memory)."""
    rows = data.reshape((-1, data.shape[-1]))
    parts = []
    for start in range(0, rows.shape[0], REENCODE_ROWS_PER_CHUNK):
        # 1. Decode this chunk to float32; 2. encode it in the target type.
        floats = dequantize(rows[start:start + REENCODE_ROWS_PER_CHUNK], source)
        parts.append(quantize(floats, target))
    out = np.concatenate(parts, axis=0)
    return out.reshape(data.shape[:-1] + out.shape[-1:])


def _file_type_after(reader: GGUFReader, plan: list[Reencoding]) -> int | None:
    """The `general.file_type` to write: kept unless absent or ALL_F32 (F32 matrices are gone after the re-encoding)."""
    current = _field_value(reader, "general.file_type")
    if current is not None and int(current) != 0:
        return None
    any_q8 = any(r.target_type == Q.Q8_0 for r in plan)
    return FILE_TYPE_MOSTLY_Q8_0 if any_q8 else FILE_TYPE_MOSTLY_F16


def reencode_gguf(source: str, target: str, plan: list[Reencoding], log: Log = _no_log) -> None:
    """Writes `target`: `source` with the tensors in `plan` stored in their new type, every key copied (the file type
    set when it was absent or ALL_F32). Streams tensor by tensor; the largest re-encoded tensor is held once."""
    reader = GGUFReader(source)
    if reader.endianess != GGUFEndian.LITTLE:
        raise PrepError(f"{source}: big-endian GGUF files are not supported")
    arch = str(_field_value(reader, "general.architecture"))
    targets = {r.name: r for r in plan}
    writer = GGUFWriter(target, arch)

    # 1. Keys: every real key (GGUF.* are the reader's pseudo-fields); the writer already wrote the architecture.
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type)
        if name == "general.alignment":
            writer.data_alignment = int(field.contents())
    file_type = _file_type_after(reader, plan)
    if file_type is not None:
        writer.add_key_value("general.file_type", file_type, GGUFValueType.UINT32)

    # 2. Tensor infos, in the source's order; the new bytes of re-encoded tensors are computed when written (step 3).
    def new_layout(t) -> tuple[tuple[int, ...], np.dtype, int]:
        r = targets[t.name]
        logical = tuple(int(d) for d in reversed(t.shape))  # numpy order: rows first, the contiguous row last
        if r.target_type == Q.Q8_0:
            block, block_bytes = 32, 34
            shape = logical[:-1] + (logical[-1] // block * block_bytes,)
            return shape, np.dtype(np.uint8), int(np.prod(shape))
        dtype = np.dtype(np.float16 if r.target_type == Q.F16 else np.float32)
        return logical, dtype, int(np.prod(logical)) * dtype.itemsize

    for t in reader.tensors:
        if t.name in targets:
            shape, dtype, nbytes = new_layout(t)
            writer.add_tensor_info(t.name, shape, dtype, nbytes, targets[t.name].target_type)
        else:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    # 3. Tensor data, one tensor at a time.
    for t in reader.tensors:
        r = targets.get(t.name)
        writer.write_tensor_data(t.data if r is None else _reencode_rows(t.data, r.source_type, r.target_type))
    writer.close()
    counts: dict[str, int] = {}
    for r in plan:
        key = f"{r.source_type.name}->{r.target_type.name}"
        counts[key] = counts.get(key, 0) + 1
    log(f"prep: re-encoded {len(plan)} tensors ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))})")


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
    """Name prefix of the temp folders of preparers building `final`: `.<name>.tmp-`."""
    return f".{os.path.basename(final)}.tmp-"


def _sweep_abandoned(final: str, log: Log) -> None:
    """Removes temp folders next to `final` whose preparer process is gone (crashed or killed mid-build)."""
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
        reader = GGUFReader(model_path)
        arch = str(_field_value(reader, "general.architecture"))
        if arch not in OPENVINO_GGUF_ARCHITECTURES:
            raise PrepError(f"{model_path}: OpenVINO GenAI builds only {', '.join(sorted(OPENVINO_GGUF_ARCHITECTURES))} "
                            f"models from a GGUF; this one is {arch!r} (convert it to OpenVINO IR with optimum-intel)")
        plan = plan_reencoding(reader)
        needs_file_type = _field_value(reader, "general.file_type") is None
        del reader  # closes the memory map before the (possibly large) rewrite
        staged = os.path.join(tmp, STAGED_GGUF)
        if plan or needs_file_type:
            log(f"prep: {os.path.basename(model_path)}: re-encoding {len(plan)} tensors OpenVINO cannot load")
            reencode_gguf(model_path, staged, plan, log)
        else:
            _link_or_copy(model_path, staged)
        reencoded_at = time.monotonic()
        log(f"prep: converting to OpenVINO IR in {tmp}")
        save_ir_next_to(staged)
        converted_at = time.monotonic()
        if not os.path.isfile(os.path.join(tmp, IR_MODEL_FILE)):
            raise PrepError(f"OpenVINO GenAI did not save an IR for {model_path}")
        # The IR alone loads and gives the GGUF's greedy tokens (src/engine-openvino/prep.test.ts checks it), so the
        # intermediate GGUF is dropped: it would double the disk use of a prepared model.
        os.unlink(staged)
        timings = {"reencode": round(reencoded_at - started, 3), "convert": round(converted_at - reencoded_at, 3)}
        # 4. Manifest last, then the atomic rename.
        _write_manifest(tmp, model_path, fingerprint, plan, timings)
        published = _publish(tmp, final, fingerprint, log)
        log(f"prep: prepared {published} in {time.monotonic() - started:.1f} s "
            f"(re-encode {timings['reencode']} s, conversion {timings['convert']} s)")
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
