"""Rotary positions from `position_ids` for IRs whose export leaves that input unused (docs/upstream.md, "hybrid").

optimum-intel's export of Qwen3.5/3.6 text models (`qwen3_5_text`) computes the rotary positions inside the graph as
arange(past_len, past_len + L), past_len read from the shape of the KV-cache state; its `position_ids` input has no
consumer. OpenVINO GenAI's paged-attention transformation then gives every token of a step one position, so the
output depends on prefill chunking and on the other sequences of a step. Feeding `position_ids` (which GenAI fills
per token) into the rotary embedding instead makes the paged model match the stateful one, bitwise batch-invariant.

`python rope_positions.py SRC_DIR DST_DIR` writes a rewired copy of an IR folder and prints one JSON object
({"rewired": [node names]}; empty when the IR needs nothing, and then nothing is written).
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import openvino as ov

#: Nodes a position tensor passes through between the arange and the broadcast to the rotary's [3, B, L] (mrope).
_PASS_THROUGH = {"Reshape", "Unsqueeze", "Squeeze", "Convert"}


def _position_ids(model: ov.Model):
    """The `position_ids` parameter when nothing in the graph reads it, else None."""
    for p in model.get_parameters():
        if p.get_friendly_name() == "position_ids" and not p.output(0).get_target_inputs():
            return p
    return None


def _from_range(node, hops: int = 3) -> bool:
    """True if `node` is an arange (Range), possibly behind a few reshapes."""
    for _ in range(hops + 1):
        if node.get_type_name() == "Range":
            return True
        if node.get_type_name() not in _PASS_THROUGH:
            return False
        node = node.input(0).get_source_output().get_node()
    return False


def _feeds_rotary(node, depth: int = 4) -> bool:
    """True if the node's output reaches a node of the rotary embedding within a few steps."""
    frontier = [node]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for out in n.outputs():
                for t in out.get_target_inputs():
                    c = t.get_node()
                    if "rotary_emb" in c.get_friendly_name():
                        return True
                    nxt.append(c)
        frontier = nxt
    return False


def wire_position_ids(model: ov.Model) -> list[str]:
    """Rewires, in place, each broadcast of an in-graph arange into the rotary embedding to read `position_ids`
    ([B, L] → [1, B, L], broadcast as before). Returns the rewired nodes' names (empty: nothing to change)."""
    pos = _position_ids(model)
    if pos is None:
        return []
    rewired = []
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Broadcast" or node.get_output_partial_shape(0).rank.get_length() != 3:
            continue
        src = node.input(0).get_source_output()
        if not _from_range(src.get_node()) or not _feeds_rotary(node) or src.get_element_type() != pos.get_element_type():
            continue
        unsqueezed = ov.opset13.unsqueeze(pos, ov.opset13.constant([0], dtype=ov.Type.i64))
        node.input(0).replace_source_output(unsqueezed.output(0))
        rewired.append(node.get_friendly_name())
    if rewired:
        model.validate_nodes_and_infer_types()
    return rewired


def rewire_folder(src_dir: str, dst_dir: str) -> list[str]:
    """Writes a copy of the IR folder with the model rewired (tokenizer files and configs copied as they are)."""
    core = ov.Core()
    model = core.read_model(os.path.join(src_dir, "openvino_model.xml"))
    rewired = wire_position_ids(model)
    if not rewired:
        return []
    os.makedirs(dst_dir, exist_ok=True)
    for name in os.listdir(src_dir):
        if not name.startswith("openvino_model.") and os.path.isfile(os.path.join(src_dir, name)):
            shutil.copy2(os.path.join(src_dir, name), dst_dir)
    ov.save_model(model, os.path.join(dst_dir, "openvino_model.xml"), compress_to_fp16=False)
    return rewired


if __name__ == "__main__":
    print(json.dumps({"rewired": rewire_folder(sys.argv[1], sys.argv[2])}))
