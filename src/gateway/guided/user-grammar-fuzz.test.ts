/**
 * Whatever GBNF a client sends (`grammar`, `structured_outputs.grammar`), Keel answers with a grammar llama.cpp's own
 * parser takes or with a KeelHttpError 400 naming the field — never another exception (a 500) and never a grammar the
 * engine would refuse. Grammars come from a generator of GBNF-like texts (undefined and recursive references, odd
 * escapes, nullable repetitions, empty classes), some with random characters spliced in; a regex and a choice list
 * get the same treatment.
 */
import fc from "fast-check";
import { getLlama, type Llama } from "node-llama-cpp";
import { beforeAll, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import type { ResponseFormat } from "../tools.js";
import { GbnfGrammar } from "./gbnf-recognizer.js";
import { buildGuide } from "./guide.js";

let llama: Llama;
beforeAll(async () => {
  llama = await getLlama({ gpu: false, build: "never" });
});

const name = fc.constantFrom("root", "a", "b-2", "c");
const item: fc.Arbitrary<string> = fc.letrec<{ item: string }>((tie) => ({
  item: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    { arbitrary: fc.constantFrom('"x"', '"yz"', '"\\n\\t\\"\\\\"', '"\\x41\\u00e9"', "[a-z]", "[^a]", "[\\x00-\\U0010FFFF]", "."), weight: 40 },
    { arbitrary: fc.constantFrom('""', '"\\q"', "[]", "[z-a]", "[^\\x00-\\U0010FFFF]", "<tok>", "undefined-rule"), weight: 1 },
    { arbitrary: name, weight: 12 },
    { arbitrary: fc.tuple(fc.array(fc.array(tie("item"), { minLength: 0, maxLength: 3 }), { minLength: 1, maxLength: 3 })).map(([alts]) => `(${alts.map((s) => s.join(" ")).join(" | ")})`), weight: 8 },
    { arbitrary: fc.tuple(tie("item"), fc.oneof({ arbitrary: fc.constantFrom("*", "+", "?", "{2}", "{0,3}", "{1,}"), weight: 20 }, { arbitrary: fc.constantFrom("{3,1}", "{0,2500}"), weight: 1 })).map(([i, q]) => `${i}${q}`), weight: 8 },
  ),
})).item;
// An empty alternative is written `""` (a bare trailing `|` would continue the rule on the next line, in llama.cpp too).
const body = fc.array(fc.array(item, { maxLength: 4 }), { minLength: 1, maxLength: 3 }).map((alts) => alts.map((s) => (s.length === 0 ? '""' : s.join(" "))).join(" | "));
/** One rule per name (in a random order, sometimes one dropped), so references mostly resolve. */
const rules = fc
  .tuple(fc.shuffledSubarray(["root", "a", "b-2", "c"], { minLength: 3 }), fc.array(body, { minLength: 5, maxLength: 5 }))
  .map(([names, bodies]) => names.map((n, i) => `${n} ::= ${bodies[i]}`));
const text = fc
  .tuple(rules, fc.option(fc.tuple(fc.nat(), fc.string({ maxLength: 3 })), { freq: 4 }))
  .map(([rs, splice]) => {
    const t = rs.join("\n") + "\n";
    if (splice === null) return t;
    const at = splice[0] % (t.length + 1);
    return t.slice(0, at) + splice[1] + t.slice(at);
  });

/** The guide of `rf`, or the 400 (anything else fails the property). */
function guideOrRefusal(rf: ResponseFormat): ReturnType<typeof buildGuide> | KeelHttpError {
  try {
    return buildGuide({ toolParser: null, tools: [], toolChoice: { kind: "none" }, parallelToolCalls: true, responseFormat: rf, guideAuto: false, reasoning: null });
  } catch (e) {
    if (!(e instanceof KeelHttpError)) throw e;
    return e;
  }
}

it("a client's grammar: llama.cpp parses what Keel writes, or a 400 naming the field", async () => {
  let accepted = 0;
  let refused = 0;
  await fc.assert(
    fc.asyncProperty(text, async (grammar) => {
      const g = guideOrRefusal({ kind: "grammar", grammar, field: "grammar" });
      if (g instanceof KeelHttpError) {
        expect({ status: g.status, param: g.param }).toEqual({ status: 400, param: "grammar" });
        refused++;
        return;
      }
      accepted++;
      const root = (g!.start as { rule: string }).rule;
      new GbnfGrammar(g!.grammar); // Keel's own recogniser reads it too (no undefined rule, no duplicate)
      await llama.createGrammar({ grammar: g!.grammar, rootRuleName: root });
    }),
    { numRuns: 300, seed: 20 },
  );
  // The generator reaches both outcomes (a property that only ever refuses would prove nothing).
  expect(accepted).toBeGreaterThan(30);
  expect(refused).toBeGreaterThan(30);
}, 120_000);

it("a regex or a choice list: llama.cpp parses what Keel writes, or a 400 naming the field", async () => {
  let acceptedRegexes = 0;
  const regex = fc.stringMatching(/^[\^$a-c.()|*+?{}\[\]\\0-9,dws-]{0,12}$/);
  await fc.assert(
    fc.asyncProperty(regex, fc.array(fc.string({ maxLength: 6 }), { minLength: 1, maxLength: 4 }), async (pattern, choices) => {
      for (const rf of [{ kind: "regex", pattern, field: "guided_regex" }, { kind: "choice", choices, field: "guided_choice" }] as const) {
        const g = guideOrRefusal(rf);
        if (g instanceof KeelHttpError) {
          expect({ status: g.status, param: g.param }).toEqual({ status: 400, param: rf.field });
          continue;
        }
        if (rf.kind === "regex") acceptedRegexes++;
        await llama.createGrammar({ grammar: g!.grammar, rootRuleName: (g!.start as { rule: string }).rule });
      }
    }),
    { numRuns: 200, seed: 21 },
  );
  expect(acceptedRegexes).toBeGreaterThan(20);
}, 120_000);
