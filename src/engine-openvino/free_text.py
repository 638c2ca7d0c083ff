"""The free phase of a guide as XGrammar EBNF, for what XGrammar's triggered tags cannot express: triggers that fire
only at the start of the free text (`atStart`, after optional whitespace) beside triggers that fire anywhere.

The free text is run by an automaton over code points (Aho-Corasick over the anywhere triggers, crossed with the
start-only prefixes while nothing else was written), one EBNF rule per state. Every state may end the output (free
text may stop anywhere). When a trigger's text completes, its rule follows from after the text (the rule's
derivative by it), then the free phase again from its start (`then: "free"`) or nothing (`then: "end"`); among
triggers completing on the same character the first in list order wins, as in the phase machine. A start-only
marker with no rule (`None`: the reasoning opener, which a Tag alternative covers) is a dead end here.
"""
from __future__ import annotations

from typing import Optional

from gbnf import Grammar, ref
from gbnf_parse import GrammarError, char_class, class_outside

#: Whitespace a start-only trigger may follow.
WS = " \t\n\r"
#: Most automaton states (triggers are short: a handful of texts of tens of characters).
MAX_STATES = 512


def free_ebnf(g: Grammar, triggers: list, at_start: bool, excluded: list) -> str:
    """EBNF of the free phase: `triggers` (dicts as in the guide, list order), start-only ones applied when `at_start`;
    `excluded`: start-only texts that may not begin the free text."""
    return _Automaton(g, triggers, at_start, excluded).ebnf()


class _Automaton:
    def __init__(self, g: Grammar, triggers: list, at_start: bool, excluded: list) -> None:
        self.g = g
        #: (text, trigger or None) that fire anywhere / only at the start.
        self.anywhere = [(t["text"], t) for t in triggers if not t.get("atStart")]
        self.start_only = [(t["text"], t) for t in triggers if t.get("atStart")] + [(x, None) for x in excluded] if at_start else []
        self.order = {id(t): i for i, t in enumerate(triggers)}
        self.prefixes = {x[:k] for x, _ in self.anywhere for k in range(len(x) + 1)}
        self.start_prefixes = {x[:k] for x, _ in self.start_only for k in range(len(x) + 1)}
        #: Characters any text holds, and the whitespace start-only triggers may follow: the rest all behave alike.
        self.alphabet = sorted({ord(c) for x, _ in self.anywhere + self.start_only for c in x} | ({ord(c) for c in WS} if self.start_only else set()))
        #: Rule name per state; the rule bodies.
        self.names: dict = {}
        self.rules: dict = {}
        #: Rule name per trigger (its rule after its text, then what follows it).
        self.after: dict = {}

    def ebnf(self) -> str:
        start = self.state(("" if self.start_only else None, ""))
        return self.g.ebnf(((("raw", start),),), self.rules)

    def state(self, key: tuple) -> str:
        """The rule of state `key` = (start-only prefix matched after whitespace, or None; anywhere-trie node)."""
        name = self.names.get(key)
        if name is not None:
            return name
        if len(self.names) >= MAX_STATES:
            raise GrammarError("the triggers make too large an automaton")
        name = self.names[key] = f"keel-free-{len(self.names)}"
        by_target: dict = {}
        for c in self.alphabet:
            by_target.setdefault(self.step(key, c), []).append(c)
        alts: list = [()]
        for target, chars in by_target.items():
            if target is not None:
                alts.append((char_class(chars), ("raw", target)))
        other = class_outside(self.alphabet)
        target = self.step(key, None)
        if other is not None and target is not None:
            alts.append((other, ("raw", target)))
        self.rules[name] = tuple(alts)
        return name

    def step(self, key: tuple, c: Optional[int]) -> Optional[str]:
        """The rule reached from `key` on character `c` (None: a character no text holds), or None (dead end)."""
        a, node = key
        ch = "\0" if c is None else chr(c)
        seen = node + ch if c is not None else ""
        nxt = next((seen[k:] for k in range(len(seen) + 1) if seen[k:] in self.prefixes), "")
        if a is None:
            a2 = None
        elif a == "" and ch in WS and c is not None:
            a2 = ""
        else:
            a2 = a + ch if c is not None and a + ch in self.start_prefixes else None
        fired = [t for x, t in self.anywhere if c is not None and seen.endswith(x)]
        fired += [t for x, t in self.start_only if a2 == x]
        if fired:
            if any(t is None for t in fired):
                return None
            return self.fire(min(fired, key=lambda t: self.order[id(t)]))
        return self.state((a2, nxt))

    def fire(self, t: dict) -> str:
        name = self.after.get(id(t))
        if name is not None:
            return name
        name = self.after[id(t)] = f"keel-call-{len(self.after)}"
        conts = self.g.derive(ref(t["rule"]), t["text"])
        if not conts:
            raise GrammarError(f"trigger {t['text']!r}: its rule '{t['rule']}' does not start with the trigger text")
        # The free phase again from its start (fresh free text), or nothing more.
        tail = (("raw", self.state(("" if self.start_only else None, ""))),) if t.get("then", "free") == "free" else ()
        self.rules[name] = ((("grp", conts),) + tail,)
        return name
