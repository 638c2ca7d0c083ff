import { it } from "vitest";
import { schemaToGbnf } from "./json-schema-gbnf.js";
import { GbnfGrammar } from "./gbnf-recognizer.js";
it("smoke", () => {
  const { grammar } = schemaToGbnf({ type: "object", properties: { a: { type: "integer", minimum: 3, maximum: 120 }, b: { type: "string", pattern: "^[a-c]+x$" }, c: {enum:["x",1,null]} }, required: ["a"] }, { param: "p" });
  console.log(grammar);
  const g = new GbnfGrammar(grammar);
  for (const s of ['{"a": 5}', '{"a":120,"b":"abx"}', '{"a": 2}', '{"a": 121}', '{"b":"ax"}', '{"a":7, "c": null}', '{"a":7,"b":"abd"}'])
    console.log(s, g.accepts("root", s));
});
