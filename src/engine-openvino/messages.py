"""Validation of gateway → engine messages against the protocol's JSON Schema (docs/protocol.md §3).

The rules are not written here: they are read from src/protocol/protocol.schema.json, generated from the zod
schemas the llama.cpp engine validates with (src/protocol/gateway-schema.ts), and interpreted by the small validator
below, which implements exactly the keywords that generator emits (src/protocol/json-schema.ts SCHEMA_KEYWORDS) with
the semantics of zod and of the gateway's compiled validator (src/protocol/schema-validator.ts): string lengths count
code points, "integer" is a JSON number without a fraction, a union is dispatched on its discriminating constant,
and the named cross-field checks (`x-keel-checks`, src/protocol/checks.ts) run once an object's shape is valid. A
schema with a keyword or a check this module does not know fails the import: the worker refuses to start rather than
skip a rule. src/protocol/schema-parity.test.ts checks that this module and the TypeScript validation classify every
message alike.

`parse_message` returns ("ok", message), ("protocol_error", why) for something that is not a message, or
("refuse", id, why) for a sound `add` whose sampling parameters are unusable (answered with invalid_params).
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Callable, Optional, Tuple

#: The generated schema (checked in beside the zod schemas it comes from).
SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "protocol", "protocol.schema.json")

with open(SCHEMA_PATH, encoding="utf-8") as _f:
    SCHEMA: dict = json.load(_f)

PROTOCOL_VERSION: int = SCHEMA["protocolVersion"]
_CONSTANTS: dict = SCHEMA["checkConstants"]
_CHECKS_KEYWORD = "x-keel-checks"
#: The keywords the generator emits (json-schema.ts SCHEMA_KEYWORDS); anything else is refused at import.
_KEYWORDS = {
    "type", "const", "enum", "properties", "required", "additionalProperties", "propertyNames", "items", "prefixItems",
    "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "anyOf", "oneOf", _CHECKS_KEYWORD, "$schema", "description",
}

#: A failure: (path from the validated value, message).
Failure = Tuple[list, str]


def _issue(path: list, message: str) -> Failure:
    return (path, message)


# The named cross-field checks (src/protocol/checks.ts CHECKS): each returns a failure or None.
def _grammar_size(g: dict) -> Optional[Failure]:
    limit = _CONSTANTS["maxGuideGrammarBytes"]
    return None if len(g["grammar"].encode("utf-8", "surrogatepass")) <= limit else _issue(["grammar"], f"must be at most {limit} bytes")


def _reserved_rule_undefined(g: dict) -> Optional[Failure]:
    rule = _CONSTANTS["reservedRule"]
    return _issue(["grammar"], f"defines the reserved rule {rule}") if re.search(rf"^\s*{re.escape(rule)}\s*::=", g["grammar"], re.M) else None


def _reasoning_has_markers(g: dict) -> Optional[Failure]:
    after = (g.get("reasoning") or {}).get("after") or {}
    uses = g["start"]["kind"] == "reasoning" or after.get("kind") == "reasoning"
    return _issue(["reasoning"], "a reasoning phase needs reasoning.open/close") if uses and "reasoning" not in g else None


def _reasoning_ends(g: dict) -> Optional[Failure]:
    return _issue(["reasoning", "after"], "must not be reasoning again") if "reasoning" in g and g["reasoning"]["after"]["kind"] == "reasoning" else None


def _min_tokens_within_max(p: dict) -> Optional[Failure]:
    mt, mn = p["maxTokens"], p.get("minTokens")
    return _issue(["minTokens"], f"minTokens ({mn}) must not exceed maxTokens ({mt})") if mn is not None and mt is not None and mn > mt else None


def _logit_bias_unique(p: dict) -> Optional[Failure]:
    seen: set = set()
    for token, _bias in p.get("logitBias") or []:
        if token in seen:
            return _issue(["logitBias"], f"token {token} is biased twice")
        seen.add(token)
    return None


_CHECKS: dict[str, Callable[[Any], Optional[Failure]]] = {
    "grammarSize": _grammar_size,
    "reservedRuleUndefined": _reserved_rule_undefined,
    "reasoningHasMarkers": _reasoning_has_markers,
    "reasoningEnds": _reasoning_ends,
    "minTokensWithinMax": _min_tokens_within_max,
    "logitBiasUnique": _logit_bias_unique,
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "number": _is_number,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _same(a: Any, b: Any) -> bool:
    """JavaScript's `===` on JSON values: True is not 1."""
    return isinstance(a, bool) == isinstance(b, bool) and isinstance(a, str) == isinstance(b, str) and a == b


