"""Test support: writes a small random-weight llama or qwen2 GGUF whose matrices are stored in a chosen tensor type.

The prep tests need GGUFs with tensor types OpenVINO GenAI cannot load (Q5_0, F32 matrices, ...) without
downloading anything. The tokenizer (a GPT-2 style byte-level BPE with a ChatML template) is copied from a
tokenizer source GGUF, e.g. Keel's keel-tiny-f16, so that the model chats like the tiny model; the weights are random
(seeded), with matrix widths that are multiples of 32 so that every block-quantized type can store them.

Usage: python synthetic_gguf.py OUT.gguf TOKENIZER_SOURCE.gguf --arch llama|qwen2 --matrix-type Q5_0 [--seed N]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

HIDDEN = 64
FF = 128
HEADS = 4
KV_HEADS = 2
LAYERS = 2
CTX = 2048


def _copy_tokenizer_fields(reader: GGUFReader, writer: GGUFWriter) -> int:
    """Copies every `tokenizer.*` key of the source into the writer; returns the vocabulary size."""
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        writer.add_key_value(name, value, vtype, sub_type)
        if name == "tokenizer.ggml.tokens":
            vocab = len(value)
    return vocab


def _matrix(rng: np.random.Generator, rows: int, cols: int, qtype: GGMLQuantizationType) -> tuple[np.ndarray, GGMLQuantizationType]:
    """A rows x cols random matrix (numpy order; GGUF ne = [cols, rows]) stored as `qtype`."""
    data = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
    if qtype == GGMLQuantizationType.F32:
        return data, qtype
    if qtype == GGMLQuantizationType.F16:
        return data.astype(np.float16), qtype
    return quantize(data, qtype), qtype


def build(out: str, tokenizer_source: str, arch: str, matrix_type: str, seed: int) -> None:
    # 1. Header: architecture hyper-parameters (the keys OpenVINO GenAI and llama.cpp read), then the tokenizer.
    qtype = GGMLQuantizationType[matrix_type]
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(out, arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(CTX)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_file_type(0 if qtype == GGMLQuantizationType.F32 else 1 if qtype == GGMLQuantizationType.F16 else 7)
    vocab = _copy_tokenizer_fields(GGUFReader(tokenizer_source), writer)
    if vocab == 0:
        raise SystemExit(f"{tokenizer_source} has no tokenizer.ggml.tokens")

    # 2. Tensors: norms stay F32 vectors (every loader takes those); every matrix is stored as `qtype`.
    kv_dim = HIDDEN // HEADS * KV_HEADS

    def add_matrix(name: str, rows: int, cols: int) -> None:
        data, raw = _matrix(rng, rows, cols, qtype)
        writer.add_tensor(name, data, raw_dtype=raw if raw not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else None)

    add_matrix("token_embd.weight", vocab, HIDDEN)
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        add_matrix(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        add_matrix(f"blk.{i}.attn_k.weight", kv_dim, HIDDEN)
        add_matrix(f"blk.{i}.attn_v.weight", kv_dim, HIDDEN)
        if arch == "qwen2":
            # qwen2 has biases on q, k and v
            writer.add_tensor(f"blk.{i}.attn_q.bias", np.zeros(HIDDEN, dtype=np.float32))
            writer.add_tensor(f"blk.{i}.attn_k.bias", np.zeros(kv_dim, dtype=np.float32))
            writer.add_tensor(f"blk.{i}.attn_v.bias", np.zeros(kv_dim, dtype=np.float32))
        add_matrix(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        add_matrix(f"blk.{i}.ffn_gate.weight", FF, HIDDEN)
        add_matrix(f"blk.{i}.ffn_up.weight", FF, HIDDEN)
        add_matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FF)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    add_matrix("output.weight", vocab, HIDDEN)

    # 3. Write: header, key/values, tensor infos, then the data.
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="write a small random-weight GGUF with matrices of one tensor type")
    parser.add_argument("out")
    parser.add_argument("tokenizer_source")
    parser.add_argument("--arch", default="llama", help="llama or qwen2 (qwen2 adds q/k/v biases); any other name writes llama-shaped tensors under that architecture")
    parser.add_argument("--matrix-type", default="Q5_0")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    build(args.out, args.tokenizer_source, args.arch, args.matrix_type, args.seed)


if __name__ == "__main__":
    main(sys.argv[1:])
