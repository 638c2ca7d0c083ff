"""Re-encoding of the GGUF tensors OpenVINO GenAI cannot load: quantized matrices to Q8_0, float matrices to F16,
vectors to F32, written into a new GGUF with the same keys (and a `general.file_type` OpenVINO accepts)."""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from gguf_layout import _GGUF_UINT32, GgufLayout, GgufTensor, PrepError, _row_count, read_gguf_layout

Log = Callable[[str], None]

#: Matrix (2-D and up) tensor types OpenVINO GenAI's GGUF reader loads (measured, see prep.py's module doc).
OPENVINO_MATRIX_TYPES = frozenset({Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K})
#: Float matrix types that become F16 (lossless for F16-range weights) rather than Q8_0.
FLOAT_TYPES = frozenset({Q.F32, Q.BF16, Q.F64})
#: `general.file_type` (llama.cpp's LLAMA_FTYPE numbering) written when the source has none (OpenVINO GenAI then fails
#: with `unordered_map::at`) or says ALL_F32 after its F32 matrices became F16: the "mostly" type of the most common
#: matrix type after re-encoding.
FILE_TYPE_OF_MATRIX_TYPE = {Q.F16: 1, Q.Q4_0: 2, Q.Q4_1: 3, Q.Q8_0: 7, Q.Q4_K: 15, Q.Q6_K: 18}
#: Rows re-encoded at a time: bounds the float32 copy of a large matrix (e.g. a 151936-row embedding) in memory.
REENCODE_ROWS_PER_CHUNK = 4096


@dataclass(frozen=True)
class Reencoding:
    """One tensor whose stored type changes so that OpenVINO can load it."""

    name: str
    source_type: Q
    target_type: Q


def _no_log(_line: str) -> None:
    """Default log sink: drops the line."""


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
