/**
 * A validator compiled from the protocol's JSON Schema subset (json-schema.ts `SCHEMA_KEYWORDS`) into one generated
 * JavaScript function, once: the gateway checks every engine frame with it, a step of 64 outputs in a few microseconds, where zod
 * (which copies what it parses) takes ten times longer. It checks and never copies or transforms; it allocates only
 * to describe a failure. The Python worker interprets the same document with the same semantics (messages.py):
 * string lengths count code points, "integer" is a number without a fraction, `oneOf` branches must be
 * disjoint (they are: discriminated by a constant property), and named checks run once an object's shape is valid.
 */
import { CHECKS, CHECKS_KEYWORD, type CheckIssue, type CheckName } from "./checks.js";
import { SCHEMA_KEYWORDS, type JsonSchema } from "./json-schema.js";

/** Why a value failed: where (property names and indices from the validated root) and the rule it broke. */
export interface SchemaFailure {
  path: (string | number)[];
  message: string;
}

/** A compiled validator: null when the value is valid. */
export type Validator = (value: unknown) => SchemaFailure | null;

const KNOWN = new Set<string>(SCHEMA_KEYWORDS);

/** Builds the failure of a generated validator (passed to it as `F`). */
const failure = (path: (string | number)[], message: string): SchemaFailure => ({ path, message });

/** Code points of a string (a lone surrogate counts as one), as zod and JSON Schema measure string lengths. */
function codePoints(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length - 1; i++) {
    if ((s.charCodeAt(i) & 0xfc00) === 0xd800 && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n -= 1;
      i += 1;
    }
  }
  return n;
}

/** Property names a branch declares, through nested unions. */
function keysOf(s: JsonSchema): string[] {
  const own = Object.keys((s["properties"] as object | undefined) ?? {});
  const branches = ((s["anyOf"] ?? s["oneOf"]) as JsonSchema[] | undefined) ?? [];
  return [...own, ...branches.flatMap(keysOf)];
}

/** The constant a branch requires at property `key` (through nested unions whose branches all agree), or undefined. */
function constAt(s: JsonSchema, key: string): unknown {
  const prop = (s["properties"] as Record<string, JsonSchema> | undefined)?.[key];
  if (prop && "const" in prop && (s["required"] as string[] | undefined)?.includes(key)) return prop["const"];
  const branches = (s["anyOf"] ?? s["oneOf"]) as JsonSchema[] | undefined;
  if (!branches) return undefined;
  const values = new Set(branches.map((b) => constAt(b, key)));
  return values.size === 1 && !values.has(undefined) ? [...values][0] : undefined;
}

/** A union's discriminator: a property every branch pins to a different constant (so at most one branch can match). */
function discriminator(branches: JsonSchema[]): { key: string; values: unknown[] } | null {
  for (const key of new Set(branches.flatMap(keysOf))) {
    const values = branches.map((b) => constAt(b, key));
    if (new Set(values).size === branches.length && !values.includes(undefined)) return { key, values };
  }
  return null;
}

/** JavaScript test that `v` has JSON Schema type `t`. */
const TYPE_TESTS: Record<string, (v: string) => string> = {
  object: (v) => `(typeof ${v} === "object" && ${v} !== null && !Array.isArray(${v}))`,
  array: (v) => `Array.isArray(${v})`,
  string: (v) => `typeof ${v} === "string"`,
  number: (v) => `(typeof ${v} === "number" && isFinite(${v}))`,
  integer: (v) => `Number.isInteger(${v})`,
  boolean: (v) => `typeof ${v} === "boolean"`,
  null: (v) => `${v} === null`,
};

const article = (t: string): string => (t === "null" ? "null" : t === "integer" || t === "object" || t === "array" ? `an ${t}` : `a ${t}`);

/**
 * Generates the source of one validator function: straight-line tests with the schema's constants inlined, a loop
 * per array, a `switch` per discriminated union, a nested function per other union branch.
 */
class CodeGen {
  /** Values the generated code refers to as `K[i]`: regular expressions, key sets, named checks. */
  readonly refs: unknown[] = [];
  /** Nested functions (union branches), emitted before the validator. */
  readonly functions: string[] = [];
  private counter = 0;

  fresh(prefix: string): string {
    return `${prefix}${this.counter++}`;
  }

  ref(value: unknown): string {
    this.refs.push(value);
    return `K[${this.refs.length - 1}]`;
  }

  /** `return F(path, message)` for the path (a list of JavaScript expressions) and message. */
  private fail(path: string[], message: string): string {
    return `return F([${path.join(", ")}], ${JSON.stringify(message)});`;
  }

