"""Stream and ask unary for the same tool-call request with the official OpenAI Python SDK; print one JSON object.

Usage: .venv-test/bin/python test/e2e/python/tool_args_check.py http://127.0.0.1:PORT REQUEST_JSON

Run by test/e2e/streamed-tool-args.test.ts, which makes the assertions; this script only observes: the unary call,
and for the stream every `function.arguments` fragment of call 0 as the SDK delivered it.
"""

import json
import sys

import openai


def main():
    base_url, request = sys.argv[1], json.loads(sys.argv[2])
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="keel-test", max_retries=0, timeout=240)
    extra = request.pop("extra_body", None)
    unary = client.chat.completions.create(**request, extra_body=extra)
    choice = unary.choices[0]
    calls = choice.message.tool_calls or []
    fragments, name, finish, ids = [], "", None, set()
    for chunk in client.chat.completions.create(**request, extra_body=extra, stream=True):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        for t in ch.delta.tool_calls or []:
            if t.index != 0:
                continue
            if t.id:
                ids.add(t.id)
            if t.function and t.function.name:
                name += t.function.name
            if t.function and t.function.arguments:
                fragments.append(t.function.arguments)
        if ch.finish_reason:
            finish = ch.finish_reason
    print(json.dumps({
        "unary": {
            "finish_reason": choice.finish_reason,
            "name": calls[0].function.name if calls else None,
            "arguments": calls[0].function.arguments if calls else None,
        },
        "stream": {"finish_reason": finish, "name": name, "fragments": fragments, "ids": len(ids)},
    }))


if __name__ == "__main__":
    main()
