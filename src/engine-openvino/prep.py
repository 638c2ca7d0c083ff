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
imports this module, and `python prep.py MODEL_PATH CACHE_DIR` prints the path to load.
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
import struct
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT
from gguf import GGMLQuantizationType as Q
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
#: `general.file_type` (llama.cpp's LLAMA_FTYPE numbering) written when the source has none (OpenVINO GenAI then fails
#: with `unordered_map::at`) or says ALL_F32 after its F32 matrices became F16: the "mostly" type of the most common
#: matrix type after re-encoding.
FILE_TYPE_OF_MATRIX_TYPE = {Q.F16: 1, Q.Q4_0: 2, Q.Q4_1: 3, Q.Q8_0: 7, Q.Q4_K: 15, Q.Q6_K: 18}
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
# GGUF layout (read with struct over a memory map: gguf.GGUFReader decodes every string of a 151k-token vocabulary
# into numpy views and takes ~30 s on a Qwen file; this reads only what prep needs, in well under a second)

#: struct formats of GGUF scalar value types (8 = string and 9 = array are handled apart).
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4


@dataclass(frozen=True)
class GgufTensor:
    """One tensor info of a GGUF file."""

    name: str
    #: GGML dimensions, contiguous one first (ne[0] is the row length).
    dims: tuple[int, ...]
    type: Q
    #: Byte offset of the data from the start of the data section.
    offset: int

    @property
    def nbytes(self) -> int:
        """Stored size in bytes."""
        block, block_bytes = GGML_QUANT_SIZES[self.type]
        return _row_count(self.dims) * (self.dims[0] // block) * block_bytes


def _row_count(dims: tuple[int, ...]) -> int:
    """Number of rows of a tensor: the product of every dimension after the first (ne[0] is one row)."""
    count = 1
    for d in dims[1:]:
        count *= d
    return count


@dataclass(frozen=True)
class GgufKey:
    """One key/value entry: its decoded value (scalars and strings only; None for arrays) and its raw bytes' span."""

    value_type: int
    value: object
    start: int
    end: int


@dataclass
class GgufLayout:
    """What prep needs of a GGUF file: its version, keys, tensor infos and where the data section starts."""

    version: int
    keys: dict[str, GgufKey]
    tensors: list[GgufTensor]
    alignment: int
    data_start: int

    def value(self, key: str):
        """Decoded value of a scalar or string key, None when absent."""
        entry = self.keys.get(key)
        return None if entry is None else entry.value


def read_gguf_layout(buf, arrays: frozenset = frozenset()) -> GgufLayout:
    """Parses the header of a GGUF (v2 or v3, little-endian) held in `buf` (bytes or a memory map). Array values are
    skipped (value None) except for the keys named in `arrays`, decoded as lists (the worker reads the vocabulary).
    :raises PrepError: not a GGUF this code reads"""
    if bytes(buf[0:4]) != b"GGUF":
        raise PrepError("not a GGUF file")
    version, = struct.unpack_from("<I", buf, 4)
    if version not in (2, 3):
        raise PrepError(f"GGUF version {version} is not supported (2 or 3; a big-endian file reads as a huge version)")
    n_tensors, n_keys = struct.unpack_from("<QQ", buf, 8)
    pos = 24

    def read_string(at: int) -> tuple[str, int]:
        n, = struct.unpack_from("<Q", buf, at)
        return bytes(buf[at + 8:at + 8 + n]).decode("utf-8", errors="replace"), at + 8 + n

    def skip_value(vtype: int, at: int) -> int:
        if vtype == _GGUF_STRING:
            n, = struct.unpack_from("<Q", buf, at)
            return at + 8 + n
        if vtype == _GGUF_ARRAY:
            item_type, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if item_type in _GGUF_SCALARS:
                return at + count * struct.calcsize(_GGUF_SCALARS[item_type])
            for _ in range(count):
                at = skip_value(item_type, at)
            return at
        return at + struct.calcsize(_GGUF_SCALARS[vtype])

    def read_array(at: int) -> tuple[list, int]:
        item_type, count = struct.unpack_from("<IQ", buf, at)
        at += 12
        if item_type in _GGUF_SCALARS:
            fmt = _GGUF_SCALARS[item_type]
            size = struct.calcsize(fmt)
            return list(struct.unpack_from(f"<{count}{fmt[1:]}", buf, at)), at + count * size
        if item_type == _GGUF_STRING:
            items = []
            for _ in range(count):
                n, = struct.unpack_from("<Q", buf, at)
                items.append(bytes(buf[at + 8:at + 8 + n]))
                at += 8 + n
            return items, at
        return [], skip_value(_GGUF_ARRAY, at - 12)

    # 1. Keys: decode scalars and strings, remember every entry's byte span (copied as is when rewriting).
    keys: dict[str, GgufKey] = {}
    for _ in range(n_keys):
        start = pos
        name, pos = read_string(pos)
        vtype, = struct.unpack_from("<I", buf, pos)
        pos += 4
        if vtype == _GGUF_STRING:
            value, end = read_string(pos)
        elif vtype in _GGUF_SCALARS:
            value, = struct.unpack_from(_GGUF_SCALARS[vtype], buf, pos)
            end = pos + struct.calcsize(_GGUF_SCALARS[vtype])
        elif vtype == _GGUF_ARRAY and name in arrays:
            value, end = read_array(pos)
        elif vtype == _GGUF_ARRAY:
            value, end = None, skip_value(vtype, pos)
        else:
            raise PrepError(f"key {name!r} has unknown value type {vtype}")
        keys[name] = GgufKey(vtype, value, start, end)
        pos = end

    # 2. Tensor infos.
    tensors: list[GgufTensor] = []
    for _ in range(n_tensors):
        name, pos = read_string(pos)
        n_dims, = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        ttype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        try:
            qtype = Q(ttype)
        except ValueError:
            raise PrepError(f"tensor {name!r} has unknown type {ttype}") from None
        tensors.append(GgufTensor(name, tuple(int(d) for d in dims), qtype, int(offset)))

    # 3. The data section starts at the next multiple of the alignment.
    alignment = int(keys["general.alignment"].value) if "general.alignment" in keys else GGUF_DEFAULT_ALIGNMENT
    return GgufLayout(version, keys, tensors, alignment, -(-pos // alignment) * alignment)


# ---------------------------------------------------------------------------------------------------------------------
# Re-encoding


def _is_matrix(dims: tuple[int, ...]) -> bool:
    """True for tensors with more than one non-trivial dimension (weights), false for vectors (norms, biases)."""
    return sum(1 for d in dims if d > 1) > 1


def plan_reencoding(layout: GgufLayout) -> list[Reencoding]:
    """The tensors of a GGUF OpenVINO cannot load, each with the type it will be stored as.

    Quantized matrices of other types become Q8_0 (at least as precise as any 4-6 bit type; every block-quantized type
    has rows that are multiples of 32); float matrices become F16; vectors that are not F32 become F32.
    """
    plan: list[Reencoding] = []
    for t in layout.tensors:
        if _is_matrix(t.dims):
            if t.type in OPENVINO_MATRIX_TYPES:
                continue
            if t.type in FLOAT_TYPES or t.dims[0] % 32 != 0:
                plan.append(Reencoding(t.name, t.type, Q.F16))
            else:
                plan.append(Reencoding(t.name, t.type, Q.Q8_0))
        elif t.type != Q.F32:
            plan.append(Reencoding(t.name, t.type, Q.F32))
    return plan


#: Bytes of one Q5_0 block (f16 scale, 32 high bits, 16 bytes of low nibbles) and of one Q8_0 block (f16 scale, 32 int8).
Q5_0_BLOCK_BYTES = 22
Q8_0_BLOCK_BYTES = 34


def q5_0_to_q8_0(data: np.ndarray) -> np.ndarray:
    """Q5_0 blocks to Q8_0 blocks, exactly: a Q5_0 value is (q - 16) * d with q in 0..31, which Q8_0 stores as the
    int8 q - 16 with the same scale d. Pure bit work (no float round trip), so it is lossless and fast.

    `data` is uint8 with whole blocks in its last axis; the result has the same leading shape. Layout per block
    (ggml): element j < 16 is the low nibble of qs[j] plus bit j of qh as bit 4; element j + 16 is the high nibble of
    qs[j] plus bit j + 16 of qh.
    """
    blocks = np.ascontiguousarray(data).reshape(-1, Q5_0_BLOCK_BYTES)
    qh = blocks[:, 2:6].copy().view("<u4")  # (n, 1): the 32 fifth bits
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4  # (n, 32)
    qs = blocks[:, 6:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1) | high  # (n, 32) in 0..31
    out = np.empty((blocks.shape[0], Q8_0_BLOCK_BYTES), dtype=np.uint8)
    out[:, :2] = blocks[:, :2]  # the same f16 scale
    out[:, 2:] = (q.astype(np.int16) - 16).astype(np.int8).view(np.uint8)
    return out.reshape(data.shape[:-1] + (data.shape[-1] // Q5_0_BLOCK_BYTES * Q8_0_BLOCK_BYTES,))


def _decode_rows(rows: np.ndarray, source: Q) -> np.ndarray:
    """uint8 rows of stored tensor data to float32 rows (gguf.quants for block types, views for plain floats)."""
    if source == Q.F64:
        return rows.view("<f8").astype(np.float32)
    return dequantize(rows, source)


def reencode_rows(rows: np.ndarray, source: Q, target: Q) -> np.ndarray:
    """Re-encodes uint8 rows of stored data from `source` to `target`, returned as uint8 rows; a chunk of rows at a
    time, which bounds the float32 copy of a large matrix in memory."""
    if source == Q.Q5_0 and target == Q.Q8_0:
        return q5_0_to_q8_0(rows)
    parts = []
    for start in range(0, rows.shape[0], REENCODE_ROWS_PER_CHUNK):
        # 1. Decode this chunk to float32; 2. encode it in the target type, as bytes.
        floats = _decode_rows(rows[start:start + REENCODE_ROWS_PER_CHUNK], source)
        encoded = quantize(floats, target)
        parts.append(np.ascontiguousarray(encoded).view(np.uint8).reshape(floats.shape[0], -1))
    return np.concatenate(parts, axis=0)


def _file_type_after(layout: GgufLayout, plan: list[Reencoding]) -> int | None:
    """The `general.file_type` to write, or None to keep the source's: set when absent or ALL_F32 (no F32 matrix is
    left after the re-encoding), from the most common matrix type after re-encoding."""
    current = layout.value("general.file_type")
    if current is not None and int(current) != 0:
        return None
    new_types = {r.name: r.target_type for r in plan}
    counts: dict[Q, int] = {}
    for t in layout.tensors:
        if _is_matrix(t.dims):
            kind = new_types.get(t.name, t.type)
            counts[kind] = counts.get(kind, 0) + 1
    most_common = max(counts, key=lambda k: counts[k], default=Q.F16)
    return FILE_TYPE_OF_MATRIX_TYPE.get(most_common, FILE_TYPE_OF_MATRIX_TYPE[Q.F16])


def _gguf_string(text: str) -> bytes:
    """A GGUF string: u64 byte length, then UTF-8 bytes."""
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _pad(f, alignment: int) -> None:
    """Writes zeros up to the next multiple of `alignment`."""
    f.write(b"\0" * (-f.tell() % alignment))


def reencode_gguf(source: str, target: str, plan: list[Reencoding], log: Log = _no_log) -> None:
    """Writes `target`: `source` with the tensors in `plan` stored in their new type and every key copied byte for
    byte (`general.file_type` set when it was absent or ALL_F32). Streams tensor by tensor from a memory map; the
    largest re-encoded tensor is held once in memory."""
    targets = {r.name: r for r in plan}
    with open(source, "rb") as src, mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as header:
        layout = read_gguf_layout(header)
        key_bytes = {name: header[entry.start:entry.end] for name, entry in layout.keys.items()}
    # numpy's own read-only map for the data: views of it may outlive this function (a traceback), which a plain
    # mmap would refuse to close under.
    data = np.memmap(source, dtype=np.uint8, mode="r")
    new_file_type = _file_type_after(layout, plan)

    def stored(t: GgufTensor) -> np.ndarray:
        """The tensor's stored bytes as rows (one row = ne[0] elements)."""
        start = layout.data_start + t.offset
        return data[start:start + t.nbytes].reshape(_row_count(t.dims), -1)

    with open(target, "wb") as out:
        # 1. Header and keys: each key's raw bytes copied, except a replaced file type.
        keys = [k for k in layout.keys if not (k == "general.file_type" and new_file_type is not None)]
        out.write(b"GGUF" + struct.pack("<IQQ", layout.version, len(layout.tensors), len(keys) + (new_file_type is not None)))
        for name in keys:
            out.write(key_bytes[name])
        if new_file_type is not None:
            out.write(_gguf_string("general.file_type") + struct.pack("<II", _GGUF_UINT32, new_file_type))

        # 2. Tensor infos with the new types and offsets (each tensor's data aligned).
        offset = 0
        for t in layout.tensors:
            new_type = targets[t.name].target_type if t.name in targets else t.type
            out.write(_gguf_string(t.name) + struct.pack(f"<I{len(t.dims)}Q", len(t.dims), *t.dims))
            out.write(struct.pack("<IQ", int(new_type), offset))
            offset += -(-GgufTensor(t.name, t.dims, new_type, 0).nbytes // layout.alignment) * layout.alignment
        _pad(out, layout.alignment)

        # 3. Data: unchanged tensors copied as bytes, the others re-encoded.
        for t in layout.tensors:
            r = targets.get(t.name)
            if r is None:
                out.write(stored(t))
            else:
                try:
                    encoded = reencode_rows(stored(t), r.source_type, r.target_type)
                except NotImplementedError:
                    raise PrepError(f"{source}: tensor {t.name} is {r.source_type.name}, which neither OpenVINO GenAI "
                                    f"nor the gguf package's decoder reads; use a GGUF with other quantization") from None
                expected = GgufTensor(t.name, t.dims, r.target_type, 0).nbytes
                if encoded.nbytes != expected:
                    raise PrepError(f"re-encoding {t.name} gave {encoded.nbytes} bytes, expected {expected}")
                out.write(np.ascontiguousarray(encoded))
            _pad(out, layout.alignment)
    del data
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
