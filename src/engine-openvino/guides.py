"""Keel's guides (`params.guide`, docs/protocol.md "Guided generation") on OpenVINO GenAI's structured output.

OpenVINO GenAI fixes a request's constraint at `add_request` (XGrammar, run by its sampler); Keel's guide is a phase
machine. So the whole machine is written as ONE XGrammar structural tag up front:

- rule R, then end          → EBNF `root ::= R` (complete: only end-of-generation follows);
- rule R, then free         → Concat(EBNF R, <free>);
- free (triggers anywhere)  → TriggeredTags(trigger texts, one Tag(text, EBNF of R after the text, "") per trigger,
                              stop_after_first = the triggers' `then` is "end"), or AnyText without triggers;
- free with start-only texts (`atStart` triggers, a gate's reasoning opener), triggers nested in one another or
  `then` mixed → an automaton over the free text in EBNF (free_text.py), which XGrammar's tags cannot express;
- reasoning                 → Concat(Tag("", AnyText, close), <after>);
- a gated start (reasoning set) → Union(Concat([whitespace,] Tag(open, AnyText, close), <after>), <start without
                              the opener>): the model may open reasoning first, as the phase machine lets it.

A trigger's rule starts AT the trigger text (the text is part of the rule), while XGrammar emits a tag's `begin`
first: the tag's content is the rule's derivative by the trigger text (gbnf.py). A resumed or re-added request
continues in the state its generated text left the machine in (derivatives again), so the grammar never restarts.

Refused (GuideRefused → `invalid_params` naming the engine), never applied loosely: a grammar gbnf.py refuses, and a
resume whose text stopped inside a trigger text, a reasoning marker or a character. Known difference (docs/openvino.md):
after `then: "free"` XGrammar may leave a rule as soon as it is complete, while the llama.cpp engine leaves it once it
cannot continue (the same for rules ending in a fixed text, as Keel's call rules do).
"""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Optional

from free_text import WS, free_ebnf
from gbnf import Grammar, ref
from gbnf_parse import GrammarError

ENGINE = "the OpenVINO engine"
#: Whitespace a free start may write before it opens reasoning (the phase machine's "leading whitespace").
LEADING_WS = "[ \\t\\n\\r]*"
#: Parsed grammars kept (LRU): agents resend the same tool grammar every turn.
GRAMMAR_CACHE_SIZE = 32
_cache: "OrderedDict[str, Grammar]" = OrderedDict()
#: Plans of fresh adds by guide (LRU, as many): an agent's tools make the same guide every turn, and a gated free
#: start with several triggers costs ~13 ms to plan (bench/openvino-guide-plan.mjs) on the loop's thread.
_plans: "OrderedDict[str, tuple]" = OrderedDict()


class GuideRefused(ValueError):
    """This guide cannot be applied on OpenVINO exactly; the message says why and names the engine."""


def parsed(text: str) -> Grammar:
    hit = _cache.get(text)
    if hit is not None:
        _cache.move_to_end(text)
        return hit
    g = Grammar(text)
    _cache[text] = g
    if len(_cache) > GRAMMAR_CACHE_SIZE:
        _cache.popitem(last=False)
    return g


def plan_for(guide: dict, text: str = "") -> tuple:
    """The structural-tag plan (nested tuples, see to_structured_config) that constrains what follows `text` (the
    request's generated text so far) exactly as the phase machine would. Raises GuideRefused."""
    key = json.dumps(guide, sort_keys=True) if text == "" else None
    hit = _plans.get(key) if key is not None else None
    if hit is not None:
        _plans.move_to_end(key)
        return hit
    try:
        plan = _Planner(guide, parsed(guide["grammar"])).start(text)
    except GrammarError as err:
        raise GuideRefused(f"{ENGINE} cannot apply this guide: {err}") from None
    if key is not None:
        _plans[key] = plan
        if len(_plans) > GRAMMAR_CACHE_SIZE:
            _plans.popitem(last=False)
    return plan


def phase_at(guide: dict, text: str) -> str:
    """Where the request's generated `text` leaves the phase machine: "rule" when a rule constrains what follows,
    else "free" or "reasoning" (anything may follow). Raises GuideRefused where plan_for would."""
    try:
        planner = _Planner(guide, parsed(guide["grammar"]))
        planner.start(text)
    except GrammarError as err:
        raise GuideRefused(f"{ENGINE} cannot apply this guide: {err}") from None
    return planner.phase


