"""Keel's GBNF (llama.cpp's dialect, docs/protocol.md "Guided generation") read into a small grammar tree, checked,
and written back as XGrammar EBNF that OpenVINO GenAI compiles.

Why a parser of our own: OpenVINO GenAI compiles a request's grammar inside `step()`, and a grammar XGrammar cannot
parse makes that step raise for every request and leaves the pipeline wedged (docs/upstream.md). So nothing reaches
OpenVINO that was not parsed and re-written here: the EBNF it gets is generated from the tree, in the subset both
dialects share. Also refused here: undefined rules, a rule defined twice, and a reachable rule that derives no
string at all (XGrammar then leaves the output unconstrained instead of failing).

The tree: a rule body is an `Alt` (tuple of sequences); a sequence is a tuple of items; an item is
`("lit", text)`, `("cls", negated, ((lo, hi), ...))`, `("ref", name)`, `("grp", Alt)` or `("rep", item, lo, hi)`
(hi None: unbounded). `derive` computes what may follow a given text (a trigger's rule started at the trigger).
"""
from __future__ import annotations

from typing import Optional

#: Longest chain of rule expansions a derivative follows (left recursion would never end).
MAX_EXPANSION_DEPTH = 48
#: Most alternative continuations a derivative keeps (an ambiguous grammar can multiply them).
MAX_CONTINUATIONS = 512
#: Any code point (llama.cpp's `.`; XGrammar has no `.`).
ANY_CHAR = ("cls", False, ((0, 0xD7FF), (0xE000, 0x10FFFF)))

NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^", "/": "/"}


class GrammarError(ValueError):
    """The grammar cannot be applied (syntax, undefined or empty rule, or too complex a derivative)."""


class Grammar:
    """A parsed GBNF grammar: its rules by name, in definition order."""

    def __init__(self, text: str) -> None:
        #: Rule bodies by name.
        self.rules: dict[str, tuple] = {}
        _Parser(text, self.rules).parse()
        for name, body in self.rules.items():
            for ref in _refs(body):
                if ref not in self.rules:
                    raise GrammarError(f"rule '{name}' refers to undefined rule '{ref}'")
        #: Rules that derive the empty string.
        self.nullable = _fixpoint(self.rules, lambda item, known: _item_nullable(item, known))
        #: Rules that derive at least one string.
        self.productive = _fixpoint(self.rules, lambda item, known: _item_productive(item, known))

    def check_rule(self, name: str) -> None:
        """Raise unless `name` is defined and every rule it reaches derives some string."""
        if name not in self.rules:
            raise GrammarError(f"rule '{name}' is not defined by the grammar")
        seen, todo = set(), [name]
        while todo:
            r = todo.pop()
            if r in seen:
                continue
            seen.add(r)
            if r not in self.productive:
                raise GrammarError(f"rule '{r}' derives no text at all")
            todo.extend(_refs(self.rules[r]))

    def seq_nullable(self, seq: tuple) -> bool:
        return all(_item_nullable(i, self.nullable) for i in seq)

    # -- derivatives ------------------------------------------------------------------------------------------

    def derive(self, alt: tuple, text: str) -> tuple:
        """The continuations of `alt` after `text` (an Alt; empty when `text` is no prefix of anything in it)."""
        configs = list(dict.fromkeys(alt))
        for ch in text:
            c = ord(ch)
            nxt: dict[tuple, None] = {}
            for seq in configs:
                for s in self._d_seq(seq, c, 0):
                    nxt[s] = None
                    if len(nxt) > MAX_CONTINUATIONS:
                        raise GrammarError("the grammar is too ambiguous to resume inside (too many continuations)")
            configs = list(nxt)
            if not configs:
                break
        return tuple(configs)

    def _d_seq(self, seq: tuple, c: int, depth: int) -> list:
        if not seq:
            return []
        first, rest = seq[0], seq[1:]
        out = [s + rest for s in self._d_item(first, c, depth)]
        if _item_nullable(first, self.nullable):
            out += self._d_seq(rest, c, depth)
        return out

    def _d_item(self, item: tuple, c: int, depth: int) -> list:
        kind = item[0]
        if kind == "lit":
            t = item[1]
            if t and ord(t[0]) == c:
                return [(("lit", t[1:]),) if len(t) > 1 else ()]
            return []
        if kind == "cls":
            return [()] if _cls_has(item, c) else []
        if kind in ("ref", "grp"):
            if depth > MAX_EXPANSION_DEPTH:
                raise GrammarError("the grammar nests too deeply (or is left-recursive) to resume inside")
            body = self.rules[item[1]] if kind == "ref" else item[1]
            return [s for seq in body for s in self._d_seq(seq, c, depth + 1)]
        _, x, lo, hi = item
        if hi == 0:
            return []
        again = ("rep", x, max(lo - 1, 0), None if hi is None else hi - 1)
        tail = () if again[3] == 0 else (again,)
        return [s + tail for s in self._d_item(x, c, depth)]

    # -- writing ----------------------------------------------------------------------------------------------

    def ebnf(self, root: tuple, extra: Optional[dict] = None) -> str:
        """XGrammar EBNF whose `root` is the Alt `root`, with every rule of this grammar (renamed `k-NAME`) and the
        `extra` rules (name → Alt; referenced by `("raw", name)` items)."""
        lines = [f"root ::= {_alt_text(root)}"]
        lines += [f"k-{name} ::= {_alt_text(body)}" for name, body in self.rules.items()]
        lines += [f"{name} ::= {_alt_text(body)}" for name, body in (extra or {}).items()]
        return "\n".join(lines) + "\n"


