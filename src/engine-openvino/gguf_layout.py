"""GGUF layout, read with struct over a memory map: gguf.GGUFReader decodes every string of a 151k-token vocabulary
into numpy views and takes ~30 s on a Qwen file; this reads only what prep (and the worker's metadata) need, in well
under a second."""
from __future__ import annotations

import struct
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT
from gguf import GGMLQuantizationType as Q


class PrepError(Exception):
    """A model that cannot be prepared for OpenVINO; the message says why and what to do."""


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