  /** A nested function validating its argument against `s`; returns its name. */
  fn(s: JsonSchema): string {
    const name = this.fresh("u");
    const body = this.node(s, "v", []);
    this.functions.push(`function ${name}(v) {\n${body}\nreturn null;\n}`);
    return name;
  }

  /** Statements that return a failure when `v` (an identifier) breaks `s`; `path` locates `v`. */
  node(s: JsonSchema, v: string, path: string[]): string {
    for (const k of Object.keys(s)) if (!KNOWN.has(k)) throw new Error(`protocol schema keyword ${k} is not supported`);
    const out: string[] = [];
    // 1. Type first: every other keyword assumes it.
    const type = s["type"] as string | string[] | undefined;
    const types = type === undefined ? [] : typeof type === "string" ? [type] : type;
    if (types.length > 0) {
      const tests = types.map((t) => {
        const test = TYPE_TESTS[t];
        if (!test) throw new Error(`protocol schema type ${t} is not supported`);
        return test(v);
      });
      out.push(`if (!(${tests.join(" || ")})) ${this.fail(path, `must be ${types.map(article).join(" or ")}`)}`);
    }
    if ("const" in s) out.push(`if (${v} !== ${JSON.stringify(s["const"])}) ${this.fail(path, `must be ${JSON.stringify(s["const"])}`)}`);
    if (s["enum"] !== undefined) {
      const values = s["enum"] as unknown[];
      out.push(`if (${values.map((x) => `${v} !== ${JSON.stringify(x)}`).join(" && ")}) ${this.fail(path, `must be one of ${values.map((x) => JSON.stringify(x)).join(", ")}`)}`);
    }
    // 2. Numbers and strings (the generator always states the type beside a bound).
    const bounds = [["minimum", ">="], ["maximum", "<="], ["exclusiveMinimum", ">"], ["exclusiveMaximum", "<"]] as const;
    for (const [key, op] of bounds) {
      const b = s[key];
      if (b === undefined) continue;
      if (!types.every((t) => t === "number" || t === "integer" || t === "null") || types.length === 0) throw new Error(`protocol schema ${key} without a numeric type`);
      const guard = types.includes("null") ? `${v} !== null && ` : "";
      out.push(`if (${guard}!(${v} ${op} ${Number(b)})) ${this.fail(path, `must be ${op} ${Number(b)}`)}`);
    }
    const lengths = [["minLength", ">=", "at least", "characters"], ["maxLength", "<=", "at most", "characters"], ["minItems", ">=", "at least", "items"], ["maxItems", "<=", "at most", "items"]] as const;
    for (const [key, op, says, unit] of lengths) {
      const b = s[key];
      if (b === undefined) continue;
      if (types.length !== 1) throw new Error(`protocol schema ${key} without a single type`);
      // A string's length is its code points (JSON Schema's and zod's measure); count them only when UTF-16 units leave it in doubt.
      const measured = unit === "characters" ? op === ">=" ? `(${v}.length < ${Number(b)} || ${v}.length >= ${Number(b) * 2} ? ${v}.length : ${this.ref(codePoints)}(${v}))` : `(${v}.length <= ${Number(b)} || ${v}.length > ${Number(b) * 2} ? ${v}.length : ${this.ref(codePoints)}(${v}))` : `${v}.length`;
      out.push(`if (!(${measured} ${op} ${Number(b)})) ${this.fail(path, `must have ${says} ${Number(b)} ${unit}`)}`);
    }
    if (s["pattern"] !== undefined) {
      const re = new RegExp(s["pattern"] as string);
      if (types.length !== 1) throw new Error("protocol schema pattern without a single type");
      out.push(`if (!${this.ref(re)}.test(${v})) ${this.fail(path, `must match ${re.source}`)}`);
    }
    // 3. Arrays: positional items, then the rest.
    const prefix = (s["prefixItems"] as JsonSchema[] | undefined) ?? [];
    prefix.forEach((p, j) => {
      const e = this.fresh("e");
      out.push(`if (${v}.length > ${j}) { const ${e} = ${v}[${j}];\n${this.node(p, e, [...path, String(j)])}\n}`);
    });
    const items = s["items"] as JsonSchema | false | undefined;
    if (items === false) out.push(`if (${v}.length > ${prefix.length}) ${this.fail(path, `must have at most ${prefix.length} items`)}`);
    else if (items !== undefined) {
      const i = this.fresh("i");
      const e = this.fresh("e");
      out.push(`for (let ${i} = ${prefix.length}; ${i} < ${v}.length; ${i}++) { const ${e} = ${v}[${i}];\n${this.node(items, e, [...path, i])}\n}`);
    }
    // 4. Objects: declared properties, then undeclared ones.
    const properties = (s["properties"] as Record<string, JsonSchema> | undefined) ?? {};
    const required = new Set((s["required"] as string[] | undefined) ?? []);
    for (const [k, p] of Object.entries(properties)) {
      const x = this.fresh("p");
      const key = JSON.stringify(k);
      const missing = required.has(k) ? this.fail([...path, key], "is required") : "";
      out.push(`{ const ${x} = ${v}[${key}];\nif (${x} === undefined) { ${missing} } else {\n${this.node(p, x, [...path, key])}\n} }`);
    }
    for (const k of required) if (!(k in properties)) out.push(`if (${v}[${JSON.stringify(k)}] === undefined) ${this.fail([...path, JSON.stringify(k)], "is required")}`);
    const additional = s["additionalProperties"] as JsonSchema | false | undefined;
    if (additional !== undefined && (additional === false || Object.keys(additional).length > 0)) {
      const declared = this.ref(new Set(Object.keys(properties)));
      const k = this.fresh("k");
      const check = additional === false ? this.fail([...path, k], "is not a known field") : `{ const r = ${this.fn(additional)}(${v}[${k}]); if (r !== null) return F([${[...path, k].join(", ")}, ...r.path], r.message); }`;
      out.push(`for (const ${k} in ${v}) if (!${declared}.has(${k})) ${check}`);
    }
    // `propertyNames` of a JSON object are strings by construction; only that form is generated.
    const names = s["propertyNames"] as JsonSchema | undefined;
    if (names !== undefined && !(Object.keys(names).length === 1 && names["type"] === "string")) throw new Error("protocol schema propertyNames other than {type: string} is not supported");
    // 5. Unions.
    for (const key of ["anyOf", "oneOf"] as const) if (s[key] !== undefined) out.push(this.union(s[key] as JsonSchema[], key === "oneOf", v, path));
    // 6. Named cross-field checks, once the shape is valid.
    for (const name of (s[CHECKS_KEYWORD] as string[] | undefined) ?? []) {
      const check = CHECKS[name as CheckName] as ((x: unknown) => CheckIssue | null) | undefined;
      if (!check) throw new Error(`protocol schema check ${name} is not implemented`);
      const c = this.fresh("c");
      out.push(`{ const ${c} = ${this.ref(check)}(${v}); if (${c} !== null) return F([${[...path, `...${c}.path`].join(", ")}], ${c}.message); }`);
    }
    return out.join("\n");
  }

