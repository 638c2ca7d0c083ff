"""Contract checks of OpenVINO GenAI's structured output (XGrammar, bundled in openvino-genai 2026.4.1) that the
guide mapping works around (guides.py, gbnf.py, free_text.py; docs/upstream.md "XGrammar in OpenVINO GenAI").

Run by xgrammar.contract.test.ts as `python xgrammar_contract.py MODEL.gguf CHECK`; prints one JSON object. Each
check shows the raw behaviour on a fresh pipeline, so a fixed release makes the contract test fail.
"""
from __future__ import annotations

import json
import sys

import openvino_genai as g

from upstream_contract import config, ids_tensor, pipeline

S = g.StructuredOutputConfig


def run(model: str, structured, n: int = 12, **kw) -> dict:
    """Greedy `n` tokens under `structured`, beside an unconstrained request: texts, and the step() errors."""
    p = pipeline(model, 64)
    t, _ = ids_tensor(p, "hello there")
    c = config(n, **kw)
    c.structured_output_config = structured
    guided = p.add_request(0, t, c)
    plain = p.add_request(1, t, config(n, ignore_eos=True))
    outs: dict = {0: [], 1: []}
    errors = []
    for _ in range(3 * n):
        if not p.has_non_finished_requests():
            break
        try:
            p.step()
        except RuntimeError as err:
            errors.append(str(err).strip().splitlines()[-1][:200])
            if len(errors) >= 3:
                break
            continue
        for i, h in ((0, guided), (1, plain)):
            while h.can_read():
                for s in h.read().values():
                    outs[i].extend(int(x) for x in s.generated_ids)
    tok = p.get_tokenizer()
    return {"texts": [tok.decode(outs[i], skip_special_tokens=False) for i in (0, 1)], "tokens": outs[0], "stepErrors": errors}


def grammar(text: str) -> object:
    return S(grammar=text)


def tags(tag) -> object:
    s = S()
    s.structural_tags_config = tag
    return s


def bad_grammar_wedges(model: str) -> dict:
    """A grammar XGrammar cannot parse raises inside step() (not at add_request), for the whole batch, every step."""
    return run(model, grammar("root ::= [z-a]"))


def hex_escape_greedy(model: str) -> dict:
    """`\\x41bc` is one code point U+41BC (GBNF: "A" then "bc")."""
    return run(model, grammar('root ::= "\\x41bc"'))


def escaped_caret_negates(model: str) -> dict:
    """A class whose first character is `^`, even escaped, is negated: `[\\^a]` allows anything but ^ and a."""
    return run(model, grammar("root ::= [\\^a]{6}"))


def empty_language_unconstrained(model: str) -> dict:
    """A root that derives no string at all (`x ::= x "a"`) is no error: every token is masked and the sampler still
    emits tokens (NUL bytes greedy; seen unconstrained text when sampling)."""
    return run(model, grammar('root ::= x\nx ::= x "a"'), 16)


def union_mixed_raises(model: str) -> dict:
    """A Union of an open-ended element (AnyText) and a bounded one (EBNF) raises inside step()."""
    return run(model, tags(S.Union([S.EBNF('root ::= "a"'), S.AnyText()])))


def nested_triggers_raise(model: str) -> dict:
    """Triggers of which one is a prefix of another raise inside step() ("One tag matches multiple triggers")."""
    t = S.TriggeredTags(["<t>", "<t>x"], [S.Tag("<t>", S.EBNF('root ::= "1"'), ""), S.Tag("<t>x", S.EBNF('root ::= "2"'), "")], False, False)
    return run(model, tags(t))


def ignore_eos_after_grammar(model: str) -> dict:
    """ignore_eos: the end-of-generation a complete grammar forces is ignored and the output goes on unconstrained."""
    return run(model, grammar('root ::= "ab"'), 10, ignore_eos=True)


def min_new_tokens_masked(model: str) -> dict:
    """min_new_tokens past a complete grammar: everything is masked and token 0 (a NUL byte here) is sampled."""
    return run(model, grammar('root ::= "ab"'), 10, min_new_tokens=6)


def overlong_forms_accepted(model: str) -> dict:
    """A character class takes an overlong form (`C1 92` for "R") as one character: 48 sampled runs of a bounded
    class on random weights, whose byte tokens come up often; the runs whose bytes are not valid UTF-8, in hex."""
    from upstream_contract import drain
    from model_meta import model_metadata, token_bytes_table

    model_metadata(model)
    table = token_bytes_table(model)
    p = pipeline(model, 64)
    t, _ = ids_tensor(p, "write")
    eog = {p.get_tokenizer().get_eos_token_id()}
    handles = []
    for i in range(48):
        c = config(30, do_sample=True, temperature=1.5, rng_seed=700 + i)
        c.structured_output_config = grammar('root ::= "<" [^<>\\u0000-\\u001F]{1,6} ">"')
        handles.append(p.add_request(i, t, c))
    invalid = []
    for ids in drain(p, handles).values():
        raw = b"".join(table[x] for x in ids if x not in eog)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            invalid.append(raw.hex(" "))
    return {"texts": ["", ""], "tokens": [], "stepErrors": [], "invalid": invalid}


def latin1_before_hex_digit(model: str) -> dict:
    """Inside a string literal, a character U+0080–U+00FF followed by a hex digit is read as one greedy hex escape:
    `"°C"` matches U+0B0C (greedy, the only text the grammar allows). Split into `"°" "C"` it matches "°C"."""
    return {"texts": [run(model, grammar('root ::= "°C"'), 4)["texts"][0], run(model, grammar('root ::= ("°" "C")'), 4)["texts"][0]], "tokens": [], "stepErrors": []}


CHECKS = {f.__name__: f for f in (latin1_before_hex_digit, bad_grammar_wedges, hex_escape_greedy, escaped_caret_negates, empty_language_unconstrained, union_mixed_raises, nested_triggers_raise, ignore_eos_after_grammar, min_new_tokens_masked, overlong_forms_accepted)}

if __name__ == "__main__":
    print(json.dumps(CHECKS[sys.argv[2]](sys.argv[1])))
