/**
 * The JSON-schema converter against a JSON-schema validator (ajv, draft 2020-12): for each sample schema, random
 * candidate values (mostly near the schema's edges) are accepted by the grammar exactly when ajv says they are
 * valid. Candidates keep properties in declaration order (the grammar fixes the order: documented inexactness).
 */
import { Ajv2020 } from "ajv/dist/2020.js";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { KeelHttpError } from "../http/errors.js";
import { GbnfGrammar } from "./gbnf-recognizer.js";
import { checkSchema, schemaToGbnf } from "./json-schema-gbnf.js";
import { integerRange } from "./number-range.js";

const ajv = new Ajv2020({ strict: false, allErrors: false });

/** Grammar recogniser for `schema` plus ajv's validator. */
function both(schema: unknown) {
  const { grammar } = schemaToGbnf(schema, { param: "response_format.json_schema.schema" });
  const g = new GbnfGrammar(grammar);
  const validate = ajv.compile(schema as object);
  return { g, validate, grammar };
}

/** Characters that exercise JSON escaping and code-point counting. */
const tricky = fc.constantFrom("a", "b", "z", "0", " ", '"', "\\", "\n", "\t", "\u0001", "é", "😀", "-", "/", "\u007f");
const str = (maxLength: number) => fc.string({ unit: tricky, maxLength });

/** Arbitrary JSON values whose numbers stay within 16 integral digits (the grammar's documented bound). */
const anyJson: fc.Arbitrary<unknown> = fc.letrec<{ v: unknown }>((tie) => ({
  v: fc.oneof(
    { depthSize: "small" },
    fc.integer(),
    fc.double({ noNaN: true, noDefaultInfinity: true, min: -1e15, max: 1e15 }),
    str(6),
    fc.boolean(),
    fc.constant(null),
    fc.array(tie("v"), { maxLength: 3 }),
    fc.dictionary(fc.string({ maxLength: 4 }).map((k) => `k${k}`), tie("v"), { maxKeys: 3 }),
  ),
})).v;

/** Checks grammar acceptance ⇔ ajv validity over `arb`, compact JSON (and indented when `indent`). */
function agree(schema: unknown, arb: fc.Arbitrary<unknown>, opts: { indent?: boolean; runs?: number } = {}) {
  const { g, validate } = both(schema);
  let valid = 0;
  let invalid = 0;
  fc.assert(
    fc.property(arb, (v) => {
      const ok = validate(v) === true;
      if (ok) valid++;
      else invalid++;
      expect(g.accepts("root", JSON.stringify(v)), JSON.stringify(v)).toBe(ok);
      if (opts.indent && ok) expect(g.accepts("root", JSON.stringify(v, null, 2)), JSON.stringify(v, null, 2)).toBe(true);
    }),
    { numRuns: opts.runs ?? 300 },
  );
  // Both outcomes must be exercised, or the property says little.
  expect(valid).toBeGreaterThan(10);
  expect(invalid).toBeGreaterThan(10);
}

