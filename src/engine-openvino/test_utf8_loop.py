"""Guided output stays valid UTF-8 on OpenVINO (utf8_guard.py): the guard itself, and the step loop's handling of a
token that is not valid UTF-8 on a fake OpenVINO handle. Run by worker.unit.test.ts with the engine's venv python."""
import os
import sys
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from detokenize import ByteDetokenizer  # noqa: E402
from engine import Engine  # noqa: E402
from faults import Faults  # noqa: E402
from guides import GuideRefused  # noqa: E402
from request_state import Request  # noqa: E402
from step_loop import read_handles  # noqa: E402
from utf8_guard import MAX_RESAMPLES, Utf8Guard, resample_seed  # noqa: E402

#: Byte tokens: "a", an overlong lead (C1: "C1 92" is "R" to XGrammar), a continuation byte, the lead and continuation
#: of "é" (C3 A9), "<", the lead and continuations of "日" (E6 97 A5), an end-of-generation token, "t" and ">".
TABLE = [b"a", b"\xc1", b"\x92", b"\xc3", b"\xa9", b"<", b"\xe6", b"\x97", b"\xa5", b"<|end|>", b"t", b">"]
EOG = 9
SILENT = lambda t: t == EOG  # noqa: E731
ANY = lambda _: True  # noqa: E731 - every invalid token is to be sampled again
RULE = {"grammar": "root ::= [a-z]+", "start": {"kind": "rule", "rule": "root", "then": "end"}}
#: Free text with a trigger: a text ending in "<" stops inside the trigger's text, where a re-add cannot continue.
TRIGGERED = {"grammar": 'call ::= "<t>" [a-z]{1,3}', "start": {"kind": "free"}, "triggers": [{"text": "<t>", "rule": "call", "then": "end"}]}


class Guard(unittest.TestCase):
    def test_valid_text_is_emitted_up_to_the_last_complete_character_and_the_rest_held(self):
        g = Utf8Guard(TABLE)
        self.assertEqual(g.settle([0, 6, 7], [-1.0, -2.0, -3.0], SILENT, False, ANY), ([0], [-1.0], False))
        self.assertEqual(g.held, [6, 7])
        self.assertEqual(g.settle([8, 3], [-4.0, -5.0], SILENT, False, ANY), ([6, 7, 8], [-2.0, -3.0, -4.0], False))
        self.assertEqual(g.settle([4, EOG], [-6.0, -7.0], SILENT, False, ANY), ([3, 4, EOG], [-5.0, -6.0, -7.0], False))
        self.assertEqual(g.held, [])

    def test_an_incomplete_character_at_the_end_is_dropped(self):
        g = Utf8Guard(TABLE)
        self.assertEqual(g.settle([0, 6, EOG], [0.0] * 3, SILENT, True, ANY), ([0], [0.0], False))
        self.assertEqual(g.held, [])

    def test_an_overlong_lead_is_dropped_with_the_incomplete_character_before_it(self):
        g = Utf8Guard(TABLE)
        self.assertEqual(g.settle([0, 1, 2, 0], [0.0] * 4, SILENT, False, ANY), ([0], [0.0], True))
        self.assertEqual(g.rejected, b"\xc1")
        g = Utf8Guard(TABLE)
        g.settle([0, 6, 7], [0.0] * 3, SILENT, False, ANY)
        self.assertEqual(g.settle([3], [0.0], SILENT, False, ANY), ([], [], True))
        self.assertEqual((g.rejected, g.held, g.decoder.getstate()[0]), (b"\xe6\x97\xc3", [], b""))
        # Back at the boundary: the request continues with valid text.
        self.assertEqual(g.settle([3, 4], [0.0] * 2, SILENT, False, ANY), ([3, 4], [0.0] * 2, False))

    def test_where_no_re_add_can_continue_the_bytes_stay_and_the_check_restarts_after_them(self):
        g = Utf8Guard(TABLE)
        asked = []
        kept = g.settle([5, 1, 0, 3], [0.0] * 4, SILENT, False, lambda more: asked.append(more) or False)
        self.assertEqual((kept, asked, g.kept_invalid, g.held), (([5, 1, 0], [0.0] * 3, False), [[5]], 1, [3]))

    def test_a_lone_continuation_byte_is_invalid_at_a_boundary(self):
        self.assertEqual(Utf8Guard(TABLE).settle([2], [0.0], SILENT, False, ANY), ([], [], True))

    def test_each_resample_draws_with_another_seed(self):
        seeds = {resample_seed(7, n) for n in range(10)}
        self.assertEqual((len(seeds), resample_seed(7, 0)), (10, 7))
        self.assertTrue(all(0 <= s < 1 << 63 for s in seeds | {resample_seed((1 << 63) - 1, 3)}))