class _Planner:
    def __init__(self, guide: dict, g: Grammar) -> None:
        self.guide = guide
        self.g = g
        #: Reasoning markers and the phase after them, or None.
        self.reasoning: Optional[dict] = guide.get("reasoning")
        #: The triggers that can fire: of several with one text only the first in list order ever does.
        self.triggers: list = list({t["text"]: t for t in reversed(guide.get("triggers") or [])}.values())[::-1]
        for phase in (guide["start"], (self.reasoning or {}).get("after")):
            if phase and phase["kind"] == "rule":
                g.check_rule(phase["rule"])
        for t in self.triggers:
            g.check_rule(t["rule"])
        #: Triggers that fire anywhere, and those only at the start of the free text (after whitespace).
        self.anywhere = [t for t in self.triggers if not t.get("atStart")]
        self.start_only = [t for t in self.triggers if t.get("atStart")]
        #: Where start()'s text left the machine: "rule" (a rule constrains what follows), "free" or "reasoning".
        self.phase = "free"

    def start(self, text: str) -> tuple:
        start = self.guide["start"]
        gated = self.reasoning is not None
        if start["kind"] == "rule":
            return self.rule(start["rule"], start["then"], text, gated)
        if start["kind"] == "reasoning":
            return self.in_reasoning(text)
        return self.free(text, gated)

    # -- phases -------------------------------------------------------------------------------------------------

    def rule(self, name: str, then: str, text: str, gated: bool, limited: bool = False) -> tuple:
        """Rule `name` with `text` already written in it (`limited`: inside a Union, see free_plan)."""
        if gated:
            opener = self.reasoning["open"]
            if text.startswith(opener):
                return self.in_reasoning(text[len(opener):])
            if text and opener.startswith(text):
                raise self.stopped_inside("the reasoning marker")
        conts, used = self.g_derive(ref(name), text)
        if used < len(text):
            # The rule ended (complete, nothing could continue) and the free phase went on from there.
            if then != "free":
                raise GuideRefused(f"{ENGINE} cannot resume this guide: the generated text does not follow rule '{name}'")
            return self.free(text[used:], False, limited)
        if not conts:
            raise GuideRefused(f"{ENGINE} cannot apply this guide: the text does not start rule '{name}'")
        body: tuple = ("ebnf", self.g.ebnf(conts))
        if then == "free":
            body = ("concat", [body, self.free_plan(limited=limited or gated)])
        if gated and text == "" and self.g.derive(ref(name), self.reasoning["open"]):
            body = ("union", [self.reasoning_first(with_ws=False), body])
        self.phase = "rule"
        return body

    def in_reasoning(self, text: str) -> tuple:
        """Inside reasoning, `text` written since it opened."""
        close = self.reasoning["close"]
        at = text.find(close)
        if at >= 0:
            return self.after(text[at + len(close):])
        if _partial_tail(text, [close]):
            raise self.stopped_inside("the reasoning close marker")
        plan = ("concat", [("tag", "", ("any",), close), self.after("")])
        self.phase = "reasoning"
        return plan

    def after(self, text: str, limited: bool = False) -> tuple:
        phase = self.reasoning["after"]
        if phase["kind"] == "rule":
            return self.rule(phase["rule"], phase["then"], text, False, limited)
        return self.free(text, False, limited)

    def free(self, text: str, gated: bool, limited: bool = False) -> tuple:
        """The free phase with `text` written since it began."""
        s = text.lstrip(WS)
        if gated:
            opener = self.reasoning["open"]
            if s.startswith(opener):
                return self.in_reasoning(s[len(opener):])
            if s and opener.startswith(s):
                raise self.stopped_inside("the reasoning marker")
            if not s:
                plan = ("union", [self.reasoning_first(with_ws=True), self.free_plan(True, [opener], limited=True)])
                self.phase = "free"
                return plan
        started = next((t for t in self.start_only if s.startswith(t["text"])), None)
        if started is not None:
            return self.rule(started["rule"], started.get("then", "free"), s, False, limited)
        if s and any(t["text"].startswith(s) for t in self.start_only):
            raise self.stopped_inside("a trigger text")
        hit = self.first_trigger(text)
        if hit is not None:
            trigger, at = hit
            return self.rule(trigger["rule"], trigger.get("then", "free"), text[at:], False, limited)
        if _partial_tail(text, [t["text"] for t in self.anywhere]):
            raise self.stopped_inside("a trigger text")
        self.phase = "free"
        return self.free_plan(not s, limited=limited)

    # -- pieces -------------------------------------------------------------------------------------------------

    def free_plan(self, at_start: bool = True, excluded: Optional[list] = None, limited: bool = False) -> tuple:
        """The free phase from its start (`at_start`: start-only triggers still armed; `excluded`: start-only texts
        that may not begin it, the reasoning opener a Union alternative covers). `limited`: inside a Union, whose
        elements XGrammar wants all open-ended (AnyText, triggered tags) or all not (docs/upstream.md): EBNF."""
        if limited or (at_start and (self.start_only or excluded)):
            # Start-only texts: XGrammar's triggered tags fire anywhere, so the free text is an automaton in EBNF.
            return ("ebnf", free_ebnf(self.g, self.triggers, at_start, excluded or []))
        if not self.anywhere:
            return ("any",)
        texts = [t["text"] for t in self.anywhere]
        nested = next(((a, b) for a in texts for b in texts if a != b and b.startswith(a)), None)
        if nested or len({t.get("then", "free") for t in self.anywhere}) > 1:
            # XGrammar refuses a tag that matches two triggers, and ends every triggered call alike.
            return ("ebnf", free_ebnf(self.g, self.anywhere, False, []))
        tags = []
        for t in self.anywhere:
            conts = self.g.derive(ref(t["rule"]), t["text"])
            if not conts:
                raise GuideRefused(f"{ENGINE} cannot apply trigger {t['text']!r}: its rule '{t['rule']}' does not start with the trigger text")
            tags.append(("tag", t["text"], ("ebnf", self.g.ebnf(conts)), ""))
        return ("triggered", texts, tags, self.anywhere[0].get("then", "free") == "end")

    def reasoning_first(self, with_ws: bool) -> tuple:
        r = self.reasoning
        parts = [("regex", LEADING_WS)] if with_ws else []
        return ("concat", parts + [("tag", r["open"], ("any",), r["close"]), self.after("", limited=True)])

    def first_trigger(self, text: str) -> Optional[tuple]:
        """The trigger whose text appears first in `text` (earliest end; list order on a tie), and where."""
        best = None
        for t in self.anywhere:
            at = text.find(t["text"])
            if at >= 0 and (best is None or at + len(t["text"]) < best[1] + len(best[0]["text"])):
                best = (t, at)
        return best

    def g_derive(self, alt: tuple, text: str) -> tuple:
        """Continuations of `alt` after the longest prefix of `text` it accepts, and that prefix's length: the whole
        text, or where the rule was complete and the next character could not continue it."""
        conts = alt
        for k, ch in enumerate(text):
            nxt = self.g.derive(conts, ch)
            if not nxt:
                if any(self.g.seq_nullable(s) for s in conts):
                    return conts, k
                return (), k
            conts = nxt
        return conts, len(text)

    def stopped_inside(self, what: str) -> GuideRefused:
        return GuideRefused(f"{ENGINE} cannot resume a guided request whose generated text stops inside {what}")


