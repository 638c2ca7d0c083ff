"""OpenVINO GenAI's tokenizer cuts a long text silently (8,192 tokens for a GGUF's, whatever `max_length` or
`truncation` ask; docs/upstream.md): a longer prompt would lose its end without a word. The worker finds the cut at
start and refuses a prompt that reaches it."""
from __future__ import annotations

from typing import Callable, Optional

#: Words of the probe text; a cut above twice this many tokens goes unseen (no model here has one).
PROBE_WORDS = 20_000


class PromptCut(ValueError):
    """A text reaches the tokenizer's cut: its token ids would be a truncated prompt (`tokens`: at least this many)."""

    def __init__(self, tokens: int, message: str) -> None:
        super().__init__(message)
        self.tokens = tokens


def tokenizer_cap(count: Callable[[str], int], words: int = PROBE_WORDS) -> Optional[int]:
    """The token count where `count` (a text's token count) stops growing: a probe text and twice as much text
    counting the same is a cut; None when the longer one counts more."""
    once = count("a " * words)
    return once if count("a " * (2 * words)) == once else None
