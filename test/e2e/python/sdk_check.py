"""Drive a running Keel server with the official OpenAI Python SDK and print what happened as one JSON object.

Usage: .venv-test/bin/python test/e2e/python/sdk_check.py http://127.0.0.1:PORT

Run by test/e2e/openai-python-sdk.test.ts, which makes the assertions; this script only observes. It exits non-zero
(with a traceback on stderr) when the SDK raises where it should not.
"""

import json
import sys
import urllib.request

import openai

MODEL = "keel-tiny"


def greedy(content, max_tokens, **extra):
    """A greedy request; ignore_eos is a Keel (vLLM/OVMS) extension sent through extra_body."""
    return dict(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
        **extra,
    )


def usage_dict(u):
    return None if u is None else {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "total_tokens": u.total_tokens}


def error_info(call):
    """Run `call`, which should raise an SDK error; describe the error (or its absence)."""
    try:
        call()
    except openai.APIStatusError as e:
        return {
            "class": type(e).__name__,
            "is_bad_request": isinstance(e, openai.BadRequestError),
            "is_not_found": isinstance(e, openai.NotFoundError),
            "status": e.status_code,
            "code": e.code,
            "param": e.param,
            "type": e.type,
            "message": e.message,
        }
    return {"class": None}


def main():
    base = sys.argv[1]
    out = {"sdk_version": openai.__version__}
    client = openai.OpenAI(base_url=base + "/v3", api_key="keel-test", max_retries=0, timeout=60)

    # Unary and streaming (with include_usage) on /v3 and /v1.
    for prefix in ("/v3", "/v1"):
        c = openai.OpenAI(base_url=base + prefix, api_key="keel-test", max_retries=0, timeout=60)
        u = c.chat.completions.create(**greedy("Tell me a story about 🦊", 40))
        chunks = list(c.chat.completions.create(**greedy("Tell me a story about 🦊", 40), stream=True, stream_options={"include_usage": True}))
        out[prefix] = {
            "unary": {
                "id": u.id,
                "object": u.object,
                "text": u.choices[0].message.content,
                "role": u.choices[0].message.role,
                "finish_reason": u.choices[0].finish_reason,
                "usage": usage_dict(u.usage),
            },
            "stream": {
                "chunks": len(chunks),
                "distinct_ids": len({ch.id for ch in chunks}),
                "first_role": chunks[0].choices[0].delta.role if chunks and chunks[0].choices else None,
                "text": "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices),
                "finish_reasons": [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason],
                "last_choices": len(chunks[-1].choices) if chunks else None,
                "last_usage": usage_dict(chunks[-1].usage) if chunks else None,
                "usage_before_last": [usage_dict(ch.usage) for ch in chunks[:-1] if ch.usage is not None],
            },
        }

    # Errors parsed into the SDK's classes.
    out["bad_temperature"] = error_info(lambda: client.chat.completions.create(**greedy("x", 4) | {"temperature": 7}))
    out["bad_temperature_stream"] = error_info(lambda: client.chat.completions.create(**greedy("x", 4) | {"temperature": 7}, stream=True))
    out["unknown_model"] = error_info(lambda: client.chat.completions.create(**greedy("x", 4) | {"model": "gpt-9"}))

    # Close a stream mid-way.
    stream = client.chat.completions.create(**greedy("keep going for a long time", 2000), stream=True)
    content_chunks = 0
    finish_reason = None
    for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            content_chunks += 1
        if ch.choices and ch.choices[0].finish_reason:
            finish_reason = ch.choices[0].finish_reason
        if content_chunks == 5:
            break
    stream.close()
    out["closed_stream"] = {"content_chunks": content_chunks, "finish_reason": finish_reason}

    # The server after the close: ready, and serving.
    with urllib.request.urlopen(base + "/v2/health/ready", timeout=10) as r:
        ready = r.status
    after = client.chat.completions.create(**greedy("still there?", 4))
    out["after_close"] = {"ready_status": ready, "finish_reason": after.choices[0].finish_reason, "completion_tokens": after.usage.completion_tokens}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
