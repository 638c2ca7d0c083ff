import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CompactJson } from "./compact-json.js";
import { JsonCallReader } from "./json-call-reader.js";

/** Feeds `text` one character at a time; returns the writer and what `take` returned at each step, joined. */
function feed(text: string): { w: CompactJson; taken: string; prefixesValid: boolean } {
  const w = new CompactJson();
  let taken = "";
  let prefixesValid = true;
  for (const ch of text) {
    for (const unit of ch.length === 2 ? [ch[0]!, ch[1]!] : [ch]) {
      if (w.push(unit) === "error") throw new Error(`error at ${JSON.stringify(unit)} in ${text}`);
      taken += w.take();
      // Why: what was emitted plus the closer must always be valid JSON (a call cut here keeps valid arguments).
      if (taken !== "" && !w.complete) {
        try {
          JSON.parse(taken + w.closer());
        } catch {
          prefixesValid = false;
        }
      }
    }
  }
  return { w, taken, prefixesValid };
}

describe("CompactJson", () => {
  it("re-writes any JSON object as JSON.stringify does, at every prefix valid once closed", () => {
    const obj = fc.dictionary(fc.string({ maxLength: 5 }), fc.jsonValue({ maxDepth: 3 }), { maxKeys: 5 });
    fc.assert(
      fc.property(obj, fc.constantFrom(0, 1, 2, "\t"), (o, indent) => {
        const text = JSON.stringify(o, null, indent);
        const { w, taken, prefixesValid } = feed(text);
        expect(w.complete).toBe(true);
        expect(taken).toBe(JSON.stringify(JSON.parse(text)));
        expect(prefixesValid).toBe(true);
      }),
      { numRuns: 800 },
    );
  });

  it("normalises escapes and numbers, keeps surrogate pairs together, escapes raw control characters", () => {
    const text = '{ "a" : "\\u00e9\\/\\ud83c\\udf0e\n\t" , "n": [1.50, -0, 2E3, 1e-7], "t": true }';
    expect(feed(text).taken).toBe(JSON.stringify({ a: "é/🌎\n\t", n: [1.5, 0, 2000, 1e-7], t: true }));
  });

  it("a cut value closes what is open and drops a scalar or key still being written", () => {
    const cases: [string, string][] = [
      ['{"a": "xy', '{"a":"xy"}'],
      ['{"a": [1, {"b": tr', '{"a":[1,{}]}'],
      ['{"a": 1, "b', '{"a":1}'],
      ['{"a": 12', "{}"],
      ['{"a": "\\u00', '{"a":""}'],
      ['{"a": "\\ud83c', '{"a":"\\ud83c"}'],
    ];
    for (const [text, want] of cases) {
      const { w, taken } = feed(text);
      expect(taken + w.close(), text).toBe(want);
    }
  });

  it("refuses what is not JSON", () => {
    for (const bad of ['{"a" 1}', "{'a': 1}", '{"a": tru,', '{"a": 01x', '{"a": "\\x"}', "{,}"]) {
      const w = new CompactJson();
      const steps = [...bad].map((c) => w.push(c));
      expect(steps, bad).toContain("error");
    }
  });
});

describe("JsonCallReader", () => {
  /** Reads `text`; the name and the arguments as announced + streamed + closed. */
  function read(text: string): { step: string; name: string | null; args: string } {
    const r = new JsonCallReader();
    let args = "";
    let step = "more";
    for (const ch of text) {
      step = r.push(ch);
      args += r.takeArgs();
      if (step !== "more") break;
    }
    return { step, name: r.name, args: args + (r.name !== null ? r.closeArgs() : "") };
  }

  it("any key order, extra keys skipped, 'parameters' alias, arguments as a JSON text", () => {
    expect(read('{"id": 3, "arguments": {"x": [1]}, "name": "f"}')).toEqual({ step: "done", name: "f", args: '{"x":[1]}' });
    expect(read('{"name": "f", "parameters": {"x": 1}, "arguments": {"y": 2}}')).toEqual({ step: "done", name: "f", args: '{"x":1}' });
    expect(read('{"name": "f", "arguments": "{\\"a\\": 1}"}')).toEqual({ step: "done", name: "f", args: '{"a":1}' });
    expect(read('{"name": "f"}')).toEqual({ step: "done", name: "f", args: "{}" });
  });

  it("gives up before the name on shapes read whole; breaks after it", () => {
    expect(read('{"type": "function", "function": {"name": "f"}}').step).toBe("giveUp");
    expect(read('[{"name": "f"}]').step).toBe("giveUp");
    expect(read('{"plan": 1}').step).toBe("giveUp");
    expect(read('{"name": 5}').step).toBe("giveUp");
    expect(read('{"name": "f", "arguments": [1]}')).toEqual({ step: "broken", name: "f", args: "{}" });
    expect(read('{"name": "f", "arguments": {"a": "b"} oops')).toEqual({ step: "broken", name: "f", args: '{"a":"b"}' });
  });
});