describe("schema grammar ⇔ ajv", () => {
  it("object with required and optional properties, additionalProperties false", () => {
    const schema = {
      type: "object",
      properties: {
        name: { type: "string", minLength: 1, maxLength: 5 },
        age: { type: "integer", minimum: 0, maximum: 130 },
        tags: { type: "array", items: { type: "string", enum: ["a", "b", "c"] }, maxItems: 3 },
        active: { type: "boolean" },
      },
      required: ["name", "age"],
      additionalProperties: false,
    };
    // Half from the schema's own domain (valid unless the extra key is added), half from a wider one.
    const inside = fc.record(
      {
        name: fc.string({ unit: tricky, minLength: 1, maxLength: 5 }),
        age: fc.integer({ min: 0, max: 130 }),
        tags: fc.array(fc.constantFrom("a", "b", "c"), { maxLength: 3 }),
        active: fc.boolean(),
      },
      { requiredKeys: ["name", "age"] },
    );
    const wider = fc.record(
      {
        name: fc.string({ unit: tricky, maxLength: 7 }),
        age: fc.integer({ min: -5, max: 140 }),
        tags: fc.array(fc.constantFrom("a", "b", "c", "d"), { maxLength: 4 }),
        active: fc.oneof(fc.boolean(), fc.constant("yes")),
      },
      { requiredKeys: [] },
    );
    const record = fc.oneof(inside, wider);
    const arb = fc
      .tuple(record, fc.option(fc.constant(1), { freq: 6 }))
      .map(([o, extra]) => (extra === null ? o : { ...o, zzz: extra }));
    agree(schema, arb, { indent: true });
  });

  it("anyOf over integer range, short string and null", () => {
    const schema = { anyOf: [{ type: "integer", minimum: -5, maximum: 5 }, { type: "string", maxLength: 2 }, { type: "null" }] };
    agree(schema, fc.oneof(fc.integer({ min: -10, max: 10 }), str(4), fc.constant(null), fc.boolean()));
  });

  it("recursive $ref tree guarded by an object", () => {
    const schema = {
      $defs: {
        node: {
          type: "object",
          properties: { v: { type: "integer" }, kids: { type: "array", items: { $ref: "#/$defs/node" } } },
          required: ["v"],
          additionalProperties: false,
        },
      },
      $ref: "#/$defs/node",
    };
    const tree: fc.Arbitrary<unknown> = fc.letrec<{ n: unknown }>((tie) => ({
      n: fc.record(
        { v: fc.oneof(fc.integer({ min: -1000, max: 1000 }), fc.constant("x")), kids: fc.array(tie("n"), { maxLength: 2 }) },
        { requiredKeys: [] },
      ),
    })).n;
    agree(schema, tree, { indent: true });
  });

  it("self-reference through '#' in an array", () => {
    const schema = { type: "array", items: { anyOf: [{ type: "integer" }, { $ref: "#" }] } };
    const nested: fc.Arbitrary<unknown> = fc.letrec<{ a: unknown }>((tie) => ({
      a: fc.array(fc.oneof({ depthSize: "small" }, fc.integer(), fc.constant("s"), tie("a")), { maxLength: 3 }),
    })).a;
    agree(schema, nested);
  });

  it("enum and const literals", () => {
    const schema = {
      type: "object",
      properties: { u: { enum: ["x", 1, null, true, { a: [1] }] }, c: { const: "k\"q" } },
      required: ["u", "c"],
      additionalProperties: false,
    };
    const arb = fc.record(
      { u: fc.constantFrom("x", 1, null, true, { a: [1] }, "y", 2, false, { a: [2] }), c: fc.constantFrom('k"q', "k") },
      { requiredKeys: [] },
    );
    agree(schema, arb);
  });

  it("type arrays", () => {
    agree({ type: ["string", "null"], maxLength: 3 }, fc.oneof(str(5), fc.constant(null), fc.integer()));
  });

  it("integer ranges with random (exclusive) bounds", () => {
    fc.assert(
      fc.property(
        fc.bigInt({ min: -(10n ** 15n), max: 10n ** 15n }),
        fc.bigInt({ min: 0n, max: 10n ** 15n }),
        fc.boolean(),
        fc.boolean(),
        fc.array(fc.bigInt({ min: -3n, max: 3n }), { minLength: 1, maxLength: 6 }),
        (lo, width, exLo, exHi, deltas) => {
          const hi = lo + width;
          // Half the time the bounds sit half-way between integers (x ≥ 2.5 → x ≥ 3).
          const half = width % 2n === 0n ? 0.5 : 0;
          const schema = {
            type: "integer",
            ...(exLo ? { exclusiveMinimum: Number(lo) + half } : { minimum: Number(lo) + half }),
            ...(exHi ? { exclusiveMaximum: Number(hi) - half } : { maximum: Number(hi) - half }),
          };
          const first = half ? lo + 1n : exLo ? lo + 1n : lo;
          const last = half ? hi - 1n : exHi ? hi - 1n : hi;
          if (first > last) {
            expect(() => both(schema)).toThrow(/admit no value/);
            return;
          }
          const { g, validate } = both(schema);
          const probes = [lo, hi, lo + width / 2n, 0n, -1n, 1n].flatMap((p) => deltas.map((d) => p + d));
          for (const p of probes) {
            if (p > 10n ** 16n || p < -(10n ** 16n)) continue;
            expect(g.accepts("root", p.toString()), `${JSON.stringify(schema)} ${p}`).toBe(validate(Number(p)) === true);
          }
        },
      ),
      { numRuns: 150 },
    );
  });

  it("number ranges with random fractional (exclusive) bounds", () => {
    /** Decimals with up to 3 fraction digits, printed by JSON.stringify without exponent. */
    const dec = fc.tuple(fc.integer({ min: -2_000_000, max: 2_000_000 }), fc.integer({ min: 0, max: 3 })).map(([n, k]) => n / 10 ** k);
    fc.assert(
      fc.property(
        fc.option(dec),
        fc.option(dec),
        fc.boolean(),
        fc.boolean(),
        fc.array(dec, { minLength: 4, maxLength: 8 }),
        fc.array(fc.constantFrom(0, 0.001, -0.001, 0.5, -0.5, 1, -1, 0.0005), { minLength: 2, maxLength: 4 }),
        (lo, hi, exLo, exHi, probes, deltas) => {
          const schema: Record<string, unknown> = { type: "number" };
          if (lo !== null) schema[exLo ? "exclusiveMinimum" : "minimum"] = lo;
          if (hi !== null) schema[exHi ? "exclusiveMaximum" : "maximum"] = hi;
          if (lo !== null && hi !== null && (lo > hi || (lo === hi && (exLo || exHi)))) {
            expect(() => both(schema)).toThrow(/admit no value/);
            return;
          }
          const { g, validate } = both(schema);
          const near = [lo, hi, 0].filter((x): x is number => x !== null).flatMap((b) => deltas.map((d) => Number((b + d).toFixed(4))));
          for (const p of [...probes, ...near]) {
            const text = JSON.stringify(p);
            expect(g.accepts("root", text), `${JSON.stringify(schema)} ${text}`).toBe(validate(p) === true);
            // The same value with a trailing fraction zero ("2.50", "7.0") is the same number.
            const padded = text.includes(".") ? `${text}0` : `${text}.0`;
            expect(g.accepts("root", padded), `${JSON.stringify(schema)} ${padded}`).toBe(validate(p) === true);
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it("integerRange spells every integer of a small range and nothing else", () => {
    for (const [lo, hi] of [
      [0n, 0n],
      [-7n, 3n],
      [95n, 1005n],
      [-1205n, -98n],
    ] as const) {
      const g = new GbnfGrammar(`root ::= ${integerRange(lo, hi)}\n`);
      for (let x = lo - 20n; x <= hi + 20n; x++) expect(g.accepts("root", x.toString()), `${lo}..${hi}: ${x}`).toBe(x >= lo && x <= hi);
      expect(g.accepts("root", "-0")).toBe(false);
      expect(g.accepts("root", `0${hi > 0n ? hi : 1n}`)).toBe(false);
    }
  });

  it("string lengths count code points", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 4 }), fc.integer({ min: 0, max: 4 }), fc.array(str(8), { minLength: 5, maxLength: 10 }), (min, extra, samples) => {
        const { g, validate } = both({ type: "string", minLength: min, maxLength: min + extra });
        for (const s of samples) expect(g.accepts("root", JSON.stringify(s)), JSON.stringify(s)).toBe(validate(s) === true);
      }),
      { numRuns: 100 },
    );
  });

  it.each([
    ["^[a-z]{2,4}-\\d+$", fc.constantFrom("ab", "c", "-", "1", "9", "Z", "xy-1", "abcd-")],
    ["ab|cd", fc.constantFrom("a", "b", "c", "d", "x")],
    ["^(foo|bar)?baz$", fc.constantFrom("foo", "bar", "baz", "ba", "z")],
    ["^a.c$", fc.constantFrom("a", "c", "ac", "a\nc", 'a"c', "a\\c", "aéc", "a😀c", "\u2028")],
    ['^[^"\\\\]{0,3}$', fc.constantFrom("a", '"', "\\", "\n", "é")],
    ["^\\w+@\\w+\\.com$", fc.constantFrom("a_1", "@", "b@x.com", "@x.com", ".", "com", "é")],
    ["^(?:x[0-9]?)+$", fc.constantFrom("x", "1", "y")],
  ])("pattern %s matches exactly what the regex matches", (pattern, piece) => {
    const { g } = both({ type: "string", pattern });
    const re = new RegExp(pattern, "u");
    let hits = 0;
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 6 }).map((a) => a.join("")), (s) => {
        const ok = re.test(s);
        if (ok) hits++;
        expect(g.accepts("root", JSON.stringify(s)), JSON.stringify(s)).toBe(ok);
      }),
      { numRuns: 400 },
    );
    expect(hits).toBeGreaterThan(3);
  });

  it("arrays: prefixItems, items, minItems, maxItems", () => {
    const schema = { type: "array", prefixItems: [{ type: "integer" }, { type: "string" }], items: { type: "boolean" }, minItems: 1, maxItems: 4 };
    // Half shaped like the schema (int, string, booleans…), half any mix.
    const shaped = fc.tuple(fc.integer({ min: -9, max: 9 }), str(2), fc.array(fc.boolean(), { maxLength: 3 })).chain(([i, s, bs]) =>
      fc.integer({ min: 0, max: 2 + bs.length }).map((n) => [i, s, ...bs].slice(0, n)),
    );
    agree(schema, fc.oneof(shaped, fc.array(fc.oneof(fc.integer({ min: -9, max: 9 }), str(2), fc.boolean()), { maxLength: 6 })));
  });

  it("array counts without prefix", () => {
    const element = fc.oneof({ arbitrary: fc.integer(), weight: 6 }, { arbitrary: fc.constant("s"), weight: 1 });
    agree({ type: "array", items: { type: "integer" }, minItems: 2, maxItems: 3 }, fc.array(element, { maxLength: 5 }));
  });

  it("additionalProperties as a schema: extra keys of that schema after the declared ones", () => {
    const schema = { type: "object", properties: { a: { type: "integer" }, kx: { type: "integer" } }, additionalProperties: { type: "string" } };
    // Extra keys near the declared names ("kx" itself, its prefix, its extensions) probe the key exclusion.
    const key = fc.oneof(fc.constantFrom("kx", "k", "kxy", "kX", "a"), fc.string({ maxLength: 3 }).map((k) => `k${k}`));
    const arb = fc
      .tuple(fc.option(fc.integer()), fc.dictionary(key, fc.oneof(str(3), fc.integer()), { maxKeys: 3 }))
      .map(([a, rest]) => {
        const { a: _a, kx, ...others } = rest as Record<string, unknown>;
        // Declared keys first, in declaration order (the grammar's order), then the extra ones.
        return { ...(a === null ? {} : { a }), ...(kx === undefined ? {} : { kx }), ...others };
      });
    agree(schema, arb);
  });

  it("allOf merges object schemas", () => {
    const schema = {
      allOf: [
        { type: "object", properties: { a: { type: "integer" } }, required: ["a"] },
        { properties: { b: { type: "string" } }, required: ["b"] },
      ],
      additionalProperties: false,
    };
    const { g } = both(schema);
    expect(g.accepts("root", '{"a": 1, "b": "x"}')).toBe(true);
    expect(g.accepts("root", '{"a": 1}')).toBe(false);
    expect(g.accepts("root", '{"b": "x"}')).toBe(false);
  });

  it("{} and true accept any JSON value (not only objects or null)", () => {
    for (const schema of [{}, true, { description: "anything" }]) {
      const { g } = both(schema);
      fc.assert(
        fc.property(anyJson, (v) => {
          expect(g.accepts("root", JSON.stringify(v)), JSON.stringify(v)).toBe(true);
        }),
        { numRuns: 200 },
      );
    }
  });

  it("formats accept canonical values and reject others", () => {
    const cases: Array<[string, string[], string[]]> = [
      ["date", ["2026-12-01", "1999-01-31", "2024-02-29", "2000-02-29", "0000-02-29"], ["2026-13-01", "26-12-01", "2026-12-1", "2026-04-31", "2023-02-29", "1900-02-29"]],
      ["time", ["14:35:00Z", "23:59:59.123+02:00"], ["24:00:00Z", "14:35Z", "14:35:00"]],
      ["date-time", ["2026-12-01T14:35:00Z"], ["2026-12-01 14:35:00Z", "2026-12-01T14:35:00"]],
      ["uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000", "xyz"]],
      ["email", ["a.b+c@example.com", "x@a-b.io"], ["@example.com", "a@b", "a b@c.d", "a..b@x.com", "a@b-.com", ".a@x.com"]],
      ["uri", ["https://example.com/a?b=c#d", "urn:isbn:0451450523", "file:///tmp/x%20y"], ["no scheme", "://x", "a:%zz", "http://a b"]],
    ];
    for (const [format, good, bad] of cases) {
      const { g } = both({ type: "string", format });
      for (const s of good) expect(g.accepts("root", JSON.stringify(s)), `${format} ${s}`).toBe(true);
      for (const s of bad) expect(g.accepts("root", JSON.stringify(s)), `${format} ${s}`).toBe(false);
    }
  });

  it("whitespace is bounded", () => {
    const { g } = both({ type: "object", properties: { a: { type: "integer" } } });
    expect(g.accepts("root", `{\n${" ".repeat(20)}"a": 1}`)).toBe(true);
    expect(g.accepts("root", `{\n${" ".repeat(21)}"a": 1}`)).toBe(false);
    expect(g.accepts("root", '{  "a": 1}')).toBe(false);
  });
});

