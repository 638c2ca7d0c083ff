"""Keel's GBNF (llama.cpp's dialect, docs/protocol.md "Guided generation") read into a small grammar tree, checked,
and written back as XGrammar EBNF that OpenVINO GenAI compiles.

Why a parser of our own: OpenVINO GenAI compiles a request's grammar inside `step()`, and a grammar XGrammar cannot
parse makes that step raise for every request and leaves the pipeline wedged (docs/upstream.md). So nothing reaches
OpenVINO that was not parsed and re-written here: the EBNF it gets is generated from the tree, in the subset both
dialects share. Also refused here: undefined rules, a rule defined twice, and a reachable rule that derives no
string at all (XGrammar then leaves the output unconstrained instead of failing).

The tree: a rule body is an `Alt` (tuple of sequences); a sequence is a tuple of items; an item is
`("lit", text)`, `("cls", False, ((lo, hi), ...))` (always positive: the reader spells a negated class out),
`("ref", name)`, `("grp", Alt)`, `("rep", item, lo, hi)` (hi None: unbounded), and in written-only trees
`("raw", ebnf)`. `derive` computes what may follow a given text (a trigger's rule started at the trigger). The
reader is gbnf_parse.py.
"""
from __future__ import annotations

from typing import Optional

from gbnf_parse import GrammarError, parse_rules

#: Longest chain of rule expansions a derivative follows (left recursion would never end).
MAX_EXPANSION_DEPTH = 48
#: Most alternative continuations a derivative keeps (an ambiguous grammar can multiply them).
MAX_CONTINUATIONS = 512



class Grammar:
    """A parsed GBNF grammar: its rules by name, in definition order."""

    def __init__(self, text: str) -> None:
        #: Rule bodies by name.
        self.rules: dict[str, tuple] = {}
        parse_rules(text, self.rules)
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
        return _literal_text(item[1])
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


def _literal_text(text: str) -> str:
    """A string literal. XGrammar misreads U+0080–U+00FF followed by a hex digit inside one (`"°C"` matches U+0B0C,
    `"éa"` U+0E9A, however written: it re-reads them as a greedy hex escape; docs/upstream.md), so the literal ends
    after such a character and the rest is a second literal, the pair grouped."""
    parts, cur = [], ""
    for k, ch in enumerate(text):
        cur += _char(ord(ch), '"')
        if 0x80 <= ord(ch) <= 0xFF and k + 1 < len(text) and text[k + 1] in "0123456789abcdefABCDEF":
            parts.append(cur)
            cur = ""
    parts.append(cur)
    return f'"{parts[0]}"' if len(parts) == 1 else "(" + " ".join(f'"{p}"' for p in parts) + ")"


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
