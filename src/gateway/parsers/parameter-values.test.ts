import { describe, expect, it } from "vitest";
import { typedValue } from "./parameter-values.js";
import { StreamedParameter } from "./streamed-parameter.js";

describe("qwen3coder parameter values", () => {
  it.each([
    ["string stays text, one newline trimmed each end", "\n\n 42 \n\n", { type: "string" }, "\n 42 \n"],
    ["quoted string keeps its quotes (OVMS)", '"x"', { type: "string" }, '"x"'],
    ["nullable string: null", "null", { type: ["string", "null"] }, null],
    ["integer", "\n7\n", { type: "integer" }, 7],
    ["number", "2.5", { type: "number" }, 2.5],
    ["boolean, Python spelling", "True", { type: "boolean" }, true],
    ["boolean, upper case", "FALSE", { type: "boolean" }, false],
    ["null, Python spelling", "None", { type: "null" }, null],
    ["object", '{"a": [1, "b"]}', { type: "object" }, { a: [1, "b"] }],
    ["array", "[1, 2]", { type: "array" }, [1, 2]],
    ["anyOf with a string branch stays text", "12", { anyOf: [{ type: "string" }, { type: "integer" }] }, "12"],
    ["unparseable integer stays text", "three", { type: "integer" }, "three"],
    ["no schema: JSON", "[true]", undefined, [true]],
    ["no schema: otherwise text", "Paris, France", undefined, "Paris, France"],
  ])("%s", (_label, raw, schema, want) => {
    expect(typedValue(raw, schema)).toEqual(want);
  });

  it("members keep parameter order, and __proto__ is an ordinary key", () => {
    const members = [
      ["b", { type: "integer" }, "1"],
      ["__proto__", undefined, '{"polluted": true}'],
      ["a", { type: "string" }, "x"],
    ] as const;
    const json = "{" + members.map(([name, schema, raw], i) => {
      const p = new StreamedParameter(name, schema, i === 0);
      return p.push(raw) + p.end();
    }).join("") + "}";
    expect(json).toBe('{"b":1,"__proto__":{"polluted":true},"a":"x"}');
    expect(JSON.parse(json)).toHaveProperty("a", "x");
    expect(({} as Record<string, unknown>)["polluted"]).toBeUndefined();
  });

  it("a nullable string waits while it could still be null; a string streams without its final line break", () => {
    const nullable = new StreamedParameter("n", { type: ["string", "null"] }, true);
    expect([nullable.push("\nnu"), nullable.push("ll\n"), nullable.end()]).toEqual(["", "", '"n":null']);
    const text = new StreamedParameter("s", { type: "string" }, false);
    expect([text.push("\nnu"), text.push("ts\n"), text.push("\n"), text.end()]).toEqual([',"s":"nu', "ts", "\\n", '"']);
  });
});