class FakeHandle:
    """One step's tokens from OpenVINO, then nothing."""

    def __init__(self, tokens: list[int], status: str, reason: str) -> None:
        self.pending = [SimpleNamespace(generated_ids=tokens, generated_log_probs=[-0.5 - i for i in range(len(tokens))], finish_reason=f"GenerationFinishReason.{reason}")]
        self.status = status
        self.stopped = False

    def can_read(self) -> bool:
        return bool(self.pending)

    def read(self) -> dict:
        return {0: self.pending.pop()}

    def get_status(self) -> str:
        return f"GenerationStatus.{self.status}"

    def stop(self) -> None:
        self.stopped = True


def engine() -> Engine:
    e = Engine.__new__(Engine)
    e.token_bytes, e.eog, e.guard = TABLE, {EOG}, None
    e.running, e.queued, e.releasing, e.requests, e.abort_arrived = {}, [], [], {}, {}
    e.preemptions, e.steps = 0, 0
    e.faults = Faults(None, first_process=True)
    return e


def guided(e: Engine, guide: dict = RULE, **params) -> Request:
    p = {"temperature": 1.0, "topP": 1.0, "topK": -1, "seed": 3, "ignoreEos": False, "guide": guide, **params}
    req = Request(id="r", prompt=[0], resumed=[], params=p, arrived=0.0, phase="decode")
    req.detok, req.utf8 = ByteDetokenizer(TABLE, []), Utf8Guard(TABLE)
    e.requests["r"] = req
    return req


def step(e: Engine, req: Request, tokens: list[int], status: str = "RUNNING", reason: str = "NONE") -> tuple[dict, int]:
    req.handle = FakeHandle(tokens, status, reason)
    e.running = {7: req}
    outputs: dict = {}
    decoded = read_handles(e, outputs)
    return outputs.get("r", {"tokens": [], "text": ""}), decoded


