"""Unit tests of the guide mapping (gbnf.py, guides.py): run by worker.unit.test.ts with the engine's venv python."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gbnf import Grammar, ref  # noqa: E402
from gbnf_parse import GrammarError  # noqa: E402
from guides import GuideRefused, phase_at, plan_for, to_structured_config  # noqa: E402

CALL = 'call ::= "<tool_call>\\n{" [a-z]{1,4} "}\\n</tool_call>"\n'


def rule_guide(grammar, rule="root", then="end", **extra):
    return {"grammar": grammar, "start": {"kind": "rule", "rule": rule, "then": then}, **extra}


class Parsing(unittest.TestCase):
    def test_rewrites_escapes_xgrammar_reads_differently(self):
        g = Grammar('root ::= "\\x41b" [\\^a] [^\\x0A]\n')
        text = g.ebnf(ref("root"))
        # \x is four-digit \u (XGrammar reads \x greedily); a class never starts with ^; negation is spelled out.
        self.assertIn('"Ab"', text)
        self.assertIn("[a\\u005e]", text)
        self.assertNotIn("[^", text)

    def test_refuses_what_would_wedge_or_unconstrain_the_pipeline(self):
        for bad in ("root ::= [a-", "root ::= [z-a]", 'root ::= "a"{3,1}', "root ::= x", 'root ::= "a"\nroot ::= "b"', ""):
            with self.assertRaises(GrammarError, msg=bad):
                Grammar(bad)
        empty = Grammar('root ::= x\nx ::= x "a"')
        with self.assertRaises(GrammarError):
            empty.check_rule("root")

    def test_derivative_by_text(self):
        g = Grammar('root ::= "ab" [0-9]+ ("x" | "y")?\n')
        self.assertEqual(g.derive(ref("root"), "zz"), ())
        conts = g.derive(ref("root"), "ab1")
        self.assertTrue(any(g.seq_nullable(s) for s in conts))
        self.assertTrue(g.derive(conts, "2x"))
        self.assertEqual(g.derive(conts, "xx"), ())


class Plans(unittest.TestCase):
    def test_rule_start_is_one_grammar(self):
        plan = plan_for(rule_guide('root ::= "yes" | "no"'))
        self.assertEqual(plan[0], "ebnf")
        self.assertTrue(plan[1].startswith("root ::= k-root\n"))

    def test_triggers_become_triggered_tags_whose_content_follows_the_trigger_text(self):
        guide = {"grammar": CALL, "start": {"kind": "free"}, "triggers": [{"text": "<tool_call>", "rule": "call", "then": "end"}]}
        kind, texts, tags, stop = plan_for(guide)
        self.assertEqual((kind, texts, stop), ("triggered", ["<tool_call>"], True))
        self.assertEqual(tags[0][1], "<tool_call>")
        self.assertTrue(tags[0][2][1].startswith('root ::= "\\u000a{" [a-z]{1,4}'), tags[0][2][1])

    def test_gated_rule_and_reasoning(self):
        guide = rule_guide('gate ::= "<think>" | body\nbody ::= "ok"', "gate", reasoning={"open": "<think>", "close": "</think>", "after": {"kind": "rule", "rule": "body", "then": "end"}})
        plan = plan_for(guide)
        self.assertEqual(plan[0], "union")
        self.assertEqual(plan[1][0][1][0], ("tag", "<think>", ("any",), "</think>"))
        # Resumed inside and after reasoning: the machine's state, never a restart.
        self.assertEqual(plan_for(guide, "<think>hm")[1][0], ("tag", "", ("any",), "</think>"))
        after = plan_for(guide, "<think>hm</think>o")
        self.assertEqual(after[0], "ebnf")
        self.assertTrue(after[1].startswith('root ::= "k"'), after[1])

    def test_resume_inside_a_rule_continues_it(self):
        plan = plan_for(rule_guide('root ::= "{" [a-z]{1,4} "}"'), "{ab")
        self.assertTrue(plan[1].startswith("root ::= [a-z]{0,2} \"}\""), plan[1])
        with self.assertRaises(GuideRefused):
            plan_for(rule_guide('root ::= "{" [a-z]{1,4} "}"'), "x")

    def test_refusals_name_the_engine(self):
        cases = [
            rule_guide("root ::= [a-"),
            rule_guide('root ::= "a"', rule="missing"),
            {"grammar": CALL, "start": {"kind": "free"}, "triggers": [{"text": "<x>", "rule": "call"}]},
        ]
        for guide in cases:
            with self.assertRaises(GuideRefused, msg=str(guide)) as cm:
                plan_for(guide)
            self.assertIn("OpenVINO engine", str(cm.exception))
        with self.assertRaises(GuideRefused):
            plan_for({"grammar": CALL, "start": {"kind": "free"}, "triggers": [{"text": "<tool_call>", "rule": "call"}]}, "text <tool")

    def test_plans_become_openvino_configs(self):
        import openvino_genai as ov_genai

        guide = {"grammar": CALL, "start": {"kind": "reasoning"}, "reasoning": {"open": "<think>", "close": "</think>", "after": {"kind": "free"}}, "triggers": [{"text": "<tool_call>", "rule": "call"}]}
        config = to_structured_config(plan_for(guide), ov_genai)
        self.assertIsNotNone(config.structural_tags_config)
        self.assertIsNotNone(to_structured_config(plan_for(rule_guide('root ::= "a"')), ov_genai).grammar)


def in_language(ebnf: str, text: str) -> str:
    """'yes' (complete), 'prefix' (may go on) or 'no', reading the emitted EBNF back with Keel's GBNF reader."""
    g = Grammar(ebnf)
    conts = g.derive(ref("root"), text)
    return "no" if not conts else "yes" if any(g.seq_nullable(s) for s in conts) else "prefix"


