"""The step loop's handling of a guided token that is not valid UTF-8 (utf8_guard.py), on a fake OpenVINO handle:
run by worker.unit.test.ts with the engine's venv python."""
import os
import sys
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from detokenize import ByteDetokenizer  # noqa: E402
from engine import Engine  # noqa: E402
from faults import Faults  # noqa: E402
from request_state import Request  # noqa: E402
from step_loop import read_handles  # noqa: E402
from utf8_guard import MAX_RESAMPLES, Utf8Guard  # noqa: E402

#: "a", an overlong lead (C1), a continuation byte, the lead of "é" (C3), and an end-of-generation token.
TABLE = [b"a", b"\xc1", b"\x92", b"\xc3", b"\xa9", b"<|end|>"]
EOG = 5


class FakeHandle:
    """One step's tokens from OpenVINO, then nothing."""

    def __init__(self, tokens: list[int], status: str = "RUNNING") -> None:
        self.pending = [SimpleNamespace(generated_ids=tokens, generated_log_probs=[-1.0] * len(tokens), finish_reason="GenerationFinishReason.NONE")]
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


def guided(e: Engine, temperature: float) -> Request:
    params = {"temperature": temperature, "seed": 3, "guide": {"grammar": "root ::= [a-z]+", "start": {"kind": "rule", "rule": "root", "then": "end"}}}
    req = Request(id="r", prompt=[0], resumed=[], params=params, arrived=0.0, phase="decode")
    req.detok, req.utf8 = ByteDetokenizer(TABLE, []), Utf8Guard(TABLE, [])
    e.requests["r"] = req
    return req


def step(e: Engine, req: Request, tokens: list[int], status: str = "RUNNING") -> dict:
    req.handle = FakeHandle(tokens, status)
    e.running = {7: req}
    outputs: dict = {}
    read_handles(e, outputs)
    return outputs.get("r", {})


class InvalidTokenUnderAGuide(unittest.TestCase):
    def test_sampled_request_is_re_added_with_the_valid_text_only(self):
        e = engine()
        req = guided(e, 1.0)
        handle_out = step(e, req, [0, 3])  # "a", then the lead of "é": held
        self.assertEqual((handle_out["tokens"], handle_out["text"]), ([0], "a"))
        out = step(e, req, [1, 2])  # C1 cannot continue "é": the lead and C1 are dropped, "a" stays
        self.assertEqual(out.get("tokens", []), [])
        self.assertNotIn("finish", out)
        self.assertEqual((req.produced, req.phase, e.queued, e.running), ([0], "queued", [req], {}))
        self.assertEqual((req.utf8_resamples, req.utf8.held, e.preemptions), (1, [], 0))
        self.assertEqual(e.releasing, [req])  # stopped in OpenVINO, its blocks freed by the next step
        self.assertEqual(req.utf8.rejected, b"\xc3\xc1")

    def test_greedy_request_fails_with_the_reason(self):
        e = engine()
        req = guided(e, 0)
        out = step(e, req, [0, 1])
        self.assertEqual(out["tokens"], [0])
        self.assertEqual(out["finish"]["reason"], "error")
        self.assertEqual(out["finish"]["error"]["code"], "engine_error")
        self.assertIn("greedy decoding picks it again", out["finish"]["error"]["message"])
        self.assertEqual((e.queued, "r" in e.requests), ([], False))

    def test_a_sampled_request_fails_after_too_many_invalid_draws_at_one_position(self):
        e = engine()
        req = guided(e, 1.0)
        for _ in range(MAX_RESAMPLES):
            self.assertNotIn("finish", step(e, req, [1]))
            e.queued.clear()
        out = step(e, req, [1])
        self.assertIn(f"{MAX_RESAMPLES + 1} samples in a row", out["finish"]["error"]["message"])

    def test_an_ending_request_emits_its_held_tokens(self):
        e = engine()
        req = guided(e, 1.0)
        out = step(e, req, [3], "FINISHED")
        self.assertEqual((out["tokens"], out["finish"]["reason"]), ([3], "stop"))


if __name__ == "__main__":
    unittest.main()
