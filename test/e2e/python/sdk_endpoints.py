"""Drive a running Keel server's issue-#8 endpoints with the official OpenAI Python SDK; print one JSON report.

Usage: .venv-test/bin/python test/e2e/python/sdk_endpoints.py http://127.0.0.1:PORT

Run by test/e2e/endpoints-python-sdk.test.ts, which makes the assertions; this script only observes (completions,
responses unary and streamed, n=2, logprobs).
"""

import json
import sys

import openai

MODEL = "keel-tiny"


def observe(call):
    """Run `call`; an SDK status error becomes {"error": ...} in the report (the test then fails on that section)."""
    try:
        return call()
    except openai.APIStatusError as e:
        return {"error": {"status": e.status_code, "message": e.message}}


def main():
    base = sys.argv[1]
    client = openai.OpenAI(base_url=base + "/v3", api_key="keel-test", max_retries=0, timeout=60)
    out = {}

    # completions.create, unary and streamed.
    c = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True, extra_body={"ignore_eos": True}))
    out["completions"] = {
        "object": c.object,
        "text": c.choices[0].text,
        "finish_reason": c.choices[0].finish_reason,
        "completion_tokens": c.usage.completion_tokens,
        "stream_text": "".join(ch.choices[0].text for ch in chunks if ch.choices),
        "stream_objects": sorted({ch.object for ch in chunks}),
    }

    # completions with integer logprobs (an SDK error is reported, not raised: the other sections still run).
    def completions_logprobs():
        lp = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
        return {
            "text": lp.choices[0].text,
            "tokens": lp.choices[0].logprobs.tokens if lp.choices[0].logprobs else None,
            "token_logprobs": lp.choices[0].logprobs.token_logprobs if lp.choices[0].logprobs else None,
            "top_sizes": [len(t) for t in lp.choices[0].logprobs.top_logprobs] if lp.choices[0].logprobs else None,
        }

    out["completions_logprobs"] = observe(completions_logprobs)

    # responses.create, unary and streamed.
    r = client.responses.create(model=MODEL, input="Tell me about foxes", max_output_tokens=10, temperature=0)
    events = list(client.responses.create(model=MODEL, input="Tell me about foxes", max_output_tokens=10, temperature=0, stream=True))
    out["responses"] = {
        "object": r.object,
        "status": r.status,
        "output_text": r.output_text,
        "output_tokens": r.usage.output_tokens,
        "event_types": [e.type for e in events],
        "sequence_numbers": [e.sequence_number for e in events],
        "stream_text": "".join(e.delta for e in events if e.type == "response.output_text.delta"),
    }
    try:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_123")
        out["previous_response_id"] = None
    except openai.BadRequestError as e:
        out["previous_response_id"] = {"status": e.status_code, "param": e.param}

    # n = 2 on chat, seeded.
    msgs = [{"role": "user", "content": "Pick a word"}]
    a = client.chat.completions.create(model=MODEL, messages=msgs, n=2, max_tokens=6, temperature=1, seed=7, extra_body={"ignore_eos": True})
    b = client.chat.completions.create(model=MODEL, messages=msgs, n=2, max_tokens=6, temperature=1, seed=7, extra_body={"ignore_eos": True})
    out["n2"] = {
        "indexes": [ch.index for ch in a.choices],
        "texts": [ch.message.content for ch in a.choices],
        "again": [ch.message.content for ch in b.choices],
        "completion_tokens": a.usage.completion_tokens,
    }

    # chat logprobs.
    def chat_logprobs():
        l = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "ünïcödé 🦊"}], max_tokens=6, temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
        content = l.choices[0].logprobs.content if l.choices[0].logprobs else None
        return {
            "text": l.choices[0].message.content,
            "entries": None if content is None else [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes, "top": len(e.top_logprobs)} for e in content],
        }

    out["chat_logprobs"] = observe(chat_logprobs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
