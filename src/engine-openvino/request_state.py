"""One request the gateway added, as the OpenVINO worker keeps it until its finish is emitted."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from detokenize import ByteDetokenizer, Detokenizer

#: Where a request is; the same words as the gateway's lifecycle and the llama.cpp scheduler.
Phase = Literal["queued", "prefill", "decode"]


@dataclass
class Request:
    """One request the gateway added; it lives here until its finish is emitted."""

    #: Gateway id.
    id: str
    #: Prompt token ids (as tokenized here; without resumed tokens).
    prompt: list[int]
    #: Tokens generated on earlier engines (resume); prefilled after the prompt.
    resumed: list[int]
    params: dict
    #: When the add arrived (monotonic seconds), for queueMs.
    arrived: float
    #: The gateway's phase names (src/gateway/requests/lifecycle.ts): `queued` (in our queue, not yet in OpenVINO),
    #: `prefill` (added to OpenVINO, `handle` set, no token sampled since it was (re)scheduled) or `decode` (sampling;
    #: a decode that then yields nothing was preempted, and is back in prefill).
    phase: Phase = "queued"
    #: OpenVINO's GenerationHandle; kept alive while running (dropping the last reference stops the request).
    handle: Any = None
    #: Tokens this engine generated.
    produced: list[int] = field(default_factory=list)
    #: Streaming text state.
    detok: Optional[ByteDetokenizer | Detokenizer] = None
    #: The last finish reason OpenVINO reported (NONE until the end).
    last_reason: str = "NONE"
    #: Prefill tokens not yet computed (estimate, for batchTokens).
    prefill_left: int = 0
    #: OpenVINO's GenerationConfig, built and validated at add.
    gen_config: Any = None
    #: Tokens this engine may generate for the request (max_tokens less resumed ones, or up to the capacity).
    max_new: int = 0
    #: Times OpenVINO dropped the request (IGNORED) and the loop re-added it with what it had generated.
    requeues: int = 0
    #: Times the hybrid-model guard preempted the request whole (hybrid_guard.py) and the loop re-queued it.
    guard_preemptions: int = 0
    #: Guided requests on a byte-level vocabulary: the strict UTF-8 check of their text, holding an incomplete character.
    utf8: Any = None
    #: Times a sampled token was not valid UTF-8 and the loop re-added the request to sample it again (utf8_guard.py).
    utf8_resamples: int = 0
    #: Where (generated tokens) the last resample happened, and how many happened there in a row.
    utf8_at: int = -1
    utf8_in_a_row: int = 0

    @property
    def reentered(self) -> bool:
        """Re-queued after it first entered OpenVINO (IGNORED, preempted whole or resampled): it continues what it
        generated."""
        return self.requeues + self.guard_preemptions + self.utf8_resamples > 0

    @property
    def input_len(self) -> int:
        return len(self.prompt) + len(self.resumed)

    @property
    def context_len(self) -> int:
        """Tokens in OpenVINO's sequence: the input, what was emitted, and the held bytes of an incomplete character
        (a re-added request prefills all but the held ones)."""
        return self.input_len + len(self.produced) + (len(self.utf8.held) if self.utf8 is not None else 0)
