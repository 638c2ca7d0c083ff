"""Unit tests of the OpenVINO worker's pure parts (run by worker.unit.test.ts with the engine's venv python)."""
import json
import os
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from channel import FrameDecoder, encode_frame  # noqa: E402
from messages import parse_message, sampling_error  # noqa: E402
from detokenize import ByteDetokenizer, Detokenizer  # noqa: E402
from tokenizer_limit import tokenizer_cap  # noqa: E402
from model_meta import is_hybrid  # noqa: E402
from faults import Faults  # noqa: E402
from ov_settings import ONEDNN_CACHE_CPU, compile_properties, onednn_cache_capacity, onednn_exec_profiling, user_onednn_cache  # noqa: E402
from hybrid_guard import HybridGuard, hybrid_prefix_caching, hybrid_settings  # noqa: E402
from model_meta import model_metadata  # noqa: E402

BASE = {"maxTokens": 4, "temperature": 0, "topP": 1, "topK": -1, "seed": 1, "ignoreEos": False}


class Framing(unittest.TestCase):
    def test_round_trip_split_anywhere(self):
        data = encode_frame({"v": 1, "type": "ping", "nonce": 3}) + encode_frame({"a": "é"})
        for cut in range(len(data) + 1):
            d = FrameDecoder()
            frames = d.push(data[:cut]) + d.push(data[cut:])
            self.assertEqual(frames, [{"v": 1, "type": "ping", "nonce": 3}, {"a": "é"}])

    def test_oversized_and_junk_frames_are_reported_and_skipped(self):
        d = FrameDecoder(max_frame_bytes=8)
        big = struct.pack(">I", 20) + b"x" * 20
        junk = struct.pack(">I", 3) + b"{no"
        frames = d.push(big + junk + encode_frame({"k": 1}))
        self.assertEqual(len(frames), 3)
        self.assertIn("exceeds", frames[0])
        self.assertIn("not JSON", frames[1])
        self.assertEqual(frames[2], {"k": 1})


class Validation(unittest.TestCase):
    def test_ranges(self):
        self.assertIsNone(sampling_error(BASE))
        for bad in ({"temperature": 3}, {"topP": 0}, {"topK": -2}, {"seed": -1}, {"repetitionPenalty": 0},
                    {"presencePenalty": 2.5}, {"minP": 1.5}, {"maxTokens": 0}, {"minTokens": 5},
                    {"logitBias": [[1, 2], [1, 3]]}, {"logprobs": -1}, {"bogus": 1}, {"ignoreEos": 1}):
            self.assertIsNotNone(sampling_error({**BASE, **bad}), bad)

    def test_messages(self):
        self.assertEqual(parse_message({"v": 2, "type": "ping", "nonce": 1})[0], "protocol_error")
        self.assertEqual(parse_message({"v": 1, "type": "reboot"})[0], "protocol_error")
        self.assertEqual(parse_message({"v": 1, "type": "add", "prompt": {"text": "x"}, "params": BASE})[0], "protocol_error")
        refused = parse_message({"v": 1, "type": "add", "id": "a", "prompt": {"text": "x"}, "params": {**BASE, "temperature": 9}})
        self.assertEqual(refused[:2], ("refuse", "a"))
        self.assertEqual(parse_message({"v": 1, "type": "add", "id": "a", "prompt": {"tokens": [1]}, "params": BASE})[0], "ok")


