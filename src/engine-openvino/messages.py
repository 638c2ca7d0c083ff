"""Validation of gateway → engine messages: the same rules as src/protocol/validate.ts (docs/protocol.md §3).

`parse_message` returns ("ok", message), ("protocol_error", why) for something that is not a message, or
("refuse", id, why) for a sound `add` whose sampling parameters are unusable (answered with invalid_params).
"""
from __future__ import annotations

import re
from typing import Any

PROTOCOL_VERSION = 1

_INT32_MAX = 0x7FFFFFFF
_RULE_NAME = re.compile(r"^[A-Za-z0-9-]+$")
_SAMPLING_KEYS = {
    "maxTokens", "temperature", "topP", "topK", "seed", "ignoreEos", "presencePenalty", "frequencyPenalty",
    "repetitionPenalty", "minP", "logitBias", "minTokens", "stopTokenIds", "logprobs", "guide",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _token_ids(v: Any, min_len: int = 0) -> bool:
    return isinstance(v, list) and len(v) >= min_len and all(_is_int(t) and 0 <= t <= _INT32_MAX for t in v)


def _phase_error(p: Any) -> str | None:
    if not isinstance(p, dict) or p.get("kind") not in ("free", "reasoning", "rule"):
        return "must be a phase {kind: free|reasoning|rule}"
    if p["kind"] == "rule":
        if set(p) != {"kind", "rule", "then"}:
            return "a rule phase has exactly kind, rule and then"
        if not isinstance(p["rule"], str) or not _RULE_NAME.match(p["rule"]):
            return "rule must be a GBNF rule name (letters, digits, '-')"
        if p["then"] not in ("free", "end"):
            return "then must be free or end"
    elif set(p) != {"kind"}:
        return "has unknown keys"
    return None


def _guide_error(g: Any) -> str | None:
    """Shape of params.guide (whether its grammar compiles is the engine's business)."""
    if not isinstance(g, dict):
        return "guide must be an object"
    if not isinstance(g.get("grammar"), str) or g["grammar"] == "":
        return "guide.grammar must be a non-empty string"
    err = _phase_error(g.get("start"))
    if err:
        return f"guide.start {err}"
    for t in g.get("triggers") or []:
        if not isinstance(t, dict) or not isinstance(t.get("text"), str) or t["text"] == "":
            return "guide.triggers[].text must be a non-empty string"
        if not isinstance(t.get("rule"), str) or not _RULE_NAME.match(t["rule"]):
            return "guide.triggers[].rule must be a GBNF rule name"
    return None


def sampling_error(p: Any) -> str | None:
    """Range checks of every sampling parameter (vocabulary-dependent checks are the engine's)."""
    if not isinstance(p, dict):
        return "params must be an object"
    unknown = set(p) - _SAMPLING_KEYS
    if unknown:
        return f"params has unknown key {sorted(unknown)[0]}"
    mt = p.get("maxTokens", "missing")
    if not (mt is None or (_is_int(mt) and mt >= 1)):
        return "params.maxTokens must be an integer >= 1 or null"
    t = p.get("temperature")
    if not (_is_num(t) and 0 <= t <= 2):
        return "params.temperature must be a number in [0, 2]"
    tp = p.get("topP")
    if not (_is_num(tp) and 0 < tp <= 1):
        return "params.topP must be in (0, 1]"
    tk = p.get("topK")
    if not (_is_int(tk) and tk >= -1):
        return "params.topK must be an integer >= -1"
    seed = p.get("seed")
    if not (_is_int(seed) and 0 <= seed <= 0xFFFFFFFF):
        return "params.seed must be a uint32"
    if not isinstance(p.get("ignoreEos"), bool):
        return "params.ignoreEos must be a boolean"
    for key in ("presencePenalty", "frequencyPenalty"):
        if key in p and not (_is_num(p[key]) and -2 <= p[key] <= 2):
            return f"params.{key} must be in [-2, 2]"
    if "repetitionPenalty" in p and not (_is_num(p["repetitionPenalty"]) and 0 < p["repetitionPenalty"] <= 100):
        return "params.repetitionPenalty must be in (0, 100]"
    if "minP" in p and not (_is_num(p["minP"]) and 0 <= p["minP"] <= 1):
        return "params.minP must be in [0, 1]"
    if "minTokens" in p:
        if not (_is_int(p["minTokens"]) and p["minTokens"] >= 0):
            return "params.minTokens must be an integer >= 0"
        if mt is not None and p["minTokens"] > mt:
            return f"params.minTokens ({p['minTokens']}) must not exceed maxTokens ({mt})"
    if "logitBias" in p:
        lb = p["logitBias"]
        if not isinstance(lb, list):
            return "params.logitBias must be a list of [token, bias]"
        seen: set[int] = set()
        for pair in lb:
            if not (isinstance(pair, list) and len(pair) == 2 and _is_int(pair[0]) and 0 <= pair[0] <= _INT32_MAX
                    and _is_num(pair[1]) and -100 <= pair[1] <= 100):
                return "params.logitBias entries must be [token id, bias in [-100, 100]]"
            if pair[0] in seen:
                return f"params.logitBias: token {pair[0]} is biased twice"
            seen.add(pair[0])
    if "stopTokenIds" in p and not _token_ids(p["stopTokenIds"]):
        return "params.stopTokenIds must be token ids"
    lp = p.get("logprobs")
    if lp is not None and not (_is_int(lp) and lp >= 0):
        return "params.logprobs must be an integer >= 0 or null"
    if "guide" in p:
        err = _guide_error(p["guide"])
        if err:
            return f"params.{err}"
    return None


def parse_message(raw: dict) -> tuple:
    """Classify one decoded frame (see the module doc)."""
    if raw.get("v") != PROTOCOL_VERSION:
        return ("protocol_error", f"unsupported protocol version {raw.get('v')!r} (expected {PROTOCOL_VERSION})")
    kind = raw.get("type")
    if kind == "add":
        rid = raw.get("id")
        if not isinstance(rid, str) or not 1 <= len(rid) <= 256:
            return ("protocol_error", "invalid add message: id must be a string of 1..256 characters")
        prompt = raw.get("prompt")
        if not isinstance(prompt, dict) or not (
            isinstance(prompt.get("text"), str) or _token_ids(prompt.get("tokens"), 1)
        ):
            return ("protocol_error", "invalid add message: prompt must be {text} or {tokens}")
        if "generated" in raw and not _token_ids(raw["generated"]):
            return ("protocol_error", "invalid add message: generated must be token ids")
        if not isinstance(raw.get("params"), dict):
            return ("protocol_error", "invalid add message: params must be an object")
        err = sampling_error(raw["params"])
        if err:
            return ("refuse", rid, f"invalid sampling parameters: {err}")
        return ("ok", raw)
    if kind == "abort":
        ids = raw.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return ("protocol_error", "invalid abort message: ids must be strings")
        return ("ok", raw)
    if kind == "ping":
        if not _is_num(raw.get("nonce")):
            return ("protocol_error", "invalid ping message: nonce must be a number")
        return ("ok", raw)
    if kind == "shutdown":
        return ("ok", raw)
    if kind == "tokenize":
        rid = raw.get("id")
        if not isinstance(rid, str) or not 1 <= len(rid) <= 256 or not isinstance(raw.get("text"), str) \
                or not isinstance(raw.get("addSpecialTokens"), bool):
            return ("protocol_error", "invalid tokenize message: id, text and addSpecialTokens are required")
        return ("ok", raw)
    return ("protocol_error", f"invalid {kind} message: unknown type")
