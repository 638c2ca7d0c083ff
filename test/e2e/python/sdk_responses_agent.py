"""Drive a running Keel server's Responses API as a Python agent would, with the official OpenAI Python SDK; print one
JSON report.

Usage: .venv-test/bin/python test/e2e/python/sdk_responses_agent.py http://127.0.0.1:PORT MODEL

Run by test/e2e/responses-real-model.test.ts (Qwen2.5-Coder-0.5B, --tool_parser hermes3), which makes the
assertions; this script only observes: a function call, the response's output items given back as the SDK returns
them plus the call's output, the answer, and the same first call streamed through the SDK's stream helper.
"""

import json
import sys

import openai

TOOLS = [{
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"], "additionalProperties": False},
    "strict": True,
}]
ASK = "What is the weather in Paris right now?"


def item(o):
    """What the test compares of an output item (ids are random)."""
    if o.type == "function_call":
        return {"type": o.type, "name": o.name, "arguments": o.arguments, "status": o.status, "call_id": o.call_id, "id": o.id}
    if o.type == "message":
        return {"type": o.type, "status": o.status, "text": "".join(c.text for c in o.content if c.type == "output_text")}
    return {"type": o.type}


def main():
    base, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base + "/v1", api_key="keel-test", max_retries=0, timeout=300)
    out = {}

    # 1. The call.
    first = client.responses.create(model=model, input=ASK, tools=TOOLS, temperature=0, max_output_tokens=80)
    out["first"] = {"status": first.status, "output": [item(o) for o in first.output], "input_tokens": first.usage.input_tokens}

    # 2. The agent gives the output items back as the SDK returned them, then the result; the model answers.
    calls = [o for o in first.output if o.type == "function_call"]
    history = [{"role": "user", "content": ASK}] + list(first.output)
    history += [{"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"temp_c": 18, "sky": "clear"})} for c in calls]
    second = client.responses.create(model=model, input=history, tools=TOOLS, tool_choice="none", temperature=0, max_output_tokens=40)
    alone = client.responses.create(model=model, input=ASK, tools=TOOLS, tool_choice="none", max_output_tokens=1)
    out["second"] = {"status": second.status, "output": [item(o) for o in second.output], "output_text": second.output_text, "input_tokens": second.usage.input_tokens, "alone_input_tokens": alone.usage.input_tokens}

    # 3. The first call streamed through the SDK's helper (it rebuilds the response from the events).
    with client.responses.stream(model=model, input=ASK, tools=TOOLS, temperature=0, max_output_tokens=80) as stream:
        events = list(stream)
        final = stream.get_final_response()
    out["stream"] = {
        "types": [e.type for e in events],
        "sequence_numbers": [e.sequence_number for e in events],
        "argument_deltas": [e.delta for e in events if e.type == "response.function_call_arguments.delta"],
        "arguments_done": [e.arguments for e in events if e.type == "response.function_call_arguments.done"],
        "output": [item(o) for o in final.output],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