/** The 400 a bad schema gets: KeelHttpError, invalid_value, the caller's param, a message naming `pointer`. */
function refused(schema: unknown, pointer: string, words: RegExp) {
  let err: unknown;
  try {
    schemaToGbnf(schema, { param: "tools[2].function.parameters" });
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(KeelHttpError);
  const k = err as KeelHttpError;
  expect(k.status).toBe(400);
  expect(k.code).toBe("invalid_value");
  expect(k.param).toBe("tools[2].function.parameters");
  expect(k.message).toContain(`'${pointer}'`);
  expect(k.message).toMatch(words);
}

describe("bad schemas → 400 (recipe M2)", () => {
  it("not a schema", () => {
    refused("object", "#", /must be an object or a boolean/);
    refused(false, "#", /accepts no value/);
    refused({ type: "object", properties: { a: 5 } }, "#/properties/a", /must be an object or a boolean/);
    refused({ type: "strin" }, "#", /unknown type/);
    refused({ anyOf: [] }, "#", /non-empty array/);
    refused({ enum: [] }, "#", /non-empty array/);
    refused({ type: "array", minItems: "2" }, "#/minItems", /non-negative integer/);
    refused({ type: "string", maxLength: 2.5 }, "#/maxLength", /non-negative integer/);
  });

  it("recursive $ref without structure in between", () => {
    refused({ $ref: "#" }, "#", /refers back to itself/);
    refused({ $defs: { a: { $ref: "#/$defs/b" }, b: { anyOf: [{ type: "null" }, { $ref: "#/$defs/a" }] } }, $ref: "#/$defs/a" }, "#/$defs/b/anyOf/1", /refers back to itself/);
    refused({ $ref: "#/$defs/missing" }, "#", /does not resolve/);
    refused({ $ref: "https://example.com/s.json" }, "#", /local reference/);
  });

  it("invalid and unsupported patterns", () => {
    refused({ type: "string", pattern: "([a-z]" }, "#/pattern", /invalid regular expression/);
    refused({ type: "string", pattern: "^(?=a)b$" }, "#/pattern", /lookaround/);
    refused({ type: "string", pattern: "^(a)\\1$" }, "#/pattern", /backreferences/);
    refused({ type: "string", pattern: "\\bword" }, "#/pattern", /word boundaries/);
    refused({ type: "string", pattern: "^\\p{L}+$" }, "#/pattern", /property escapes/);
    refused({ type: "string", pattern: "^(a?)*$" }, "#/pattern", /empty string/);
  });

  it("keywords the grammar cannot honour are named", () => {
    for (const k of ["multipleOf", "not", "if", "patternProperties", "dependentRequired", "propertyNames", "contains"]) {
      refused({ type: "object", properties: { x: { type: "integer", [k]: 2 } } }, "#/properties/x", new RegExp(`'${k}'`));
    }
    refused({ type: "array", uniqueItems: true }, "#", /'uniqueItems'/);
    refused({ type: "object", properties: { a: {} }, minProperties: 1 }, "#", /'minProperties'/);
    refused({ type: "number", minimum: 1.5, exclusiveMaximum: 1.5 }, "#", /admit no value/);
    refused({ type: "string", format: "ipv4" }, "#/format", /not supported/);
    refused({ type: "object", properties: {}, required: ["a"] }, "#", /not declared/);
    refused({ type: "integer", minimum: 5, maximum: 4 }, "#", /admit no value/);
    refused({ type: "string", maxLength: 100000 }, "#", /above 1999/);
  });

  it("depth and size are capped", () => {
    let deep: unknown = { type: "integer" };
    for (let i = 0; i < 70; i++) deep = { type: "array", items: deep };
    refused(deep, "#" + "/items".repeat(65), /deeper than 64/);
    // Long text, and short text whose repetitions llama.cpp would expand into millions of rules.
    const long = { enum: Array.from({ length: 120_000 }, (_, i) => `value-number-${i}`) };
    const wide = { type: "object", properties: Object.fromEntries(Array.from({ length: 3000 }, (_, i) => [`p${i}`, { type: "string", maxLength: 1999 }])) };
    refused(long, "#", /more than 1000 enum\/const values/);
    refused(wide, "#", /exceeds/);
  });

  it("annotations and unknown keywords are ignored", () => {
    const schema = { type: "integer", title: "t", description: "d", default: 1, examples: [1], $schema: "x", $id: "y", "x-vendor": true };
    const g = new GbnfGrammar(schemaToGbnf(schema, { param: "p" }).grammar);
    expect(g.accepts("root", "12")).toBe(true);
    expect(g.accepts("root", '"12"')).toBe(false);
  });
});

describe("checkSchema (unguided tools): invalid vs unsupported", () => {
  it("throws for invalid schemas only", () => {
    for (const bad of [5, { type: "object", properties: { a: "x" } }, { type: "string", pattern: "(" }, { $ref: "#" }, { $ref: "#/nope" }, { anyOf: [] }]) {
      expect(() => checkSchema(bad, "tools[0].function.parameters"), JSON.stringify(bad)).toThrow(KeelHttpError);
    }
    for (const ok of [{ type: "integer", multipleOf: 3 }, { type: "string", format: "ipv4" }, { type: "string", pattern: "^(?=a)" }, { type: "array", uniqueItems: true }]) {
      expect(() => checkSchema(ok, "p"), JSON.stringify(ok)).not.toThrow();
      expect(() => schemaToGbnf(ok, { param: "p" }), JSON.stringify(ok)).toThrow(KeelHttpError);
    }
  });
});

describe("llama.cpp's object readings", () => {
  it("properties: {} declares none (only {}); no properties keyword means any object", () => {
    const none = new GbnfGrammar(schemaToGbnf({ type: "object", properties: {} }, { param: "p" }).grammar);
    expect(none.accepts("root", "{}")).toBe(true);
    expect(none.accepts("root", '{"x": 1}')).toBe(false);
    const any = new GbnfGrammar(schemaToGbnf({ type: "object" }, { param: "p" }).grammar);
    expect(any.accepts("root", '{"x": [1, {"y": null}]}')).toBe(true);
    const declaredOnly = new GbnfGrammar(schemaToGbnf({ type: "object", properties: { a: { type: "integer" } } }, { param: "p" }).grammar);
    expect(declaredOnly.accepts("root", '{"a": 1}')).toBe(true);
    expect(declaredOnly.accepts("root", '{"a": 1, "b": 2}')).toBe(false);
  });
});

it("enum/const next to another constraint is refused rather than half-applied", () => {
  refused({ enum: ["a", "bb"], minLength: 2 }, "#", /'enum' together with 'minLength'/);
  refused({ const: "a", anyOf: [{ type: "string" }] }, "#", /'const' together with 'anyOf'/);
  const g = new GbnfGrammar(schemaToGbnf({ type: "string", enum: ["a", "b"], title: "t", description: "d" }, { param: "p" }).grammar);
  expect(g.accepts("root", '"a"')).toBe(true);
  expect(g.accepts("root", '"c"')).toBe(false);
});

it("a schema with no finite value (required self-recursion) is refused; optional recursion is fine", () => {
  refused({ type: "object", properties: { a: { $ref: "#" } }, required: ["a"] }, "#", /no finite value/);
  refused({ $defs: { n: { type: "object", properties: { next: { $ref: "#/$defs/n" } }, required: ["next"] } }, $ref: "#/$defs/n" }, "#", /no finite value/);
  refused({ type: "array", items: { $ref: "#" }, minItems: 1 }, "#", /no finite value/);
  // Found by the soundness test: the recursion is required through a name declared in another allOf part.
  refused({ allOf: [{ type: "object", properties: { a: { $ref: "#" } } }, { type: "object", required: ["a"] }] }, "#", /no finite value/);
  const ok = [
    { type: "array", items: { $ref: "#" } },
    { anyOf: [{ type: "null" }, { type: "object", properties: { a: { $ref: "#" } }, required: ["a"] }] },
    { type: "object", properties: { a: { $ref: "#" } } },
  ];
  for (const schema of ok) {
    const g = new GbnfGrammar(schemaToGbnf(schema, { param: "p" }).grammar);
    expect(g.accepts("root", schema.type === "array" ? "[[], [[]]]" : schema.anyOf ? '{"a": {"a": null}}' : '{"a": {}}'), JSON.stringify(schema)).toBe(true);
  }
});

it("keywords next to anyOf apply to every alternative (types meet, conflicts refused)", () => {
  const onlyInts = both({ type: "number", anyOf: [{ type: "integer" }, { type: "string" }] });
  expect(onlyInts.g.accepts("root", "3")).toBe(true);
  expect(onlyInts.g.accepts("root", "3.5")).toBe(false);
  expect(onlyInts.g.accepts("root", '"s"')).toBe(false);
  const merged = both({ type: "object", properties: { a: { type: "integer" } }, required: ["a"], anyOf: [{ properties: { b: { type: "string" } }, required: ["b"] }, {}] });
  expect(merged.g.accepts("root", '{"a": 1, "b": "x"}')).toBe(true);
  expect(merged.g.accepts("root", '{"b": "x"}')).toBe(false);
  expect(() => both({ type: "string", anyOf: [{ type: "integer" }] })).toThrow(/no 'anyOf' alternative/);
  expect(() => both({ type: "string", pattern: "^a", anyOf: [{ pattern: "b$" }] })).toThrow(/'pattern' both next to/);
});

it("under length limits an astral character counts once: raw only, never as an escaped surrogate pair", () => {
  const g = new GbnfGrammar(schemaToGbnf({ type: "string", minLength: 2, maxLength: 2 }, { param: "p" }).grammar);
  expect(g.accepts("root", '"a😀"')).toBe(true);
  expect(g.accepts("root", '"a\\u00e9"')).toBe(true);
  expect(g.accepts("root", '"a\\ud83d\\ude00"')).toBe(false);
  expect(g.accepts("root", '"\\ud83d\\ude00"')).toBe(false);
});

it("optional parts with no finite value are left out, so every path the model enters can finish", () => {
  const loop = { type: "array", items: { $ref: "#/$defs/x" }, minItems: 1 };
  const schema = {
    $defs: { x: loop },
    type: "object",
    properties: { ok: { type: "integer" }, never: { $ref: "#/$defs/x" } },
    additionalProperties: { $ref: "#/$defs/x" },
  };
  const g = new GbnfGrammar(schemaToGbnf(schema, { param: "p" }).grammar);
  expect(g.accepts("root", '{"ok": 1}')).toBe(true);
  expect(g.accepts("root", "{}")).toBe(true);
  // No rule may be unfinishable: the grammar has no path into the loop.
  const text = schemaToGbnf(schema, { param: "p" }).grammar;
  expect(text).not.toMatch(/never/);
  expect(text).not.toMatch(/extra-kv/);
  const arr = new GbnfGrammar(schemaToGbnf({ $defs: { x: loop }, type: "array", prefixItems: [{ type: "integer" }, { $ref: "#/$defs/x" }] }, { param: "p" }).grammar);
  expect(arr.accepts("root", "[1]")).toBe(true);
  expect(arr.accepts("root", "[]")).toBe(true);
  const alt = new GbnfGrammar(schemaToGbnf({ $defs: { x: loop }, anyOf: [{ $ref: "#/$defs/x" }, { type: "null" }] }, { param: "p" }).grammar);
  expect(alt.accepts("root", "null")).toBe(true);
});
