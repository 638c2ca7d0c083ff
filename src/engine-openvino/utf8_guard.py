"""Guided output stays valid UTF-8 on OpenVINO (docs/upstream.md "XGrammar in OpenVINO GenAI").

XGrammar, which runs a guide inside OpenVINO's sampler, takes byte sequences that are not UTF-8 as characters
(overlong forms such as `C1 92`, lone continuation bytes, `F5`…`FF`, a lead byte before ASCII), so a byte-level
vocabulary's byte tokens spell text that every UTF-8 decoder turns into U+FFFD: a `maxLength: 8` string came back
with 9 characters. OpenVINO GenAI has no logit bias or logits processor to mask such a token before it is sampled (the
llama.cpp engine does, keel-grammar-utf8.cpp), so the step loop checks each sampled token of a guided request with a
strict decoder; inside a rule, a sampled request's invalid token is dropped and the request re-added with what it
emitted before that character, to sample it again (step_loop.may_resample says when). The tokens of a character still
incomplete are held here, not emitted, so that a re-add never has to take back an emitted token (and a resumed guided
request starts at a character boundary, which guides.py needs); one left incomplete at the end is dropped.
"""
from __future__ import annotations

import codecs
from typing import Any, Callable

#: Re-adds at one position, each sampling that character with another seed (random weights favour byte tokens: two
#: in a row were seen); after them the bytes stay as sampled.
MAX_RESAMPLES = 8


class Utf8Guard:
    """One guided request's strict UTF-8 check over its text (byte-level vocabularies only)."""

    def __init__(self, table: list) -> None:
        #: Bytes of every token id.
        self.table = table
        #: Strict incremental decoder over the text since the last character boundary (held tokens).
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        #: Sampled tokens of a character not yet complete, and their log probabilities: not emitted yet.
        self.held: list[int] = []
        self.held_logprobs: list[float] = []
        #: The bytes of the last character no strict decoder accepted (for the log line).
        self.rejected = b""
        #: Invalid characters kept as sampled (free text or reasoning, greedy, or too many in a row; step_loop.py).
        self.kept_invalid = 0

    def settle(self, tokens: list[int], logprobs: list[float], silent: Callable[[int], bool], ending: bool, resample: Callable[[list[int]], bool]) -> tuple[list[int], list[float], bool]:
        """This step's `tokens` (end-of-generation ones add no bytes: `silent`) after the held ones: what to emit now
        and whether a token was dropped as not valid UTF-8. Valid: emits up to the last complete character and holds
        the rest; when `ending`, an incomplete character left at the end is dropped. Invalid, where it is to be
        sampled again (`resample(tokens kept)`, step_loop.may_resample): emits up to the last complete character
        before it and drops the rest. Otherwise the bytes stay as the model wrote them, as without a guide, and the
        check restarts after them."""
        all_tokens, all_logprobs = self.held + tokens, self.held_logprobs + logprobs
        boundary = 0  # tokens before it end on a character boundary
        for k in range(len(self.held), len(all_tokens)):
            t = all_tokens[k]
            if not silent(t):
                try:
                    self.decoder.decode(self.table[t])
                except UnicodeDecodeError:
                    self.rejected = b"".join(self.table[x] for x in all_tokens[boundary:k + 1] if not silent(x))
                    if resample(all_tokens[:boundary]):
                        self.drop_held()
                        return all_tokens[:boundary], all_logprobs[:boundary], True
                    self.kept_invalid += 1
                    self.decoder.reset()
            if self.decoder.getstate()[0] == b"":
                boundary = k + 1
        self.held, self.held_logprobs = ([], []) if ending else (all_tokens[boundary:], all_logprobs[boundary:])
        return all_tokens[:boundary], all_logprobs[:boundary], False

    def drop_held(self) -> None:
        """Forget the held tokens (the request re-enters OpenVINO with the emitted ones): back at the boundary."""
        self.held, self.held_logprobs = [], []
        self.decoder.reset()


def resample_seed(seed: int, resamples: int) -> int:
    """The seed a re-added request samples with: another per resample (the same seed would draw the same token)."""
    return (seed + 0x9E3779B1 * resamples) % (1 << 63)