class Text(unittest.TestCase):
    TABLE = [b"a", b"\xc3", b"\xa9", b"\x80", b"<|x|>"]

    def test_bytes_split_character_held_back_then_completed(self):
        d = ByteDetokenizer(self.TABLE, [])
        self.assertEqual(d.push([0, 1]), "a")
        self.assertEqual(d.push([2]), "é")

    def test_invalid_byte_becomes_replacement_and_final_flushes(self):
        d = ByteDetokenizer(self.TABLE, [])
        self.assertEqual(d.push([3, 0]), "\ufffda")
        self.assertEqual(d.push([1]), "")
        self.assertEqual(d.push([], final=True), "\ufffd")

    def test_resume_priming_completes_a_split_character_without_repeating(self):
        d = ByteDetokenizer(self.TABLE, [0, 1])
        self.assertEqual(d.push([2, 4]), "é<|x|>")

    def test_window_detokenizer_resumed_anywhere_continues_exactly(self):
        # Invalid and split characters everywhere (a random-weight model's bytes): what the first engine emitted
        # before the cut + what an engine primed with the cut's tokens emits = the whole text, at every cut.
        decode = lambda ids: b"".join(self.TABLE[i] for i in ids).decode("utf-8", errors="replace")  # noqa: E731
        ids = [3, 1, 0, 3, 3, 1, 2, 3, 1, 1, 2, 0, 3, 1, 4, 3, 3, 3, 0, 1, 2]
        whole = decode(ids)
        for cut, chunk in ((c, k) for c in range(len(ids) + 1) for k in (1, 3)):
            first = Detokenizer(decode, [])  # one token a step, or three (a resumed request's first step)
            before = "".join(first.push(ids[i:min(i + chunk, cut)]) for i in range(0, cut, chunk))
            second = Detokenizer(decode, ids[:cut])
            after = "".join(second.push([t]) for t in ids[cut:]) + second.push([], final=True)
            self.assertEqual(before + after, whole, f"cut at {cut}, {chunk} a step")

    def test_window_detokenizer_concatenates_to_the_whole(self):
        pieces = {1: "he", 2: "llo", 3: " wor", 4: "ld"}
        decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
        d = Detokenizer(decode, [])
        out = "".join(d.push([t]) for t in [1, 2, 3, 4]) + d.push([], final=True)
        self.assertEqual(out, "hello world")


class TokenizerCut(unittest.TestCase):
    def test_a_cut_is_where_twice_the_text_counts_the_same(self):
        self.assertEqual(tokenizer_cap(lambda t: min(len(t.split()), 8192)), 8192)
        self.assertIsNone(tokenizer_cap(lambda t: len(t.split())))