_PATTERNS: dict[str, re.Pattern] = {}


def _pattern(source: str) -> re.Pattern:
    """An ECMAScript pattern as Python reads it: `$` ends the string (Python's also matches before a final newline)."""
    if source not in _PATTERNS:
        _PATTERNS[source] = re.compile(re.sub(r"(?<!\\)\$", r"\\Z", source))
    return _PATTERNS[source]


def _const_at(s: dict, key: str) -> Any:
    """The constant a branch requires at `key` (through nested unions that agree), or a sentinel when none."""
    prop = (s.get("properties") or {}).get(key)
    if prop is not None and "const" in prop and key in (s.get("required") or []):
        return prop["const"]
    branches = s.get("anyOf") or s.get("oneOf")
    if not branches:
        return _NONE
    values = [_const_at(b, key) for b in branches]
    return values[0] if all(v is not _NONE and _same(v, values[0]) for v in values) else _NONE


_NONE = object()


def _keys_of(s: dict) -> list:
    return list(s.get("properties") or {}) + [k for b in (s.get("anyOf") or s.get("oneOf") or []) for k in _keys_of(b)]


def _discriminator(branches: list) -> Optional[Tuple[str, list]]:
    for key in dict.fromkeys(k for b in branches for k in _keys_of(b)):
        values = [_const_at(b, key) for b in branches]
        if all(v is not _NONE for v in values) and len({json.dumps(v) for v in values}) == len(values):
            return key, values
    return None


#: Each union's discriminator, found once (keyed by the identity of its branch list, which the schema keeps alive).
_TAGS: dict[int, Optional[Tuple[str, list]]] = {}


def _union(branches: list, exactly_one: bool, v: Any) -> Optional[Failure]:
    if id(branches) not in _TAGS:
        _TAGS[id(branches)] = _discriminator(branches)
    tag = _TAGS[id(branches)]
    if tag:
        key, values = tag
        at = v.get(key, _NONE) if isinstance(v, dict) else _NONE
        for branch, value in zip(branches, values):
            if at is not _NONE and _same(at, value):
                return validate(branch, v)
        return _issue([key], "must be one of " + ", ".join(json.dumps(x) for x in values))
    failures = [validate(b, v) for b in branches]
    matched = sum(f is None for f in failures)
    if matched > 1 and exactly_one:
        return _issue([], "matches more than one alternative")
    if matched == 0:
        return _issue([], f"matches no alternative (first: {_describe(failures[0], [])})")
    return None