  private union(branches: JsonSchema[], exactlyOne: boolean, v: string, path: string[]): string {
    const tag = discriminator(branches);
    if (tag) {
      const key = JSON.stringify(tag.key);
      const cases = branches.map((b, i) => `case ${JSON.stringify(tag.values[i])}: {\n${this.node(b, v, path)}\nbreak; }`);
      const expected = `must be one of ${tag.values.map((x) => JSON.stringify(x)).join(", ")}`;
      return `switch (typeof ${v} === "object" && ${v} !== null ? ${v}[${key}] : undefined) {\n${cases.join("\n")}\ndefault: ${this.fail([...path, key], expected)}\n}`;
    }
    const fns = branches.map((b) => this.fn(b));
    const r = this.fresh("r");
    const first = `return F([${path.join(", ")}], "matches no alternative (first: " + [${r}[0].path.join("."), ${r}[0].message].filter((x) => x !== "").join(" ") + ")");`;
    if (!exactlyOne) return `{ const ${r} = [${fns[0]}(${v})]; if (${r}[0] !== null${fns.slice(1).map((f) => ` && ${f}(${v}) !== null`).join("")}) ${first} }`;
    return `{ const ${r} = [${fns.map((f) => `${f}(${v})`).join(", ")}].filter((x) => x !== null); const matched = ${fns.length} - ${r}.length; if (matched > 1) ${this.fail(path, "matches more than one alternative")} if (matched === 0) ${first} }`;
  }
}

/** Compile a schema into a validator. @throws Error on a keyword outside the subset (the generator changed: update both validators). */
export function compile(s: JsonSchema): Validator {
  const gen = new CodeGen();
  const body = gen.node(s, "v", []);
  const source = `${gen.functions.join("\n")}\nreturn function validate(v) {\n${body}\nreturn null;\n};`;
  // The source is generated from the protocol's own schema, never from input.
  return new Function("K", "F", source)(gen.refs, failure) as Validator;
}

/** The failure as one line: `outputs.3.tokens.0 must be an integer`. */
export function describeFailure(f: SchemaFailure): string {
  return [f.path.join("."), f.message].filter((p) => p !== "").join(" ");
}
