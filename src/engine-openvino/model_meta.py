"""Model metadata (what `ready` announces): from the GGUF header or the IR directory's config.json, plus the
vocabulary's token bytes (byte-level GGUF vocabularies) and whether the model has recurrent layers."""
from __future__ import annotations

import json
import os
from typing import Optional


def _gguf_fields(path: str) -> dict:
    """Scalar and string keys of a GGUF header, plus its vocabulary (token strings and types)."""
    import mmap

    from gguf_layout import read_gguf_layout  # a struct reader: gguf.GGUFReader takes ~30 s on a 151k-token vocabulary

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        layout = read_gguf_layout(buf, frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"}))
    out = {name: key.value for name, key in layout.keys.items() if key.value is not None}
    if "tokenizer.ggml.tokens" in out:
        out["tokenizer.ggml.tokens"] = [b.decode("utf-8", "replace") for b in out["tokenizer.ggml.tokens"]]
    return out


def model_metadata(model_path: str) -> dict:
    """ModelMetadata (src/protocol/messages.ts) of a GGUF file or an OpenVINO IR directory."""
    if os.path.isdir(model_path):
        # A folder prepared from a GGUF (prep.py's manifest): the GGUF's own metadata, vocabulary bytes included.
        manifest = os.path.join(model_path, "manifest.json")
        source = json.load(open(manifest)).get("source", {}).get("path") if os.path.exists(manifest) else None
        if source and os.path.isfile(source):
            meta = model_metadata(source)
            _TOKEN_TABLES[model_path] = _TOKEN_TABLES[source]
            return {**meta, "path": model_path}
        cfg_path = os.path.join(model_path, "config.json")
        cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
        layers = cfg.get("num_hidden_layers")
        if cfg.get("layer_types"):
            # A hybrid model keeps paged KV only in its full-attention layers (linear-attention state is apart).
            layers = sum(1 for t in cfg["layer_types"] if t == "full_attention")
        heads = cfg.get("num_attention_heads")
        kv_heads = cfg.get("num_key_value_heads", heads)
        head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads and cfg.get("hidden_size") else None)
        return {
            "path": model_path,
            "name": cfg.get("_name_or_path") or os.path.basename(os.path.normpath(model_path)),
            "architecture": cfg.get("model_type", "unknown"),
            "trainContextSize": cfg.get("max_position_embeddings", 4096),
            "vocabSize": cfg.get("vocab_size") or _ir_vocab_size(model_path),
            "chatTemplate": None,  # filled from the tokenizer
            "kvElementsPerToken": 2 * layers * kv_heads * head_dim if layers and kv_heads and head_dim else None,
            "bosToken": "",
            "eosToken": "",
        }
    f = _gguf_fields(model_path)
    arch = f.get("general.architecture", "unknown")
    tokens = f.get("tokenizer.ggml.tokens", [])
    layers = f.get(f"{arch}.block_count")
    heads = f.get(f"{arch}.attention.head_count")
    kv_heads = f.get(f"{arch}.attention.head_count_kv", heads)
    emb = f.get(f"{arch}.embedding_length")
    head_dim = f.get(f"{arch}.attention.key_length") or (emb // heads if emb and heads else None)
    tok = lambda key: tokens[f[key]] if key in f and 0 <= f[key] < len(tokens) else ""  # noqa: E731
    _TOKEN_TABLES[model_path] = (f.get("tokenizer.ggml.model"), tokens, f.get("tokenizer.ggml.token_type"))
    return {
        "path": model_path,
        "name": f.get("general.name"),
        "architecture": arch,
        "trainContextSize": f.get(f"{arch}.context_length", 2048),
        "vocabSize": len(tokens),
        "chatTemplate": f.get("tokenizer.chat_template"),
        "kvElementsPerToken": 2 * layers * kv_heads * head_dim if layers and kv_heads and head_dim else None,
        "bosToken": tok("tokenizer.ggml.bos_token_id"),
        "eosToken": tok("tokenizer.ggml.eos_token_id"),
    }


def _ir_vocab_size(model_dir: str) -> int:
    """The logits width of an IR model (its vocabulary size) when config.json does not say."""
    import openvino as ov

    model = ov.Core().read_model(os.path.join(model_dir, "openvino_model.xml"))
    for out in model.outputs:
        if "logits" in out.get_names() or len(model.outputs) == 1:
            return int(out.get_partial_shape()[-1].get_length())
    return int(model.outputs[0].get_partial_shape()[-1].get_length())


#: Vocabulary of each GGUF read by model_metadata: (tokenizer model, token strings, token types).
_TOKEN_TABLES: dict = {}


def _gpt2_byte_decoder() -> dict:
    """GPT-2 byte-level BPE: the printable character standing for each byte in token strings → that byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def token_bytes_table(model_path: str) -> Optional[list]:
    """The raw bytes of every token of a byte-level (gpt2) GGUF vocabulary, or None when unknown.

    Protocol §6.2 defines a request's text as the UTF-8 decoding of its tokens' bytes (invalid sequences → U+FFFD);
    OpenVINO's detokenizer drops invalid bytes instead, so the engine decodes bytes itself where it can.
    """
    entry = _TOKEN_TABLES.get(model_path)
    if not entry or entry[0] != "gpt2":
        return None
    _, tokens, types = entry
    dec = _gpt2_byte_decoder()
    table = []
    for i, text in enumerate(tokens):
        kind = types[i] if types and i < len(types) else 1
        if kind in (3, 4):  # control and user-defined tokens: their text as is
            table.append(text.encode("utf-8"))
        else:
            table.append(bytes(dec[ch] for ch in text if ch in dec) if all(ch in dec for ch in text) else text.encode("utf-8"))
    return table


def is_hybrid(model_path: str) -> bool:
    """A model with linear-attention (recurrent) layers: the seed's assert needs one (root-cause.md)."""
    cfg_path = os.path.join(model_path, "config.json") if os.path.isdir(model_path) else None
    if not cfg_path or not os.path.exists(cfg_path):
        return False  # GGUF: OpenVINO GenAI loads only llama/qwen2/qwen3 from GGUF, all pure attention
    cfg = json.load(open(cfg_path))
    layer_types = cfg.get("layer_types") or []
    return any(t != "full_attention" for t in layer_types) or "next" in str(cfg.get("model_type", ""))