class Settings(unittest.TestCase):
    CFG = {"threads": 2, "kvCacheType": "f16", "device": "cpu", "prefixCaching": True}

    def test_exact_numerics_by_default_on_cpu_and_plugin_config_overrides_with_a_note(self):
        props, notes = compile_properties(self.CFG)
        self.assertEqual((props["INFERENCE_PRECISION_HINT"], props["KV_CACHE_PRECISION"], props["DYNAMIC_QUANTIZATION_GROUP_SIZE"]), ("f32", "f32", "0"))
        self.assertEqual(notes, [])
        props, notes = compile_properties({**self.CFG, "pluginConfig": {"INFERENCE_PRECISION_HINT": "bf16"}})
        self.assertEqual(props["INFERENCE_PRECISION_HINT"], "bf16")
        # bf16 inference needs OpenVINO's matching KV type: the exact KV is not forced then.
        self.assertNotIn("KV_CACHE_PRECISION", props)
        self.assertNotIn("DYNAMIC_QUANTIZATION_GROUP_SIZE", props)
        self.assertEqual(len(notes), 1)

    def test_cpu_shape_cache_off_unless_plugin_config_sets_it(self):
        self.assertEqual(compile_properties(self.CFG)[0]["CPU_RUNTIME_CACHE_CAPACITY"], "0")
        self.assertEqual(compile_properties({**self.CFG, "pluginConfig": {"CPU_RUNTIME_CACHE_CAPACITY": 5000}})[0]["CPU_RUNTIME_CACHE_CAPACITY"], 5000)
        self.assertNotIn("CPU_RUNTIME_CACHE_CAPACITY", compile_properties(self.CFG, "GPU")[0])

    def test_onednn_execution_profiling_is_taken_out_on_cpu_only(self):
        cpu = {**self.CFG, "device": "cpu"}
        for value in ("all", "ALL", "1", "2", "-1", "profile", "profile_exec", "dispatch,PROFILE_EXEC", "none,all"):
            self.assertEqual(onednn_exec_profiling(cpu, {"ONEDNN_VERBOSE": value}, False), ["ONEDNN_VERBOSE"], value)
        # Read as oneDNN reads it: no trimming, and 0/none clears what came before.
        for value in ("", "0", "none", "all,none", "profile,0", "dispatch", "profile_create", "check,warn,error", "debuginfo=1", "dispatch, profile_exec"):
            self.assertEqual(onednn_exec_profiling(cpu, {"ONEDNN_VERBOSE": value}, False), [], value)
        # DNNL_VERBOSE is read only without ONEDNN_VERBOSE: once that is taken out, or when it is absent.
        self.assertEqual(onednn_exec_profiling(cpu, {"ONEDNN_VERBOSE": "all", "DNNL_VERBOSE": "1"}, False), ["ONEDNN_VERBOSE", "DNNL_VERBOSE"])
        self.assertEqual(onednn_exec_profiling(cpu, {"ONEDNN_VERBOSE": "all", "DNNL_VERBOSE": "dispatch"}, False), ["ONEDNN_VERBOSE"])
        self.assertEqual(onednn_exec_profiling(cpu, {"ONEDNN_VERBOSE": "dispatch", "DNNL_VERBOSE": "all"}, False), [])
        self.assertEqual(onednn_exec_profiling(cpu, {"DNNL_VERBOSE": "all"}, False), ["DNNL_VERBOSE"])
        # An empty ONEDNN_VERBOSE is unset to oneDNN: DNNL_VERBOSE is read (a breaker's crash-loop).
        self.assertEqual(onednn_exec_profiling(cpu, {"ONEDNN_VERBOSE": "", "DNNL_VERBOSE": "profile_exec"}, False), ["DNNL_VERBOSE"])
        self.assertEqual(onednn_exec_profiling({**self.CFG, "device": "gpu"}, {"ONEDNN_VERBOSE": "all"}, False), [])
        self.assertEqual(onednn_exec_profiling({**self.CFG, "device": "auto"}, {"ONEDNN_VERBOSE": "all"}, False), ["ONEDNN_VERBOSE"])
        self.assertEqual(onednn_exec_profiling({**self.CFG, "device": "auto"}, {"ONEDNN_VERBOSE": "all"}, True), [])

    def test_onednn_cache_bounded_on_cpu_unless_the_environment_sets_it(self):
        self.assertEqual(onednn_cache_capacity(self.CFG, {}, True), ONEDNN_CACHE_CPU)
        self.assertEqual(onednn_cache_capacity({**self.CFG, "device": "cpu"}, {"PATH": "/bin"}, False), ONEDNN_CACHE_CPU)
        self.assertIsNone(onednn_cache_capacity({**self.CFG, "device": "cpu"}, {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}, False))
        self.assertIsNone(onednn_cache_capacity({**self.CFG, "device": "cpu"}, {"DNNL_PRIMITIVE_CACHE_CAPACITY": ""}, False))
        self.assertEqual(user_onednn_cache({"DNNL_PRIMITIVE_CACHE_CAPACITY": "", "PATH": "/bin"}), "")
        self.assertIsNone(onednn_cache_capacity({**self.CFG, "device": "gpu"}, {}, False))
        # AUTO cannot pick a GPU on a machine without a render node: it runs on the CPU, capped; with one, left alone.
        self.assertEqual(onednn_cache_capacity({**self.CFG, "device": "auto"}, {}, False), ONEDNN_CACHE_CPU)
        self.assertIsNone(onednn_cache_capacity({**self.CFG, "device": "auto"}, {}, True))

    def test_u8_kv_is_applied_with_a_note(self):
        props, notes = compile_properties({**self.CFG, "kvCacheType": "q8_0"})
        self.assertEqual(props["KV_CACHE_PRECISION"], "u8")
        self.assertEqual(props["INFERENCE_PRECISION_HINT"], "f32")
        self.assertEqual(len(notes), 1)

    def test_hybrid_detection_and_kv_of_full_attention_layers_only(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"model_type": "qwen3_5_text", "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                           "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 400}, f)
            self.assertTrue(is_hybrid(d))
            # K and V of the one full-attention layer: 2 x 1 layer x 1 head x 32.
            self.assertEqual(model_metadata(d)["kvElementsPerToken"], 64)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"model_type": "qwen2", "layer_types": ["full_attention"] * 2}, f)
            self.assertFalse(is_hybrid(d))


