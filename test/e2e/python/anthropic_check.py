"""Drive a running Keel server's Anthropic Messages API with the official `anthropic` Python SDK; print one JSON object.

Usage: .venv-test/bin/python test/e2e/python/anthropic_check.py http://127.0.0.1:PORT MODEL API_KEY

Run by test/e2e/anthropic-messages.test.ts, which makes the assertions; this script only observes: a tool loop
(tool_use -> tool_result -> answer) unary and streamed, count_tokens, and the SDK's error classes. It exits non-zero
(with a traceback on stderr) when the SDK raises where it should not.
"""

import json
import sys

import anthropic

BASE, MODEL, KEY = sys.argv[1], sys.argv[2], sys.argv[3]
TOOLS = [
    {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def blocks(message):
    """The message's content blocks as plain dicts."""
    return [b.model_dump(exclude_none=True) for b in message.content]


def error_info(call):
    """Run `call`, which should raise an SDK status error; describe it."""
    try:
        call()
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return {"class": type(e).__name__, "status": e.status_code, "type": (body.get("error") or {}).get("type"), "envelope": body.get("type")}
    return {"class": None}


def main():
    client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=600)
    # Greedy decoding: `temperature` is no longer a parameter of this SDK's create(); it goes in the body as is.
    greedy = {"temperature": 0}
    req = dict(model=MODEL, max_tokens=80, extra_body=greedy, tools=TOOLS, tool_choice={"type": "any"}, messages=ASK)
    out = {"sdk_version": anthropic.__version__}

    # 1. A forced call, unary.
    first = client.messages.create(**req)
    out["first"] = {"id": first.id, "type": first.type, "role": first.role, "stop_reason": first.stop_reason, "content": blocks(first), "usage": first.usage.model_dump(exclude_none=True)}

    # 2. The same request streamed: the events seen, the tool input fragments, the final message.
    events = []
    partials = []
    with client.messages.stream(**req) as stream:
        for ev in stream:
            events.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                partials.append(ev.delta.partial_json)
        final = stream.get_final_message()
    out["stream"] = {"events": events, "partials": partials, "stop_reason": final.stop_reason, "content": blocks(final), "usage": final.usage.model_dump(exclude_none=True)}

    # 3. The tool's result goes back with the SDK's own assistant content; the model answers.
    calls = [b for b in first.content if b.type == "tool_use"]
    loop = ASK + [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": json.dumps({"temperature_c": 14, "sky": "cloudy"})} for c in calls]},
    ]
    second = client.messages.create(model=MODEL, max_tokens=40, extra_body=greedy, tools=TOOLS, messages=loop)
    out["second"] = {"stop_reason": second.stop_reason, "content": blocks(second)}
    with client.messages.stream(model=MODEL, max_tokens=40, extra_body=greedy, tools=TOOLS, messages=loop) as stream:
        second_streamed = stream.get_final_message()
    out["second_stream"] = {"stop_reason": second_streamed.stop_reason, "content": blocks(second_streamed)}

    # 4. count_tokens of the first request's prompt.
    out["count"] = client.messages.count_tokens(model=MODEL, tools=TOOLS, tool_choice={"type": "any"}, messages=ASK).input_tokens

    # 5. Errors: the SDK's classes from Anthropic's envelope.
    out["bad_request"] = error_info(lambda: client.messages.create(model=MODEL, max_tokens=10, extra_body={"temperature": 3}, messages=ASK))
    out["unknown_model"] = error_info(lambda: client.messages.create(model="no-such-model", max_tokens=10, messages=ASK))
    wrong = anthropic.Anthropic(base_url=BASE, api_key="wrong-key", max_retries=0)
    out["wrong_key"] = error_info(lambda: wrong.messages.create(model=MODEL, max_tokens=10, messages=ASK))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
