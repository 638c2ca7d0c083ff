"""Writes keel-hybrid-tiny: a tiny random-weight hybrid model (Gated DeltaNet linear-attention layers mixed with
full-attention layers, the Qwen3.5/3.6 family the seed serves) as an OpenVINO IR with its tokenizer and detokenizer.

Run by src/engine-openvino/hybrid-model.ts with the python of the model-making venv (make-requirements.txt):
`python make_hybrid.py OUT_DIR`. Deterministic: fixed seeds, a fixed training text for the tokenizer. Prints the
output folder on its last line. Nothing is downloaded: the config, the weights and the tokenizer are made here.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

#: Layer mix: linear-attention layers around one full-attention layer (the family's 3:1 pattern, shortened).
LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
#: Tokenizer vocabulary: the 256 byte symbols, merges learnt from TRAINING_TEXT, and the special tokens.
VOCAB_SIZE = 400
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. Hello there, how are you today?",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "You are a helpful assistant. Answer the question and explain your reasoning step by step.",
    "system user assistant tool function parameter name arguments content role message",
]
#: ChatML with tools, as Qwen's templates write them (enough for hermes-style tool calls and reasoning tests).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] if message['content'] is string else '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def make_hf(hf_dir: str) -> None:
    """A random-weight Qwen3.5-text checkpoint and its tokenizer, saved in transformers' format."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3_5TextConfig, Qwen3_5ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(hf_dir)

    cfg = Qwen3_5TextConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYER_TYPES),
        layer_types=LAYER_TYPES, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1]},
        eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, bos_token_id=None,
        # Wider than the default 0.02: logits with clear margins, so greedy text does not hang on float ties.
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(cfg).to(torch.float32).eval()
    model.save_pretrained(hf_dir, safe_serialization=True)
    with open(os.path.join(hf_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": fast.eos_token_id, "pad_token_id": fast.pad_token_id, "do_sample": False}, f)


def export(hf_dir: str, out_dir: str) -> None:
    """optimum-intel's OpenVINO export (fp32 weights, with past: the stateful model GenAI turns into paged attention)."""
    cli = os.path.join(os.path.dirname(sys.executable), "optimum-cli")
    subprocess.run([cli, "export", "openvino", "-m", hf_dir, "--task", "text-generation-with-past",
                    "--weight-format", "fp32", out_dir], check=True, stdout=sys.stderr)


def main() -> None:
    out = os.path.abspath(sys.argv[1])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    # Built beside the target and renamed into place last: a half-written folder is never taken for the model.
    work = tempfile.mkdtemp(prefix=".building-", dir=parent)
    try:
        hf_dir = os.path.join(work, "hf")
        ir_dir = os.path.join(work, "ir")
        make_hf(hf_dir)
        export(hf_dir, ir_dir)
        for name in ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml"):
            if not os.path.exists(os.path.join(ir_dir, name)):
                raise SystemExit(f"the export wrote no {name}")
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(ir_dir, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(out)


if __name__ == "__main__":
    main()
