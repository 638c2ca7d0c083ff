import { describe, expect, it } from "vitest";
import { CHECKS, CHECKS_KEYWORD } from "./checks.js";
import { protocolJsonSchema, protocolJsonSchemaText, SCHEMA_KEYWORDS, type JsonSchema } from "./json-schema.js";

/** Every keyword used anywhere in a schema node (property names of `properties` are not keywords). */
function keywords(node: unknown, into = new Set<string>()): Set<string> {
  if (Array.isArray(node)) for (const x of node) keywords(x, into);
  else if (typeof node === "object" && node !== null) {
    for (const [k, v] of Object.entries(node)) {
      into.add(k);
      if (k === "properties") for (const p of Object.values(v as object)) keywords(p, into);
      else if (k !== "const" && k !== "enum" && k !== "required" && k !== CHECKS_KEYWORD) keywords(v, into);
    }
  }
  return into;
}

describe("protocol.schema.json", () => {
  it("is the schema generated from the zod schemas (stale: run `npx vitest run src/protocol/json-schema.test.ts -u`)", async () => {
    await expect(protocolJsonSchemaText()).toMatchFileSnapshot("./protocol.schema.json");
  });

  it("uses only the keywords every validator of it implements, and only named checks that exist", () => {
    const defs = protocolJsonSchema().$defs;
    const used = keywords(Object.values(defs));
    expect([...used].filter((k) => !(SCHEMA_KEYWORDS as readonly string[]).includes(k))).toEqual([]);
    const named: string[] = [];
    const collect = (n: unknown): void => {
      if (Array.isArray(n)) n.forEach(collect);
      else if (typeof n === "object" && n !== null) for (const [k, v] of Object.entries(n as JsonSchema)) k === CHECKS_KEYWORD ? named.push(...(v as string[])) : collect(v);
    };
    collect(defs);
    expect(new Set(named)).toEqual(new Set(Object.keys(CHECKS)));
  });
});