class InvalidTokenUnderAGuide(unittest.TestCase):
    def test_a_sampled_request_is_re_added_with_the_emitted_text_only(self):
        e = engine()
        req = guided(e, logprobs=0)
        out, decoded = step(e, req, [0, 3])  # "a", then the lead of "é": held
        self.assertEqual((out["tokens"], out["text"], decoded), ([0], "a", 2))
        self.assertEqual([p["token"] for p in out["logprobs"]], [0])
        out, decoded = step(e, req, [1, 2])  # C1 cannot continue "é": the lead and C1 are dropped, "a" stays
        self.assertEqual((out["tokens"], "finish" in out, decoded), ([], False, 2))
        self.assertEqual((req.produced, req.phase, e.queued, e.running), ([0], "queued", [req], {}))
        self.assertEqual((req.utf8_resamples, req.utf8.held, e.preemptions, req.utf8.rejected), (1, [], 0, b"\xc3\xc1"))
        self.assertEqual((e.releasing, req.handle), ([req], None))  # stopped in OpenVINO; blocks freed by its next step

    def test_a_greedy_request_keeps_the_bytes_it_would_pick_again(self):
        for params in ({"temperature": 0}, {"topK": 1}):
            e = engine()
            req = guided(e, **params)
            out, _ = step(e, req, [0, 1, 2])
            self.assertEqual((out["tokens"], out["text"], "finish" in out), ([0, 1, 2], "a\ufffd\ufffd", False))
            self.assertEqual((e.queued, req.utf8_resamples, req.utf8.kept_invalid), ([], 0, 2))  # C1, then 92 alone

    def test_a_sampled_request_keeps_the_bytes_after_too_many_invalid_draws_at_one_position(self):
        e = engine()
        req = guided(e)
        for _ in range(MAX_RESAMPLES):
            self.assertEqual(step(e, req, [1])[0]["tokens"], [])
            self.assertEqual(e.queued, [req])
            e.queued.clear()
        out, _ = step(e, req, [1])
        self.assertEqual((out["tokens"], e.queued, req.utf8_resamples), ([1], [], MAX_RESAMPLES))

    def test_an_incomplete_character_at_the_end_is_dropped(self):
        e = engine()
        req = guided(e)
        out, _ = step(e, req, [0, 3, EOG], "FINISHED", "STOP")
        self.assertEqual((out["tokens"], out["text"], out["finish"]["reason"]), ([0], "a", "stop"))

    def test_invalid_tokens_that_were_the_last_allowed_end_it_at_its_length(self):
        e = engine()
        req = guided(e)
        out, _ = step(e, req, [0, 1], "FINISHED", "LENGTH")
        self.assertEqual((out["tokens"], out["finish"]["reason"], e.queued), ([0], "length", []))

    def test_free_text_and_a_text_inside_a_trigger_keep_the_bytes_as_without_a_guide(self):
        # Free text ("a", then C1 92: two invalid characters), and "a<" (inside the trigger "<t>": no re-add continues).
        for tokens, text, kept in (([0, 1, 2, 0], "a\ufffd\ufffda", 2), ([0, 5, 2, 0], "a<\ufffda", 1)):
            e = engine()
            req = guided(e, TRIGGERED)
            out, _ = step(e, req, tokens)
            self.assertEqual((out["tokens"], out["text"], e.queued, req.utf8.kept_invalid), (tokens, text, [], kept))

    def test_bytes_kept_in_free_text_do_not_stop_a_rule_after_them_from_resampling(self):
        e = engine()
        req = guided(e, TRIGGERED)
        self.assertEqual(step(e, req, [0, 1])[0]["tokens"], [0, 1])  # free text: C1 stays
        self.assertEqual(step(e, req, [5, 10, 11])[0]["text"], "<t>")  # the trigger: its rule constrains what follows
        out, _ = step(e, req, [1])
        self.assertEqual((out["tokens"], e.queued, req.utf8_resamples), ([], [req], 1))
        # The re-add derives the guide from the text as the client got it (U+FFFD for the kept byte).
        self.assertEqual(e.generated_text(req), "a\ufffd<t>")

    def test_a_guide_cannot_resume_from_half_a_character(self):
        e = engine()
        req = guided(e)
        req.resumed = [0, 6]
        with self.assertRaises(GuideRefused):
            e.generated_text(req)

    def test_a_request_openvino_drops_re_enters_without_its_held_tokens(self):
        e = engine()
        req = guided(e)
        out, _ = step(e, req, [0, 6], "IGNORED")
        self.assertEqual((out["tokens"], req.produced, req.utf8.held, e.queued), ([0], [0], [], [req]))
        self.assertEqual(req.utf8.decoder.getstate()[0], b"")

    def test_held_tokens_count_in_the_pool(self):
        e = engine()
        req = guided(e)
        step(e, req, [0, 6, 7])
        self.assertEqual((req.utf8.held, req.context_len), ([6, 7], 1 + 1 + 2))

    def test_a_resampled_request_draws_with_another_seed(self):
        import openvino_genai

        e = engine()
        e.ov = openvino_genai
        req = guided(e, seed=11)
        req.utf8_resamples = 2
        self.assertEqual(e.generation_config(req, 8).rng_seed, resample_seed(11, 2))


if __name__ == "__main__":
    unittest.main()