def _partial_tail(text: str, markers: list) -> bool:
    """Whether `text` ends with a non-empty proper prefix of one of `markers` (a marker may be completing)."""
    return any(text.endswith(m[:k]) for m in markers for k in range(1, len(m)))


def to_structured_config(plan: tuple, ov_genai) -> object:
    """OpenVINO GenAI's StructuredOutputConfig for a plan."""
    S = ov_genai.StructuredOutputConfig
    if plan[0] == "ebnf":
        return S(grammar=plan[1])
    config = S()
    config.structural_tags_config = _tag(plan, S)
    return config


def _tag(plan: tuple, S) -> object:
    kind = plan[0]
    if kind == "ebnf":
        return S.EBNF(plan[1])
    if kind == "any":
        return S.AnyText()
    if kind == "regex":
        return S.Regex(plan[1])
    if kind == "tag":
        return S.Tag(plan[1], _tag(plan[2], S), plan[3])
    if kind == "concat":
        return S.Concat([_tag(p, S) for p in plan[1]])
    if kind == "union":
        return S.Union([_tag(p, S) for p in plan[1]])
    if kind == "triggered":
        return S.TriggeredTags(plan[1], [_tag(t, S) for t in plan[2]], False, plan[3])
    raise ValueError(f"unknown plan node {kind}")


__all__ = ["GuideRefused", "plan_for", "to_structured_config"]