def validate(s: dict, v: Any) -> Optional[Failure]:
    """Check `v` against schema node `s`: None when valid, else (path, message) of the first failure."""
    # 1. Type first: every other keyword assumes it.
    if "type" in s:
        t = s["type"]
        if not (_TYPES[t](v) if isinstance(t, str) else any(_TYPES[x](v) for x in t)):
            types = [t] if isinstance(t, str) else t
            return _issue([], "must be " + " or ".join(t if t == "null" else ("an " if t[0] in "aio" else "a ") + t for t in types))
    if "const" in s and not _same(v, s["const"]):
        return _issue([], f"must be {json.dumps(s['const'])}")
    if "enum" in s and not any(_same(v, e) for e in s["enum"]):
        return _issue([], "must be one of " + ", ".join(json.dumps(e) for e in s["enum"]))
    # 2. Numbers and strings.
    if _is_number(v):
        if "minimum" in s and not v >= s["minimum"]:
            return _issue([], f"must be >= {s['minimum']}")
        if "maximum" in s and not v <= s["maximum"]:
            return _issue([], f"must be <= {s['maximum']}")
        if "exclusiveMinimum" in s and not v > s["exclusiveMinimum"]:
            return _issue([], f"must be > {s['exclusiveMinimum']}")
        if "exclusiveMaximum" in s and not v < s["exclusiveMaximum"]:
            return _issue([], f"must be < {s['exclusiveMaximum']}")
    if isinstance(v, str):
        if "minLength" in s and len(v) < s["minLength"]:
            return _issue([], f"must have at least {s['minLength']} characters")
        if "maxLength" in s and len(v) > s["maxLength"]:
            return _issue([], f"must have at most {s['maxLength']} characters")
        if "pattern" in s and not _pattern(s["pattern"]).search(v):
            return _issue([], f"must match {s['pattern']}")
    # 3. Arrays: positional items, then the rest.
    if isinstance(v, list):
        if "minItems" in s and len(v) < s["minItems"]:
            return _issue([], f"must have at least {s['minItems']} items")
        if "maxItems" in s and len(v) > s["maxItems"]:
            return _issue([], f"must have at most {s['maxItems']} items")
        prefix = s.get("prefixItems") or []
        items = s.get("items")
        for i, x in enumerate(v):
            sub = prefix[i] if i < len(prefix) else items
            if sub is False:
                return _issue([], f"must have at most {len(prefix)} items")
            if sub is not None:
                f = validate(sub, x)
                if f:
                    return ([i] + f[0], f[1])
    # 4. Objects: declared properties, then undeclared ones.
    if isinstance(v, dict):
        props = s.get("properties") or {}
        for k, sub in props.items():
            if k not in v:
                if k in (s.get("required") or []):
                    return _issue([k], "is required")
                continue
            f = validate(sub, v[k])
            if f:
                return ([k] + f[0], f[1])
        for k in s.get("required") or []:
            if k not in v:
                return _issue([k], "is required")
        extra = s.get("additionalProperties")
        if extra is False or extra:
            for k in v:
                if k not in props:
                    if extra is False:
                        return _issue([k], "is not a known field")
                    f = validate(extra, v[k])
                    if f:
                        return ([k] + f[0], f[1])
    # 5. Unions.
    if "anyOf" in s:
        f = _union(s["anyOf"], False, v)
        if f:
            return f
    if "oneOf" in s:
        f = _union(s["oneOf"], True, v)
        if f:
            return f
    # 6. Named cross-field checks, once the shape is valid.
    if _CHECKS_KEYWORD in s:
        for name in s[_CHECKS_KEYWORD]:
            f = _CHECKS[name](v)
            if f:
                return f
    return None


def _audit(node: Any) -> None:
    """Refuse a schema that uses a keyword, a type or a check this validator does not implement."""
    if isinstance(node, list):
        for x in node:
            _audit(x)
        return
    if not isinstance(node, dict):
        return
    for k, x in node.items():
        if k not in _KEYWORDS:
            raise RuntimeError(f"{SCHEMA_PATH}: keyword {k} is not supported by messages.py")
        if k == "properties":
            for sub in x.values():
                _audit(sub)
        elif k == "type":
            for t in [x] if isinstance(x, str) else x:
                if t not in _TYPES:
                    raise RuntimeError(f"{SCHEMA_PATH}: type {t} is not supported by messages.py")
        elif k == _CHECKS_KEYWORD:
            for name in x:
                if name not in _CHECKS:
                    raise RuntimeError(f"{SCHEMA_PATH}: check {name} is not implemented in messages.py")
        elif k == "propertyNames" and x != {"type": "string"}:
            raise RuntimeError(f"{SCHEMA_PATH}: propertyNames other than {{type: string}} is not supported")
        elif k in ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf"):
            _audit(x)


_GATEWAY = SCHEMA["$defs"]["gatewayMessage"]
_PARAMS = SCHEMA["$defs"]["samplingParams"]
_audit([_GATEWAY, _PARAMS])


def _describe(f: Failure, root: list) -> str:
    return " ".join(p for p in (".".join(str(x) for x in root + f[0]), f[1]) if p)


def sampling_error(p: Any) -> str | None:
    """Range checks of every sampling parameter (vocabulary-dependent checks are the engine's)."""
    f = validate(_PARAMS, p)
    return _describe(f, ["params"]) if f else None


def parse_message(raw: dict) -> tuple:
    """Classify one decoded frame (see the module doc)."""
    if not _same(raw.get("v"), PROTOCOL_VERSION):
        return ("protocol_error", f"unsupported protocol version {json.dumps(raw.get('v'))} (expected {PROTOCOL_VERSION})")
    f = validate(_GATEWAY, raw)
    if f:
        return ("protocol_error", f"invalid {raw.get('type')} message: {_describe(f, [])}")
    if raw["type"] == "add":
        err = sampling_error(raw["params"])
        if err:
            return ("refuse", raw["id"], f"invalid sampling parameters: {err}")
    return ("ok", raw)