class FreeTextAutomaton(unittest.TestCase):
    BARE = 'bare ::= "{" [a-z]{1,3} "}"\n'

    def guide(self, **extra):
        triggers = [{"text": "<tool_call>", "rule": "call", "then": "free"}, {"text": "{", "rule": "bare", "atStart": True, "then": "free"}]
        return {"grammar": CALL + self.BARE, "start": {"kind": "free"}, "triggers": triggers, **extra}

    def test_start_only_trigger_fires_only_at_the_start(self):
        kind, ebnf = plan_for(self.guide())
        self.assertEqual(kind, "ebnf")
        self.assertEqual(in_language(ebnf, " \n{ab}"), "yes")
        self.assertEqual(in_language(ebnf, " {a"), "prefix")  # inside the call: only the rule may follow
        self.assertEqual(in_language(ebnf, " {a!"), "no")
        self.assertEqual(in_language(ebnf, "so {a! free text"), "yes")
        # Anywhere triggers still constrain, and the free phase re-arms from its start after a call (then: free).
        self.assertEqual(in_language(ebnf, "hi <tool_call>\n{ab}\n</tool_call>{cd}"), "yes")
        self.assertEqual(in_language(ebnf, "hi <tool_call>\n{ab}\n</tool_call>{c!"), "no")
        self.assertEqual(in_language(ebnf, "hi <tool_call>\nnope"), "no")

    def test_gated_free_start_excludes_the_opener_from_the_free_alternative(self):
        guide = self.guide(reasoning={"open": "<think>", "close": "</think>", "after": {"kind": "free"}})
        kind, (reasoning_first, free) = plan_for(guide)
        self.assertEqual(kind, "union")
        self.assertEqual(reasoning_first[1][1], ("tag", "<think>", ("any",), "</think>"))
        self.assertEqual(in_language(free[1], "  <think>"), "no")
        self.assertEqual(in_language(free[1], "  <thin>"), "yes")
        self.assertEqual(in_language(free[1], "a <think> later is free text"), "yes")

    def test_resumed_free_text_continues_where_it_stopped(self):
        # Past the start: the start-only trigger can no longer fire, the anywhere trigger still can.
        kind, texts, _, _ = plan_for(self.guide(), "so far ")
        self.assertEqual((kind, texts), ("triggered", ["<tool_call>"]))
        # Inside a call opened by the start-only trigger, or by the anywhere one: the rule goes on from there.
        kind, (rest, after) = plan_for(self.guide(), "  {a")
        self.assertEqual((kind, rest[0], after[0]), ("concat", "ebnf", "ebnf"))
        self.assertTrue(rest[1].startswith('root ::= [a-z]{0,2} "}"'), rest[1])
        self.assertTrue(plan_for(self.guide(), "x <tool_call>\n{a")[1][0][1].startswith('root ::= [a-z]{0,3} "}'))
        # A call completed: the free phase again from its start (then: free), start-only trigger armed.
        kind, (rest, after) = plan_for(self.guide(), "{ab}")
        self.assertEqual((kind, in_language(rest[1], ""), in_language(rest[1], "x")), ("concat", "yes", "no"))
        self.assertEqual(in_language(after[1], " {cd}"), "yes")

    def test_mixed_then_is_exact_too(self):
        triggers = [{"text": "<tool_call>", "rule": "call", "then": "end"}, {"text": "{", "rule": "bare", "then": "free"}]
        kind, ebnf = plan_for({"grammar": CALL + self.BARE, "start": {"kind": "free"}, "triggers": triggers})
        self.assertEqual(kind, "ebnf")
        self.assertEqual(in_language(ebnf, "a {b} c {d} e"), "yes")
        self.assertEqual(in_language(ebnf, "a <tool_call>\n{b}\n</tool_call>"), "yes")
        self.assertEqual(in_language(ebnf, "a <tool_call>\n{b}\n</tool_call> more"), "no")


class Literals(unittest.TestCase):
    def test_latin1_before_a_hex_digit_ends_the_literal(self):
        # XGrammar reads "°C" as U+0B0C (xgrammar_contract.latin1_before_hex_digit); U+0100 and a non-hex letter are fine.
        self.assertIn('k-root ::= ("°" "C") "éz" "Āa" ("x°" "F1")', Grammar('root ::= "°C" "éz" "Āa" "x°F1"\n').ebnf(ref("root")))


class PhaseAt(unittest.TestCase):
    def test_where_the_text_leaves_the_phase_machine(self):
        triggered = {"grammar": CALL, "start": {"kind": "free"}, "triggers": [{"text": "<tool_call>", "rule": "call", "then": "end"}]}
        self.assertEqual([phase_at(triggered, t) for t in ("", "hi ", "hi <tool_call>\n{ab")], ["free", "free", "rule"])
        with self.assertRaises(GuideRefused):
            phase_at(triggered, "hi <tool")  # inside the trigger's text: no re-add can continue there
        gated = {"grammar": 'ans ::= "yes" | "no"\n', "start": {"kind": "free"}, "reasoning": {"open": "<think>", "close": "</think>", "after": {"kind": "rule", "rule": "ans", "then": "end"}}}
        self.assertEqual([phase_at(gated, t) for t in ("", "<think>hm", "<think>hm</think>", "<think>hm</think>y")], ["free", "reasoning", "rule", "rule"])
        self.assertEqual([phase_at(rule_guide("root ::= [a-z]+\n"), t) for t in ("", "ab")], ["rule", "rule"])


if __name__ == "__main__":
    unittest.main()
