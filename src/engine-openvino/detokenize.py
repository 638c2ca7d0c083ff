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
        # A resumed request continues where the first engine stood: at the last point its text did not end in an
        # incomplete or invalid character (the tokens after it were held back). A window that starts inside a
        # character only garbles its start, never its end, so eight tokens back tell where the text ends.
        held = len(self.ids)
        while held > 0 and decode(self.ids[max(0, held - 8):held]).endswith("\ufffd"):
            held -= 1
        #: Start of the decoding window (a character boundary).
        self.prefix = held
        #: End of the text already emitted (tokens after it are held back until their character completes).
        self.read = held

    def push(self, tokens: list[int], final: bool = False) -> str:
        self.ids.extend(tokens)
        end = len(self.ids)
        if not final:
            # Emit up to the last token after which the text ends in a whole character, however the tokens came
            # (one or several a step): where the text stands is then a function of the tokens alone, as a resume needs.
            while end > self.read and self.decode(self.ids[self.prefix:end]).endswith("\ufffd"):
                end -= 1
        if end == self.read:
            return ""
        # Both window ends are character boundaries, so the emitted text is a prefix of the longer decoding.
        done = self.decode(self.ids[self.prefix:self.read]) if self.read > self.prefix else ""
        delta = self.decode(self.ids[self.prefix:end])[len(done):]
        self.prefix, self.read = self.read, end
        return delta