def ref(name: str) -> tuple:
    """The Alt of one reference to rule `name`."""
    return ((("ref", name),),)


def literal(text: str) -> tuple:
    return ("lit", text)


# -- writing ------------------------------------------------------------------------------------------------------


def _alt_text(alt: tuple) -> str:
    if not alt:
        raise GrammarError("an empty alternative set cannot be written")
    return " | ".join(_seq_text(s) for s in alt)


def _seq_text(seq: tuple) -> str:
    return " ".join(_item_text(i) for i in seq) if seq else '""'


def _item_text(item: tuple) -> str:
    kind = item[0]
    if kind == "lit":
        return '"' + "".join(_char(ord(ch), '"') for ch in item[1]) + '"'
    if kind == "cls":
        return _class_text(item[2])
    if kind == "ref":
        return f"k-{item[1]}"
    if kind == "raw":
        return item[1]
    if kind == "grp":
        return f"({_alt_text(item[1])})"
    _, x, lo, hi = item
    inner = _item_text(x)
    if x[0] == "rep":
        inner = f"({inner})"
    return f"{inner}{{{lo},{'' if hi is None else hi}}}"


def _class_text(ranges: tuple) -> str:
    """A positive class. XGrammar reads a class whose first character is `^` as negated even when escaped
    (docs/upstream.md), so a leading `^` moves to the end."""
    rs = list(ranges)
    if rs[0][0] == 0x5E:
        lo, hi = rs.pop(0)
        if not rs and lo == hi:
            return '"^"'
        if lo < hi:
            rs.insert(0, (lo + 1, hi))
        rs.append((lo, lo))
    return "[" + "".join(_char(lo, "]") if lo == hi else f"{_char(lo, ']')}-{_char(hi, ']')}" for lo, hi in rs) + "]"


def _char(c: int, quote: str) -> str:
    """One code point inside a string literal (`quote` '"') or a character class (`quote` ']')."""
    ch = chr(c)
    if 0xD800 <= c <= 0xDFFF:
        raise GrammarError(f"the grammar holds a lone surrogate U+{c:04X}")
    # Always four hex digits: XGrammar reads `\x` greedily (`\x41b` is U+41B; docs/upstream.md).
    if c < 0x20 or c == 0x7F or ch == "\\" or ch == quote or (quote == "]" and ch in "-^["):
        return f"\\u{c:04x}"
    return ch


# -- analysis -----------------------------------------------------------------------------------------------------


def _refs(alt: tuple):
    for seq in alt:
        for item in seq:
            yield from _item_refs(item)


def _item_refs(item: tuple):
    if item[0] == "ref":
        yield item[1]
    elif item[0] == "grp":
        yield from _refs(item[1])
    elif item[0] == "rep":
        yield from _item_refs(item[1])


def _fixpoint(rules: dict, item_ok) -> set:
    """Rules having an alternative whose items all satisfy `item_ok(item, known)`, to a fixpoint."""
    known: set = set()
    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if name not in known and any(all(item_ok(i, known) for i in seq) for seq in body):
                known.add(name)
                changed = True
    return known


def _item_nullable(item: tuple, nullable: set) -> bool:
    kind = item[0]
    if kind == "lit":
        return item[1] == ""
    if kind == "cls":
        return False
    if kind == "ref":
        return item[1] in nullable
    if kind == "grp":
        return any(all(_item_nullable(i, nullable) for i in seq) for seq in item[1])
    return item[2] == 0 or _item_nullable(item[1], nullable)


def _item_productive(item: tuple, known: set) -> bool:
    kind = item[0]
    if kind == "lit":
        return True
    if kind == "cls":
        return bool(item[2])
    if kind == "ref":
        return item[1] in known
    if kind == "grp":
        return any(all(_item_productive(i, known) for i in seq) for seq in item[1])
    return item[2] == 0 or _item_productive(item[1], known)


def _cls_has(item: tuple, c: int) -> bool:
    return any(lo <= c <= hi for lo, hi in item[2])


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
