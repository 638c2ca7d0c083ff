"""Streaming text of one request (protocol §6.2): from token bytes where the vocabulary is known, else from
OpenVINO's detokenizer over a sliding window."""
from __future__ import annotations


class ByteDetokenizer:
    """Incremental text from token bytes (protocol §6.2): an incremental UTF-8 decoder holds back an incomplete
    character and turns never-valid bytes into U+FFFD, exactly as the llama.cpp engine does."""

    def __init__(self, table: list, primed: list[int]) -> None:
        import codecs

        self.table = table
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Prime with the resumed tokens' bytes without emitting them (a character split at the resume point).
        self.decoder.decode(b"".join(table[t] for t in primed))

    def push(self, tokens: list[int], final: bool = False) -> str:
        return self.decoder.decode(b"".join(self.table[t] for t in tokens), final=final)


class Detokenizer:
    """Incremental text of one request (protocol §6.2): held back while the decoded tail is an incomplete character.

    Decodes a sliding window (from the token before the last emitted text) so each step costs O(window), not O(n).
    """

    def __init__(self, decode, primed: list[int]) -> None:
        self.decode = decode
        #: Non-end-of-generation tokens so far (resumed ones included).
        self.ids: list[int] = list(primed)
        #: Start of the decoding window.
        self.prefix = max(0, len(self.ids) - 6)
        #: End of the text already emitted (tokens before it were emitted, up to a held-back partial character).
        self.read = len(self.ids)

    def push(self, tokens: list[int], final: bool = False) -> str:
        self.ids.extend(tokens)
        if len(self.ids) == self.read and not final:
            return ""
        done = self.decode(self.ids[self.prefix:self.read]).rstrip("\ufffd") if self.read > self.prefix else ""
        full = self.decode(self.ids[self.prefix:])
        if full.endswith("\ufffd") and not final:
            return ""
        delta = full[len(done):] if full.startswith(done) else full[len(done):]
        self.prefix, self.read = self.read, len(self.ids)
        return delta