class HybridScheduling(unittest.TestCase):
    CFG = {"maxNumSeqs": 3, "maxNumBatchedTokens": 4096, "maxModelLen": 864, "cacheIntervalMultiplier": 64}

    def test_linear_attention_pool_from_kv_pool_and_sequences(self):
        on = hybrid_settings(self.CFG, True, 27, 32, True)
        # LA block 32 x 64 = 2048 tokens; a full 864-token pool spans 1 LA block, plus one partial block a sequence.
        self.assertEqual((on.la_block_tokens, on.la_blocks, on.interval_multiplier), (2048, 4, 64))
        small = hybrid_settings({**self.CFG, "cacheIntervalMultiplier": 1}, True, 27, 32, True)
        self.assertEqual((small.la_block_tokens, small.la_blocks), (32, 27 + 3))
        off = hybrid_settings(self.CFG, False, 27, 32, True)
        self.assertEqual((off.la_block_tokens, off.la_blocks, off.max_num_seqs), (None, 3, 3))

    def test_prefix_caching_off_on_hybrid_models_with_why(self):
        on, why = hybrid_prefix_caching({"prefixCaching": True, "cacheIntervalMultiplier": 64})
        self.assertFalse(on)
        self.assertIn("--cache_interval_multiplier 64", why)
        for cfg in ({"prefixCaching": True, "cacheIntervalMultiplier": 1}, {"prefixCaching": True}):
            on, why = hybrid_prefix_caching(cfg)
            self.assertFalse(on)
            self.assertIn("some prefix-cache hits", why)
        self.assertEqual(hybrid_prefix_caching({"prefixCaching": False, "cacheIntervalMultiplier": 64}), (False, None))

    def test_deterministic_is_one_sequence_per_step_with_whole_prompts_when_not_rewired(self):
        d = hybrid_settings({**self.CFG, "deterministic": True, "maxNumBatchedTokens": 256}, False, 27, 32, True, exact_positions=False)
        self.assertEqual((d.max_num_seqs, d.split_fuse, d.batched_tokens, d.la_blocks), (1, False, 864, 1))
        # A rewired IR (rotary from position_ids) is exact batched: --deterministic keeps the schedule.
        r = hybrid_settings({**self.CFG, "deterministic": True, "maxNumBatchedTokens": 256}, False, 27, 32, True)
        self.assertEqual((r.max_num_seqs, r.split_fuse, r.batched_tokens), (3, True, 256))

    def test_guard_preempts_the_latest_admitted_whole_before_the_pool_runs_short(self):
        class R:
            def __init__(self, n, produced):
                self.input_len, self.produced = n, [0] * produced
        blocks_for = lambda t: -(-(t + 1) // 32)  # noqa: E731
        g = HybridGuard(hybrid_settings(self.CFG, True, 8, 32, True), 8, blocks_for)
        a, b, c = R(60, 0), R(60, 0), R(60, 0)
        # 3 x 2 blocks now and next step: fits.
        self.assertEqual(g.victims({0: a, 1: b, 2: c}), [])
        # At 63 tokens each the next token needs a third block each: 9 > 8, the latest admitted (id 2) goes.
        a.produced = b.produced = c.produced = [0] * 3
        self.assertEqual(g.victims({0: a, 1: b, 2: c}), [c])
        # The oldest is never preempted (a request larger than the pool is refused at add).
        self.assertEqual(g.victims({5: R(300, 0)}), [])
        self.assertFalse(g.admits([a, b], [], R(100, 0)))
        self.assertTrue(g.admits([a], [], R(100, 0)))
        self.assertEqual(g.la_in_use([a, b]), 2)


class FaultInjection(unittest.TestCase):
    def test_step_switches_fire_once_and_only_on_the_first_process(self):
        f = Faults({"throwAtStep": 2, "ignoreAtStep": 3}, first_process=True)
        self.assertEqual([f.step_raises(s) for s in (1, 2, 2)], [False, True, False])
        self.assertEqual([f.ignores(s) for s in (3, 3)], [True, False])
        later = Faults({"throwAtStep": 2}, first_process=False)
        self.assertFalse(later.step_raises(2))

    def test_prompt_switch_matches_running_prompts(self):
        f = Faults({"crashOnPrompt": "POISON"}, first_process=False)
        self.assertTrue(f.on_prompt("crashOnPrompt", lambda: ["ok", "a POISON prompt"], 1))
        self.assertFalse(f.on_prompt("crashOnPrompt", lambda: ["ok"], 2))

    def test_off_without_switches(self):
        f = Faults(None, first_process=True)
        f.before_step(1, lambda: [])
        self.assertFalse(f.step_raises(1))
        self.assertFalse(f.ignores(1))


if __name__ == "__main__":
    unittest.main()
