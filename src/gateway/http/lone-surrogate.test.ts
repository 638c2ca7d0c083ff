import { describe, expect, it } from "vitest";
import { loneSurrogateMessage, loneSurrogatePath } from "./lone-surrogate.js";

describe("lone surrogates in a parsed body", () => {
  it("the path of the first string or key holding one; pairs and other text pass", () => {
    expect(loneSurrogatePath({ messages: [{ role: "user", content: "😀 é \ud83d\ude00" }], stop: ["x"] })).toBeNull();
    expect(loneSurrogatePath({ messages: [{ role: "user", content: "ok" }, { role: "user", content: "a\ud800" }] })).toBe("messages[1].content");
    expect(loneSurrogatePath({ stop: ["a", "\udc00b"] })).toBe("stop[1]");
    expect(loneSurrogatePath({ tools: [{ function: { parameters: { properties: { "\ud800": {} } } } }] })).toBe("tools[0].function.parameters.properties.\ud800");
    expect(loneSurrogatePath("\ud800")).toBe("");
    expect(loneSurrogatePath([1, null, true, { a: 2 }])).toBeNull();
    // A high surrogate at the end, and a low one first: both lone.
    expect(loneSurrogatePath({ a: "x\ud83d" })).toBe("a");
    expect(loneSurrogatePath({ a: "\ude00x" })).toBe("a");
  });

  it("the message names the field and what to send instead", () => {
    expect(loneSurrogateMessage("messages[0].content")).toMatch(/^Invalid value for 'messages\[0\]\.content': it holds a lone UTF-16 surrogate .*send the character itself or its full surrogate pair\.$/);
    expect(loneSurrogateMessage("")).toContain("Invalid value for the body:");
  });
});
