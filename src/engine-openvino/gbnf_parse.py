"""Reading llama.cpp's GBNF dialect into gbnf.py's grammar tree (see there for the tree's shape), strictly: what
this reader refuses never reaches OpenVINO. Also the character-class helpers the free-text automaton uses.
"""
from __future__ import annotations

from typing import Optional

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^", "/": "/"}
#: Any code point (llama.cpp's `.`; XGrammar has no `.`).
ANY_CHAR = ("cls", False, ((0, 0xD7FF), (0xE000, 0x10FFFF)))


class GrammarError(ValueError):
    """The grammar cannot be applied (syntax, undefined or empty rule, or too complex a derivative)."""


def parse_rules(text: str, rules: dict) -> None:
    """Parse GBNF `text` into `rules` (name → Alt). Raises GrammarError."""
    _Parser(text, rules).parse()


# -- parsing ------------------------------------------------------------------------------------------------------


class _Parser:
    """llama.cpp's GBNF: `name ::= alternatives` rules; a newline ends a rule outside parentheses; `#` comments."""

    def __init__(self, text: str, rules: dict) -> None:
        self.s = text
        self.i = 0
        self.rules = rules

    def fail(self, why: str) -> None:
        line = self.s.count("\n", 0, self.i) + 1
        raise GrammarError(f"GBNF syntax error at line {line}: {why}")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def space(self, newlines: bool) -> None:
        while self.i < len(self.s):
            ch = self.s[self.i]
            if ch == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            elif ch in " \t" or (newlines and ch in "\r\n"):
                self.i += 1
            else:
                return

    def name(self) -> str:
        start = self.i
        while self.peek() and self.peek() in NAME_CHARS:
            self.i += 1
        if self.i == start:
            self.fail(f"expected a rule name, got {self.peek()!r}")
        return self.s[start:self.i]

    def parse(self) -> None:
        self.space(True)
        if self.i >= len(self.s):
            self.fail("the grammar defines no rule")
        while self.i < len(self.s):
            name = self.name()
            self.space(False)
            if not self.s.startswith("::=", self.i):
                self.fail(f"expected '::=' after rule name '{name}'")
            self.i += 3
            self.space(True)
            body = self.alternates(nested=False)
            if name in self.rules:
                self.fail(f"rule '{name}' is defined twice")
            self.rules[name] = body
            if self.peek() and self.peek() not in "\r\n":
                self.fail(f"unexpected {self.peek()!r}")
            self.space(True)

    def alternates(self, nested: bool) -> tuple:
        seqs = [self.sequence(nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            seqs.append(self.sequence(nested))
        return tuple(seqs)

    def sequence(self, nested: bool) -> tuple:
        items: list = []
        while True:
            ch = self.peek()
            if ch == '"':
                item = ("lit", self.string())
            elif ch == "[":
                item = self.char_class()
            elif ch == "(":
                self.i += 1
                self.space(True)
                item = ("grp", self.alternates(nested=True))
                if self.peek() != ")":
                    self.fail("expected ')'")
                self.i += 1
            elif ch == ".":
                self.i += 1
                item = ANY_CHAR
            elif ch and ch in NAME_CHARS:
                item = ("ref", self.name())
            else:
                break
            items.append(self.postfix(item))
            self.space(nested)
        return tuple(i for i in items if i != ("lit", ""))

    def postfix(self, item: tuple) -> tuple:
        ch = self.peek()
        if ch in ("*", "+", "?"):
            self.i += 1
            return ("rep", item, 1 if ch == "+" else 0, 1 if ch == "?" else None)
        if ch != "{":
            return item
        self.i += 1
        self.space(False)
        lo = self.integer()
        hi: Optional[int] = lo
        self.space(False)
        if self.peek() == ",":
            self.i += 1
            self.space(False)
            hi = self.integer() if self.peek().isdigit() else None
            self.space(False)
        if self.peek() != "}":
            self.fail("expected '}' closing a repetition")
        self.i += 1
        if hi is not None and hi < lo:
            self.fail(f"repetition {{{lo},{hi}}} has its maximum below its minimum")
        return ("rep", item, lo, hi)

    def integer(self) -> int:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        if self.i == start:
            self.fail("expected a number in a repetition")
        return int(self.s[start:self.i])

    def char(self, end: str) -> int:
        ch = self.peek()
        if not ch:
            self.fail(f"unterminated {'string' if end == chr(34) else 'character class'}")
        self.i += 1
        if ch != "\\":
            return ord(ch)
        e = self.peek()
        self.i += 1
        if e in ESCAPES:
            return ord(ESCAPES[e])
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        digits = self.s[self.i:self.i + width] if width else ""
        if not width or len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
            self.fail(f"bad escape '\\{e}'")
        self.i += width
        value = int(digits, 16)
        if value > 0x10FFFF:
            self.fail(f"escape '\\{e}{digits}' is not a code point")
        return value

    def string(self) -> str:
        self.i += 1
        out = []
        while self.peek() != '"':
            out.append(chr(self.char('"')))
        self.i += 1
        return "".join(out)

    def char_class(self) -> tuple:
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges = []
        while self.peek() != "]":
            lo = self.char("]")
            hi = lo
            if self.peek() == "-" and self.s[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.char("]")
                if hi < lo:
                    self.fail(f"character range {chr(lo)!r}-{chr(hi)!r} is reversed")
            ranges.append((lo, hi))
        self.i += 1
        merged = _merge(ranges)
        if negated:
            merged = _complement(merged)
        if not merged:
            self.fail("a character class that matches no character")
        # Always positive (see _class_text): a negated class becomes its complement.
        return ("cls", False, tuple(merged))


def char_class(chars) -> tuple:
    """The class item of a set of code points."""
    return ("cls", False, tuple(_merge([(c, c) for c in chars])))


def class_outside(chars) -> Optional[tuple]:
    """The class item of every code point (surrogates excluded) not in `chars`, or None."""
    rest = _complement(_merge([(c, c) for c in chars]))
    return ("cls", False, tuple(rest)) if rest else None


def _merge(ranges: list) -> list:
    out: list = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: list) -> list:
    """The code points (surrogates excluded) outside `ranges` (merged)."""
    out, nxt = [], 0
    for lo, hi in ranges + [(0x110000, 0x110000)]:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    split = []
    for lo, hi in out:
        if lo <= 0xDFFF and hi >= 0xD800:
            if lo < 0xD800:
                split.append((lo, 0xD7FF))
            if hi > 0xDFFF:
                split.append((0xE000, hi))
        else:
            split.append((lo, hi))
    return split
