/**
 * JSON schema → GBNF with llama.cpp's semantics, written for Keel (no upstream code).
 *
 * One {@link GbnfBuilder} collects the rules of many schemas (each under its own name prefix) plus shared
 * primitives emitted once, so a request's tools share one GBNF text. Values are emitted WITHOUT trailing
 * whitespace; containers put the bounded `space` rule between tokens.
 *
 * Semantics (what a value must look like):
 * - objects: declared properties in declaration order, required ones mandatory, optional ones skippable;
 *   `additionalProperties` false/absent → declared only; a schema → extra keys (any name) of that schema after the
 *   declared ones; an object schema without `properties` (and additionalProperties absent/true) → any object.
 * - anyOf/oneOf → alternatives (oneOf's exclusivity is not enforced); allOf → merged object schemas, else refused.
 * - `$ref` to any JSON pointer inside the schema (`#`, `#/$defs/…`, `#/definitions/…`); a cycle of refs with no
 *   object/array in between is refused (it would be left recursion).
 * - enum/const → the JSON literals (compact `JSON.stringify` form); type arrays → alternatives per type.
 * - integer: at most 16 digits, no exponent; minimum/maximum (and exclusive forms) as digit-range rules.
 * - number: JSON number (at most 16 integral digits); with bounds (fractional too), written without exponent and
 *   compared decimally (number-range.ts).
 * - string: minLength/maxLength (code points: astral characters raw, never as escaped surrogate pairs),
 *   `format` (date, time, date-time, uuid, email, uri; others refused), `pattern` (subset, see pattern-gbnf.ts;
 *   not combined with lengths/format).
 * - arrays: items/prefixItems (and draft-7 tuple `items` + additionalItems), minItems/maxItems.
 * - `{}`/`true` → any JSON value; `false` → refused. Annotations and unknown keywords are ignored (they do not
 *   constrain, per JSON Schema); constraining keywords we cannot honour → 400 naming the keyword.
 *
 * Inexact (the grammar accepts a subset of what a validator accepts, never more, except where noted): property
 * order is fixed; `additionalProperties` absent next to `properties` means no extra keys (llama.cpp's reading;
 * a validator allows them); JSON written with non-canonical escapes (`\u0061`) inside patterns/formats/enums; numbers with
 * more than 16 integral digits; extra keys of an
 * `additionalProperties` schema never repeat a declared name, except when a declared name needs JSON escapes
 * (then any key: more); oneOf may match several branches (more).
 */
import { invalidValue, type KeelHttpError } from "../http/errors.js";
import { charSet, jsonCharOf, literal, negate } from "./gbnf-text.js";
import { FORMATS } from "./formats-gbnf.js";
import { type Bound, integerRange, numberRange } from "./number-range.js";
import { MAX_REPEAT, PatternError, patternToGbnf, type CharMode, RAW_ANY } from "./pattern-gbnf.js";
import { bodyProblem } from "./gbnf-limits.js";
import { checkSchemaLimits, newTotals, type SchemaTotals } from "./schema-limits.js";

/** Deepest schema nesting we convert. */
export const MAX_SCHEMA_DEPTH = 64;
/**
 * Largest GBNF text one builder (one request) may produce, in characters with repetitions counted expanded: it
 * bounds llama.cpp's per-step grammar cost. 50 tools of 5 parameters (bench/guided.mjs's set) count 64–74 K in
 * every call format (57.6 K characters of text), so 256 K leaves a 3.5× margin.
 */
export const MAX_GBNF_CHARS = 256 * 1024;
/** Largest integral part of an integer/number, in digits (llama.cpp's bound). */
const MAX_DIGITS = 16;

/** Shared primitive rules: name → body. Emitted once per builder, on first use (with their dependencies). */
const PRIMITIVES: Readonly<Record<string, string>> = {
  space: '| " " | "\\n" [ \\t]{0,20}',
  "json-char": '[^"\\\\\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
  // One code point exactly (for length limits): no `\uD800`–`\uDFFF` escapes, so an astral character is written
  // raw and never as an escaped surrogate pair that would count twice.
  "json-char-cp": '[^"\\\\\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))',
  "json-string": '"\\"" json-char* "\\""',
  "json-int": '"-"? ([0-9] | [1-9] [0-9]{0,15})',
  "json-number": 'json-int ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})?',
  "json-bool": '"true" | "false"',
  "json-null": '"null"',
  "json-value": "json-object | json-array | json-string | json-number | json-bool | json-null",
  "json-member": 'json-string space ":" space json-value',
  "json-object": '"{" space (json-member space ("," space json-member space)*)? "}"',
  "json-array": '"[" space (json-value space ("," space json-value space)*)? "]"',
  // Raw text (a qwen3coder parameter value) that never contains "\n</parameter>": an automaton whose state counts
  // how much of that terminator has just been seen; the full terminator has no transition.
  "raw-text": "raw-s0",
};
/** Dependencies of primitives (emitting a primitive emits these too). */
const PRIMITIVE_DEPS: Readonly<Record<string, readonly string[]>> = {
  "json-string": ["json-char"],
  "json-number": ["json-int"],
  "json-value": ["json-object", "json-array", "json-string", "json-number", "json-bool", "json-null"],
  "json-member": ["json-string", "space", "json-value"],
  "json-object": ["space", "json-member"],
  "json-array": ["space", "json-value"],
};

/** The terminator a raw parameter value must not contain. */
const RAW_TERMINATOR = "\n</parameter>";

/** Rules of the raw-text automaton (see PRIMITIVES["raw-text"]). */
function rawTextRules(): Array<[string, string]> {
  const t = Array.from(RAW_TERMINATOR);
  const rules: Array<[string, string]> = [];
  // s0: nothing of the terminator seen.
  rules.push(["raw-s0", '[^\\n] raw-s0 | "\\n" raw-s1 | ""']);
  for (let j = 1; j < t.length; j++) {
    const expect = t[j]!;
    const code = expect.codePointAt(0)!.toString(16).toUpperCase().padStart(2, "0");
    const advance = j + 1 < t.length ? `${literal(expect)} raw-s${j + 1} | ` : "";
    rules.push([`raw-s${j}`, `${advance}"\\n" raw-s1 | [^\\n\\x${code}] raw-s0 | ""`]);
  }
  return rules;
}

/** Closing tags of the qwen3coder call format: a raw parameter value holding one cannot be read back. */
const QWEN_TAGS = ["</parameter>", "</function>", "</tool_call>"] as const;

/** Keywords that constrain but that the grammar cannot honour: always refused (unless trivially satisfied). */
const REFUSED_KEYWORDS = [
  "multipleOf",
  "not",
  "if",
  "then",
  "else",
  "dependentRequired",
  "dependentSchemas",
  "dependencies",
  "patternProperties",
  "propertyNames",
  "contains",
  "minContains",
  "maxContains",
  "unevaluatedProperties",
  "unevaluatedItems",
  "$dynamicRef",
  "$recursiveRef",
  "contentSchema",
] as const;

/** Where a conversion is and what it may not revisit. */
interface Ctx {
  /** JSON pointer of the current schema inside the root (`#/properties/a`). */
  ptr: string;
  /** Nesting depth. */
  depth: number;
  /** Refs entered since the last object/array: re-entering one is a ref cycle without structure. */
  unguarded: ReadonlySet<string>;
}

/** One schema's conversion state. */
interface SchemaJob {
  /** The root schema (target of `#…` refs). */
  root: unknown;
  /** Rule-name prefix. */
  prefix: string;
  /** Request field path for errors (`tools[2].function.parameters`). */
  param: string;
  /** Rule name per resolved `$ref` pointer (emitted once). */
  refRules: Map<string, string>;
  /** `$ref`s proven to admit a finite value (memo of {@link finite}). */
  finiteRefs: Set<string>;
}

type JsonSchema = Record<string, unknown>;

/**
 * Collects GBNF rules. `addSchema` converts one schema under a prefix and returns its value rule's name; `rule`
 * adds a hand-written rule; `text()` renders all rules.
 */
export class GbnfBuilder {
  /** Rule bodies by name, in insertion order. */
  private readonly rules = new Map<string, string>();
  /** Counter for generated rule names. */
  private next = 0;
  /** Running size of the rule text, checked against MAX_GBNF_CHARS. */
  private size = 0;
  /** Request field path blamed when the grammar grows too large. */
  private lastParam: string | null = null;
  /** Size totals over the schemas this builder converted (one request; see schema-limits.ts). */
  private readonly totals: SchemaTotals = newTotals();
  /** Root schemas already checked against the limits (a qwen3coder tool converts one root per parameter). */
  private readonly measured = new WeakSet<object>();

  /** Ensures a shared primitive (and its dependencies) is defined; returns its name. */
  primitive(name: string): string {
    if (this.rules.has(name)) return name;
    if (name === "raw-text") {
      for (const [n, b] of rawTextRules()) this.define(n, b);
      this.define(name, PRIMITIVES[name]!);
      return name;
    }
    const body = PRIMITIVES[name];
    if (body === undefined) throw new Error(`unknown primitive ${name}`);
    this.define(name, body);
    for (const dep of PRIMITIVE_DEPS[name] ?? []) this.primitive(dep);
    return name;
  }

  /** Defines rule `name` (must be new, or identical). */
  define(name: string, body: string): string {
    const old = this.rules.get(name);
    if (old !== undefined) {
      if (old !== body) throw new Error(`rule ${name} defined twice`);
      return name;
    }
    // What llama.cpp's parser would refuse or crash on (deep groups, repetitions past its threshold) never
    // leaves the gateway: refused by construction (gbnf-limits.ts).
    const problem = bodyProblem(body);
    if (problem !== null) {
      throw markUnsupported(invalidValue(
        this.lastParam,
        `The grammar for '${this.lastParam ?? "the request"}' at '#': ${problem}; simplify the schema or its patterns.`,
      ));
    }
    this.rules.set(name, body);
    // llama.cpp expands `x{m,n}` into about n copies: count them, so a short text cannot hide a huge grammar.
    let expanded = 0;
    for (const m of body.matchAll(/\{(\d+)(?:,(\d*))?\}/g)) expanded += 8 * Math.max(Number(m[1]), Number(m[2] || 0));
    this.size += name.length + body.length + 6 + expanded;
    if (this.size > MAX_GBNF_CHARS) {
      throw markUnsupported(invalidValue(
        this.lastParam,
        `The grammar for '${this.lastParam ?? "the request"}' at '#' exceeds ${MAX_GBNF_CHARS} characters (limit ${MAX_GBNF_CHARS}, repetitions counted expanded); simplify the schema or send fewer tools.`,
      ));
    }
    return name;
  }

  /** A fresh rule name under `prefix` with a readable hint. */
  fresh(prefix: string, hint: string): string {
    const clean = hint.replace(/[^a-zA-Z0-9]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 24);
    return `${prefix}-${clean ? `${clean}-` : ""}${this.next++}`;
  }

  /** The GBNF text (one `name ::= body` per line). */
  text(): string {
    return [...this.rules].map(([n, b]) => `${n} ::= ${b}`).join("\n") + "\n";
  }

  /**
   * Converts `schema` into rules named `prefix-…`; returns the name of the rule matching one value (no trailing
   * whitespace). `mode` "raw" converts a top-level string as raw text (qwen3coder parameter values). Throws a
   * KeelHttpError 400 `invalid_value` with `param` and a message naming the JSON pointer on a bad schema.
   */
  addSchema(schema: unknown, prefix: string, param: string, mode: CharMode = "json"): string {
    return this.addSchemaAt(schema, "#", prefix, param, mode);
  }

  /**
   * Like {@link addSchema} for the subschema at JSON pointer `ptr` of `root` (refs resolve against `root`): a
   * qwen3coder parameter is its tool schema's `#/properties/NAME`.
   */
  addSchemaAt(root: unknown, ptr: string, prefix: string, param: string, mode: CharMode = "json"): string {
    this.lastParam = param;
    // Limits first, iteratively: nothing recursive may see a schema too deep or too large for it.
    if (typeof root !== "object" || root === null || !this.measured.has(root)) {
      checkSchemaLimits(root, param, this.totals);
      if (typeof root === "object" && root !== null) this.measured.add(root);
    }
    try {
      return this.convertAt(root, ptr, prefix, param, mode);
    } catch (e) {
      // Last resort: a walk the limits did not bound ran out of stack. A 400, never a 500.
      if (e instanceof RangeError) throw tooComplex(param);
      throw e;
    }
  }

  private convertAt(root: unknown, ptr: string, prefix: string, param: string, mode: CharMode): string {
    const job: SchemaJob = { root, prefix: sanitizePrefix(prefix), param, refRules: new Map(), finiteRefs: new Set() };
    const target = resolvePointer(root, ptr);
    if (target === undefined) throw this.fail(job, ptr, "no schema at this location.");
    const expr = this.visit(job, target, { ptr, depth: 0, unguarded: new Set() }, mode);
    // A value must be finite: a required recursion (an object that must contain itself) would leave the model
    // generating until max_tokens with no way to finish.
    if (!this.usable(job, target)) {
      throw this.fail(job, ptr, "the schema admits no finite value (every alternative requires itself again through '$ref').", true);
    }
    return this.define(this.fresh(job.prefix, "root"), expr);
  }

  // ---------------------------------------------------------------- visitor

  /**
   * The 400 for a schema problem at `ptr`. `unsupported`: a valid JSON schema the grammar cannot honour (refused
   * only when guiding), as opposed to an invalid one (refused always; see {@link checkSchema}).
   */
  private fail(job: SchemaJob, ptr: string, message: string, unsupported = false): KeelHttpError {
    const err = invalidValue(job.param, `Invalid schema for '${job.param}' at '${ptr}': ${message}`);
    if (unsupported) UNSUPPORTED.add(err);
    return err;
  }

  /**
   * Whether `x` admits a finite value. Parts that do not are left out of the grammar wherever they are optional
   * (an optional property, extra keys, further items, an alternative), so every path the model can enter can
   * also be finished; where required, the whole schema is refused at its root.
   */
  private usable(job: SchemaJob, x: unknown): boolean {
    return finite(job.root, x, new Set(), job.finiteRefs);
  }

  /**
   * Checks a part left out as unfinishable (see {@link usable}) for INVALID schema content, which is still a 400;
   * what it could not honour does not matter, since it can never be written.
   */
  private validateOnly(job: SchemaJob, x: unknown, ctx: Ctx, mode: CharMode): void {
    try {
      this.visit(job, x, ctx, mode);
    } catch (e) {
      if (!isUnsupportedSchema(e)) throw e;
    }
  }

  /** GBNF expression for one value of `schema` at `ctx`. */
  private visit(job: SchemaJob, schema: unknown, ctx: Ctx, mode: CharMode): string {
    if (ctx.depth > MAX_SCHEMA_DEPTH) throw this.fail(job, ctx.ptr, `nested deeper than ${MAX_SCHEMA_DEPTH} levels.`, true);
    if (schema === true) return mode === "raw" ? this.primitive("raw-text") : this.primitive("json-value");
    if (schema === false) throw this.fail(job, ctx.ptr, "the schema `false` accepts no value.", true);
    if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
      throw this.fail(job, ctx.ptr, "a schema must be an object or a boolean.");
    }
    const s = schema as JsonSchema;
    for (const k of REFUSED_KEYWORDS) {
      if (k in s) throw this.fail(job, ctx.ptr, `the keyword '${k}' is not supported in guided generation.`, true);
    }
    if (s.uniqueItems === true) throw this.fail(job, ctx.ptr, "the keyword 'uniqueItems' is not supported in guided generation.", true);
    const child = (seg: string): Ctx => ({ ptr: `${ctx.ptr}/${seg}`, depth: ctx.depth + 1, unguarded: ctx.unguarded });

    // 1. $ref (siblings other than annotations are refused: we would have to merge them).
    if ("$ref" in s) return this.visitRef(job, s, ctx, mode);
    // 2. enum / const.
    if ("const" in s || "enum" in s) return this.visitEnum(job, s, ctx, mode);
    // 3. combinators.
    if ("allOf" in s) return this.visit(job, this.mergeAllOf(job, s, ctx), child("allOf"), mode);
    for (const key of ["anyOf", "oneOf"] as const) {
      if (key in s) {
        const alts = s[key];
        if (!Array.isArray(alts) || alts.length === 0) throw this.fail(job, ctx.ptr, `'${key}' must be a non-empty array.`);
        const rest = { ...s };
        delete rest[key];
        const hasRest = Object.keys(rest).some((k) => !ANNOTATIONS.has(k) && k !== "$defs" && k !== "definitions");
        const options: string[] = [];
        let unfinishable = 0;
        alts.forEach((a, i) => {
          const where = child(`${key}/${i}`);
          // Keywords next to anyOf apply to every alternative: merged in (an alternative whose type cannot meet
          // the parent's admits nothing and is dropped).
          const sub = hasRest && typeof a === "object" && a !== null && !Array.isArray(a) ? this.mergeInto(job, rest, a as JsonSchema, where.ptr) : a;
          if (sub === null) return;
          if (this.usable(job, sub)) options.push(this.visit(job, sub, where, mode));
          else {
            unfinishable++;
            this.validateOnly(job, sub, where, mode);
          }
        });
        if (options.length === 0) {
          const why = unfinishable > 0 ? "the schema admits no finite value (no alternative can finish)." : `no '${key}' alternative can meet the keywords next to it.`;
          throw this.fail(job, ctx.ptr, why, true);
        }
        return `(${options.join(" | ")})`;
      }
    }
    // 4. type (explicit, array, or inferred from keywords).
    const type = s.type ?? inferType(s);
    if (Array.isArray(type)) {
      if (type.length === 0) throw this.fail(job, ctx.ptr, "'type' must not be an empty array.");
      const live = type.filter((t) => this.usable(job, { ...s, type: t }));
      return `(${(live.length > 0 ? live : type).map((t) => this.visitTyped(job, s, t, ctx, mode)).join(" | ")})`;
    }
    if (type === undefined) return mode === "raw" ? this.primitive("raw-text") : this.primitive("json-value");
    return this.visitTyped(job, s, type, ctx, mode);
  }

  private visitTyped(job: SchemaJob, s: JsonSchema, type: unknown, ctx: Ctx, mode: CharMode): string {
    switch (type) {
      case "object":
        return this.visitObject(job, s, ctx);
      case "array":
        return this.visitArray(job, s, ctx);
      case "string":
        return this.visitString(job, s, ctx, mode);
      case "integer":
        return this.visitInteger(job, s, ctx);
      case "number":
        return this.visitNumber(job, s, ctx);
      case "boolean":
        // The qwen3coder template renders Python booleans; its parsers normalise them.
        return mode === "raw" ? '("true" | "false" | "True" | "False")' : this.primitive("json-bool");
      case "null":
        return mode === "raw" ? '("null" | "None")' : this.primitive("json-null");
      default:
        throw this.fail(job, ctx.ptr, `unknown type ${JSON.stringify(type)}.`);
    }
  }

  private visitRef(job: SchemaJob, s: JsonSchema, ctx: Ctx, mode: CharMode): string {
    const ref = s.$ref;
    if (typeof ref !== "string" || !ref.startsWith("#")) {
      throw this.fail(job, ctx.ptr, `'$ref' must be a local reference starting with '#' (got ${JSON.stringify(ref)}).`);
    }
    const extra = Object.keys(s).filter((k) => k !== "$ref" && !ANNOTATIONS.has(k) && k !== "$defs" && k !== "definitions");
    if (extra.length > 0) throw this.fail(job, ctx.ptr, `'$ref' next to '${extra[0]}' is not supported.`, true);
    if (ctx.unguarded.has(ref)) {
      throw this.fail(job, ctx.ptr, `'$ref' ${JSON.stringify(ref)} refers back to itself without an object or array in between (infinite recursion).`);
    }
    const key = `${mode}:${ref}`;
    const known = job.refRules.get(key);
    if (known) return known;
    const target = resolvePointer(job.root, ref);
    if (target === undefined) throw this.fail(job, ctx.ptr, `'$ref' ${JSON.stringify(ref)} does not resolve inside the schema.`);
    const name = this.fresh(job.prefix, `ref-${ref.split("/").pop() ?? ""}`);
    job.refRules.set(key, name);
    const unguarded = new Set(ctx.unguarded);
    unguarded.add(ref);
    let body: string;
    try {
      body = this.visit(job, target, { ptr: ref, depth: ctx.depth + 1, unguarded }, mode);
    } catch (e) {
      job.refRules.delete(key); // never leave a name without its rule
      throw e;
    }
    this.define(name, body);
    return name;
  }

  private visitEnum(job: SchemaJob, s: JsonSchema, ctx: Ctx, mode: CharMode): string {
    // The literals are the whole language: any other constraint next to them would be ignored, so refuse it.
    const other = Object.keys(s).find((k) => !ANNOTATIONS.has(k) && !["enum", "const", "type", "$defs", "definitions"].includes(k));
    if (other !== undefined || ("enum" in s && "const" in s)) {
      throw this.fail(job, ctx.ptr, `'${"const" in s ? "const" : "enum"}' together with '${other ?? "enum"}' is not supported.`, true);
    }
    const values = "const" in s ? [s.const] : s.enum;
    if (!Array.isArray(values) || values.length === 0) throw this.fail(job, ctx.ptr, "'enum' must be a non-empty array.");
    const types = s.type === undefined ? null : Array.isArray(s.type) ? s.type : [s.type];
    const kept = values.filter((v) => types === null || types.some((t) => jsonTypeMatches(v, t)));
    if (kept.length === 0) throw this.fail(job, ctx.ptr, "no 'enum'/'const' value has the schema's 'type'.", true);
    // A qwen3coder parameter writes strings raw (unquoted); other values stay JSON.
    const texts = kept.map((v) => (mode === "raw" && typeof v === "string" ? v : JSON.stringify(v)));
    if (mode === "raw") {
      // The XML wire format cannot carry a value holding its closing tags: the parser would end the value (or the
      // call) there. No escape exists in that format, so such a value is refused, naming it.
      texts.forEach((t, i) => {
        const tag = QWEN_TAGS.find((x) => t.includes(x));
        if (tag !== undefined) {
          const at = "const" in s ? `${ctx.ptr}/const` : `${ctx.ptr}/enum/${values.indexOf(kept[i])}`;
          throw this.fail(job, at, `the value contains '${tag}', which the qwen3coder call format cannot carry inside a parameter value.`, true);
        }
      });
    }
    const lits = [...new Set(texts.map((t) => literal(t)))];
    return `(${lits.join(" | ")})`;
  }

  /**
   * `parent` (the keywords next to anyOf/oneOf) AND `alt`, as one schema; null when their types do not meet.
   * Types intersect (integer ⊂ number), properties merge, required unite; any other keyword both define must be
   * equal, else refused (intersecting e.g. two patterns is beyond a grammar).
   */
  private mergeInto(job: SchemaJob, parent: JsonSchema, alt: JsonSchema, ptr: string): JsonSchema | null {
    if ("$ref" in alt) throw this.fail(job, ptr, "'$ref' inside an anyOf/oneOf that has sibling keywords is not supported.", true);
    const out: JsonSchema = { ...parent };
    for (const [k, v] of Object.entries(alt)) {
      if (!(k in out) || ANNOTATIONS.has(k)) out[k] = v;
      else if (k === "type") {
        const types = (t: unknown) => (Array.isArray(t) ? (t as unknown[]) : [t]);
        const a = types(out.type);
        const b = types(v);
        const meet = [...new Set([...a.filter((t) => b.includes(t) || (t === "integer" && b.includes("number"))), ...b.filter((t) => t === "integer" && a.includes("number"))])];
        if (meet.length === 0) return null;
        out.type = meet.length === 1 ? meet[0] : meet;
      } else if (k === "properties" && typeof v === "object" && v !== null && typeof out.properties === "object" && out.properties !== null) {
        const merged = { ...(out.properties as JsonSchema) };
        for (const [name, sub] of Object.entries(v as JsonSchema)) {
          if (name in merged && JSON.stringify(merged[name]) !== JSON.stringify(sub)) {
            throw this.fail(job, ptr, `property '${name}' is declared both next to and inside the alternative with different schemas.`, true);
          }
          merged[name] = sub;
        }
        out.properties = merged;
      } else if (k === "required" && Array.isArray(v) && Array.isArray(out.required)) {
        out.required = [...new Set([...(out.required as unknown[]), ...v])];
      } else if (JSON.stringify(out[k]) !== JSON.stringify(v)) {
        throw this.fail(job, ptr, `'${k}' both next to and inside the alternative (with different values) is not supported.`, true);
      }
    }
    return out;
  }

  /** Merges allOf's object schemas (properties, required, additionalProperties) into one schema. */
  private mergeAllOf(job: SchemaJob, s: JsonSchema, ctx: Ctx): JsonSchema {
    const parts = s.allOf;
    if (!Array.isArray(parts) || parts.length === 0) throw this.fail(job, ctx.ptr, "'allOf' must be a non-empty array.");
    const rest = { ...s };
    delete rest.allOf;
    const all = [rest, ...parts.map((p, i) => this.derefShallow(job, p, `${ctx.ptr}/allOf/${i}`))];
    if (parts.length === 1 && Object.keys(rest).every((k) => ANNOTATIONS.has(k))) return all[1]!;
    const merged: JsonSchema = { type: "object", properties: {} as JsonSchema, required: [] as string[] };
    const props = merged.properties as JsonSchema;
    for (const [i, p] of all.entries()) {
      const where = i === 0 ? ctx.ptr : `${ctx.ptr}/allOf/${i - 1}`;
      for (const [k, v] of Object.entries(p)) {
        if (ANNOTATIONS.has(k)) continue;
        if (k === "type") {
          if (v !== "object") throw this.fail(job, where, "'allOf' is supported only over object schemas.", true);
        } else if (k === "properties") {
          for (const [name, sub] of Object.entries(v as JsonSchema)) {
            if (name in props && JSON.stringify(props[name]) !== JSON.stringify(sub)) {
              throw this.fail(job, where, `'allOf' declares property '${name}' twice with different schemas.`, true);
            }
            props[name] = sub;
          }
        } else if (k === "required") {
          if (!Array.isArray(v)) throw this.fail(job, where, "'required' must be an array.");
          (merged.required as string[]).push(...(v as string[]).filter((r) => !(merged.required as string[]).includes(r)));
        } else if (k === "additionalProperties") {
          if (v !== false && merged.additionalProperties === undefined) merged.additionalProperties = v;
          if (v === false) merged.additionalProperties = false;
        } else if (k !== "$defs" && k !== "definitions") {
          throw this.fail(job, where, `'allOf' is supported only over object schemas (found '${k}').`, true);
        }
      }
    }
    return merged;
  }

  /** Resolves a `$ref` one level (for allOf merging). */
  private derefShallow(job: SchemaJob, p: unknown, ptr: string): JsonSchema {
    let cur = p;
    for (let i = 0; i < MAX_SCHEMA_DEPTH && typeof cur === "object" && cur !== null && "$ref" in cur; i++) {
      const ref = (cur as JsonSchema).$ref;
      cur = typeof ref === "string" ? resolvePointer(job.root, ref) : undefined;
      if (cur === undefined) throw this.fail(job, ptr, `'$ref' ${JSON.stringify(ref)} does not resolve inside the schema.`);
    }
    if (typeof cur !== "object" || cur === null || Array.isArray(cur)) throw this.fail(job, ptr, "'allOf' members must be schemas.");
    return cur as JsonSchema;
  }

  private visitObject(job: SchemaJob, s: JsonSchema, ctx: Ctx): string {
    const sp = this.primitive("space");
    const props = s.properties ?? {};
    if (typeof props !== "object" || props === null || Array.isArray(props)) throw this.fail(job, ctx.ptr, "'properties' must be an object.");
    const required = s.required ?? [];
    if (!Array.isArray(required) || required.some((r) => typeof r !== "string")) throw this.fail(job, ctx.ptr, "'required' must be an array of strings.");
    const names = Object.keys(props);
    for (const r of required as string[]) {
      if (!names.includes(r)) throw this.fail(job, ctx.ptr, `required property '${r}' is not declared in 'properties'.`, true);
    }
    const addl = s.additionalProperties;
    if ("minProperties" in s && (typeof s.minProperties !== "number" || s.minProperties > required.length)) {
      throw this.fail(job, ctx.ptr, "'minProperties' above the number of required properties is not supported.", true);
    }
    if ("maxProperties" in s && (typeof s.maxProperties !== "number" || s.maxProperties < names.length || (addl !== undefined && addl !== false))) {
      throw this.fail(job, ctx.ptr, "'maxProperties' below the number of declared properties is not supported.", true);
    }
    // Any object: no `properties` keyword and extra keys not restricted. (`properties: {}` declares none: `{}`.)
    if (!("properties" in s) && (addl === undefined || addl === true)) return this.primitive("json-object");
    const guarded: Ctx = { ...ctx, unguarded: new Set() };
    const req = new Set(required as string[]);
    // Optional properties whose schema has no finite value can never appear: left out.
    const declared = names;
    const live = names.filter((n) => req.has(n) || this.usable(job, (props as JsonSchema)[n]));
    for (const n of names) {
      if (!live.includes(n)) this.validateOnly(job, (props as JsonSchema)[n], { ...guarded, ptr: `${ctx.ptr}/properties/${escapePointer(n)}`, depth: ctx.depth + 1 }, "json");
    }
    const kv = live.map((name) => {
      const value = this.visit(job, (props as JsonSchema)[name], { ...guarded, ptr: `${ctx.ptr}/properties/${escapePointer(name)}`, depth: ctx.depth + 1 }, "json");
      return `${literal(JSON.stringify(name))} ${sp} ":" ${sp} ${value} ${sp}`;
    });
    let extra: string | null = null;
    const addlLive = addl !== undefined && addl !== false && this.usable(job, addl);
    if (addl !== undefined && addl !== false && !addlLive) this.validateOnly(job, addl, { ...guarded, ptr: `${ctx.ptr}/additionalProperties`, depth: ctx.depth + 1 }, "json");
    if (addlLive) {
      const value = addl === true ? this.primitive("json-value") : this.visit(job, addl, { ...guarded, ptr: `${ctx.ptr}/additionalProperties`, depth: ctx.depth + 1 }, "json");
      extra = this.define(this.fresh(job.prefix, "extra-kv"), `${this.otherKey(job, declared)} ${sp} ":" ${sp} ${value} ${sp}`);
    }
    // seq(i, first): the members from declaration index i on, `first` = nothing written yet (no comma before).
    // Built bottom-up (from the last member), never recursively: thousands of properties must not use the stack.
    // `first` variants exist only where every member before i is optional.
    const needFirst: boolean[] = [true];
    for (let i = 0; i < live.length; i++) needFirst.push(needFirst[i]! && !req.has(live[i]!));
    let nextN = "";
    let nextF = "";
    for (let i = live.length; i >= 0; i--) {
      // 1. The tail after all declared members: extra keys or nothing.
      const variant = (first: boolean): string => {
        if (i === live.length) {
          if (extra === null) return '""';
          return first ? `(${extra} ("," ${sp} ${extra})*)?` : `("," ${sp} ${extra})*`;
        }
        // 2. Member i, then the rest; skippable when optional.
        const take = `${first ? "" : `"," ${sp} `}${kv[i]} ${nextN}`;
        return req.has(live[i]!) ? take : `${take} | ${first ? nextF : nextN}`;
      };
      const n = i > 0 ? this.define(this.fresh(job.prefix, `obj-${i}n`), variant(false)) : "";
      const f = needFirst[i] ? this.define(this.fresh(job.prefix, `obj-${i}f`), variant(true)) : "";
      nextN = n;
      nextF = f;
    }
    const start = nextF;
    return `"{" ${sp} ${start} "}"`;
  }

  /**
   * A JSON string that is none of `names` (extra keys must not repeat a declared property): a trie over the names,
   * where each node may end the key (unless a name ends there), continue along a name, or leave all names behind.
   * Names that JSON escapes (quote, backslash, controls) fall back to any key (documented inexactness).
   */
  private otherKey(job: SchemaJob, names: readonly string[]): string {
    const str = this.primitive("json-string");
    if (names.length === 0 || names.some((n) => /["\\\u0000-\u001f]/.test(n))) return str;
    const char = this.primitive("json-char");
    type Node = { children: Map<number, Node>; terminal: boolean };
    const root: Node = { children: new Map(), terminal: false };
    for (const n of names) {
      let cur = root;
      for (const ch of n) {
        const cp = ch.codePointAt(0)!;
        let next = cur.children.get(cp);
        if (!next) cur.children.set(cp, (next = { children: new Map(), terminal: false }));
        cur = next;
      }
      cur.terminal = true;
    }
    const emit = (node: Node): string => {
      const alts: string[] = [];
      if (!node.terminal) alts.push('"\\""');
      for (const [cp, child] of node.children) alts.push(`${literal(String.fromCodePoint(cp))} ${emit(child)}`);
      const leave = jsonCharOf(negate(charSet([...node.children.keys()].map((cp) => [cp, cp] as const))));
      if (leave !== null) alts.push(`${leave} ${char}* "\\""`);
      return this.define(this.fresh(job.prefix, "key"), alts.join(" | "));
    };
    return `"\\"" ${emit(root)}`;
  }

  /** `expr` as a rule reference: itself when it already is a rule name, else a new rule. */
  private asRule(job: SchemaJob, expr: string, hint: string): string {
    return /^[a-zA-Z0-9-]+$/.test(expr) ? expr : this.define(this.fresh(job.prefix, hint), expr);
  }

  /** A count keyword (`minItems`, `maxLength`…): absent → null; present, it must be a non-negative integer. */
  private count(job: SchemaJob, s: JsonSchema, key: string, ctx: Ctx): number | null {
    const v = s[key];
    if (v === undefined) return null;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0) throw this.fail(job, `${ctx.ptr}/${key}`, `'${key}' must be a non-negative integer.`);
    return v;
  }

  private visitArray(job: SchemaJob, s: JsonSchema, ctx: Ctx): string {
    const sp = this.primitive("space");
    const guarded: Ctx = { ...ctx, unguarded: new Set() };
    // Items are rule references: a repetition over an inline item would repeat the item's own generated rules too
    // (llama.cpp multiplies them against its threshold, see gbnf-limits.ts).
    const sub = (x: unknown, seg: string) => this.asRule(job, this.visit(job, x, { ...guarded, ptr: `${ctx.ptr}/${seg}`, depth: ctx.depth + 1 }, "json"), "item");
    if ("prefixItems" in s && !Array.isArray(s.prefixItems)) throw this.fail(job, `${ctx.ptr}/prefixItems`, "'prefixItems' must be an array of schemas.");
    let prefix: unknown[] = [];
    let rest: unknown = s.items ?? true;
    if (Array.isArray(s.prefixItems)) {
      prefix = s.prefixItems;
      rest = s.items ?? true;
    } else if (Array.isArray(s.items)) {
      prefix = s.items;
      rest = s.additionalItems ?? true;
    }
    const min = this.count(job, s, "minItems", ctx) ?? 0;
    const max = this.count(job, s, "maxItems", ctx);
    if (max !== null && max < min) throw this.fail(job, ctx.ptr, "'maxItems' is below 'minItems'.");
    if (min > MAX_REPEAT || (max !== null && max > MAX_REPEAT)) throw this.fail(job, ctx.ptr, `item counts above ${MAX_REPEAT} are not supported.`, true);
    // Items whose schema has no finite value end the array there (they can never be written).
    const dead = prefix.findIndex((p) => !this.usable(job, p));
    const pruned = dead >= 0 || (rest !== false && !this.usable(job, rest));
    if (pruned) {
      prefix.forEach((p, i) => i >= dead && dead >= 0 && this.validateOnly(job, p, { ...guarded, ptr: `${ctx.ptr}/items/${i}`, depth: ctx.depth + 1 }, "json"));
      if (rest !== false) this.validateOnly(job, rest, { ...guarded, ptr: `${ctx.ptr}/items`, depth: ctx.depth + 1 }, "json");
      if (dead >= 0) prefix = prefix.slice(0, dead);
      rest = false;
    }
    const k = max === null ? prefix.length : Math.min(prefix.length, max);
    const prefixRules = prefix.slice(0, k).map((p, i) => sub(p, `${Array.isArray(s.prefixItems) ? "prefixItems" : "items"}/${i}`));
    const restRule = rest === false ? null : sub(rest, Array.isArray(s.prefixItems) || !Array.isArray(s.items) ? "items" : "additionalItems");
    if (restRule === null && min > k) {
      throw this.fail(job, ctx.ptr, pruned ? "the schema admits no finite value (its required items cannot finish)." : "'minItems' exceeds the number of allowed items.", true);
    }
    const item = (rule: string) => `${rule} ${sp}`;
    const sep = `"," ${sp} `;
    // Tail after the prefix: rest items, count in [lo, hi].
    let tail = '""';
    if (restRule !== null && (max === null || max > k)) {
      const lo = Math.max(0, min - k);
      const hi = max === null ? null : max - k;
      const rep = (a: number, b: number | null) => (b === null ? (a === 0 ? "*" : a === 1 ? "+" : `{${a},}`) : `{${a},${b}}`);
      // The repetition is a rule of its own: inside `( … )?` its generated rules would count again.
      if (k === 0) {
        const more = this.define(this.fresh(job.prefix, "more"), `(${sep}${item(restRule)})${rep(Math.max(0, lo - 1), hi === null ? null : hi - 1)}`);
        tail = lo === 0 ? `(${item(restRule)} ${more})?` : `${item(restRule)} ${more}`;
      } else tail = this.define(this.fresh(job.prefix, "more"), `(${sep}${item(restRule)})${rep(lo, hi)}`);
    }
    // Prefix positions from the end: position i is mandatory below minItems. Each position is its own rule that
    // names the next, so a long tuple never nests groups (20000 nested optional groups crashed llama.cpp's parser).
    let body = tail;
    for (let i = k - 1; i >= 0; i--) {
      const one = `${i === 0 ? "" : sep}${item(prefixRules[i]!)} ${body}`;
      body = i < min ? one : `(${one})?`;
      if (i > 0) body = this.define(this.fresh(job.prefix, `prefix-${i}`), body);
    }
    const name = this.define(this.fresh(job.prefix, "items"), body);
    return `"[" ${sp} ${name} "]"`;
  }

  private visitString(job: SchemaJob, s: JsonSchema, ctx: Ctx, mode: CharMode): string {
    const quote = (content: string) => (mode === "json" ? `"\\"" ${content} "\\""` : content);
    const anyChar = mode === "json" ? this.primitive("json-char") : RAW_ANY;
    const hasLen = "minLength" in s || "maxLength" in s;
    if ("pattern" in s || "format" in s) {
      if (hasLen) throw this.fail(job, ctx.ptr, "'minLength'/'maxLength' together with 'pattern' or 'format' is not supported.", true);
      if ("pattern" in s && "format" in s) throw this.fail(job, ctx.ptr, "'pattern' together with 'format' is not supported.", true);
    }
    if ("pattern" in s) {
      if (typeof s.pattern !== "string") throw this.fail(job, `${ctx.ptr}/pattern`, "'pattern' must be a string.");
      try {
        const gbnf = patternToGbnf(s.pattern, mode, anyChar);
        // Checked here too, so the 400 names the pattern's pointer (define() would only know the request field).
        const problem = bodyProblem(gbnf);
        if (problem !== null) throw this.fail(job, `${ctx.ptr}/pattern`, `${problem}.`, true);
        const body = this.define(this.fresh(job.prefix, "pattern"), gbnf);
        return quote(body);
      } catch (e) {
        if (e instanceof PatternError) throw this.fail(job, `${ctx.ptr}/pattern`, `${e.message}.`, !e.invalidRegex);
        throw e;
      }
    }
    if ("format" in s) {
      const f = FORMATS[String(s.format)];
      if (f === undefined) {
        throw this.fail(job, `${ctx.ptr}/format`, `the format ${JSON.stringify(s.format)} is not supported (supported: ${Object.keys(FORMATS).join(", ")}).`, true);
      }
      const name = `fmt-${String(s.format)}`;
      this.define(name, f);
      return quote(name);
    }
    if (hasLen) {
      const min = this.count(job, s, "minLength", ctx) ?? 0;
      const max = this.count(job, s, "maxLength", ctx);
      if (max !== null && max < min) throw this.fail(job, ctx.ptr, "'maxLength' is below 'minLength'.");
      if (min > MAX_REPEAT || (max !== null && max > MAX_REPEAT)) throw this.fail(job, ctx.ptr, `string lengths above ${MAX_REPEAT} are not supported.`, true);
      const c = mode === "json" ? this.primitive("json-char-cp") : `(${anyChar})`;
      // A rule of its own, so that a container repeating or skipping this value repeats one reference.
      return this.define(this.fresh(job.prefix, "string"), quote(max === null ? `${c}{${min},}` : `${c}{${min},${max}}`));
    }
    return mode === "json" ? this.primitive("json-string") : this.primitive("raw-text");
  }

  /** A number; with bounds, spelled without exponent (see number-range.ts). */
  private visitNumber(job: SchemaJob, s: JsonSchema, ctx: Ctx): string {
    const bound = (k: string): number | null => {
      const v = s[k];
      if (v === undefined || typeof v === "boolean") return null;
      if (typeof v !== "number" || !Number.isFinite(v)) throw this.fail(job, `${ctx.ptr}/${k}`, `'${k}' must be a number.`);
      return v;
    };
    // The tighter of `minimum` (exclusive under draft-4's boolean form) and numeric `exclusiveMinimum`; same above.
    const tighter = (incl: number | null, inclIsExclusive: boolean, excl: number | null, lower: boolean): Bound | null => {
      const a: Bound | null = incl === null ? null : { value: incl, exclusive: inclIsExclusive };
      const b: Bound | null = excl === null ? null : { value: excl, exclusive: true };
      if (a === null || b === null) return a ?? b;
      if (a.value === b.value) return b;
      return (lower ? a.value > b.value : a.value < b.value) ? a : b;
    };
    const lo = tighter(bound("minimum"), s.exclusiveMinimum === true, bound("exclusiveMinimum"), true);
    const hi = tighter(bound("maximum"), s.exclusiveMaximum === true, bound("exclusiveMaximum"), false);
    if (lo === null && hi === null) return this.primitive("json-number");
    if (lo !== null && hi !== null && (lo.value > hi.value || (lo.value === hi.value && (lo.exclusive || hi.exclusive)))) {
      throw this.fail(job, ctx.ptr, "the number bounds admit no value.", true);
    }
    const expr = numberRange(lo, hi);
    if (expr === null) throw this.fail(job, ctx.ptr, "the number bounds admit no value (within 16 integral digits).", true);
    return this.define(this.fresh(job.prefix, "number"), expr);
  }

  private visitInteger(job: SchemaJob, s: JsonSchema, ctx: Ctx): string {
    const limit = 10n ** BigInt(MAX_DIGITS) - 1n;
    let lo = -limit;
    let hi = limit;
    const bound = (k: string): number | null => {
      const v = s[k];
      if (v === undefined) return null;
      if (typeof v !== "number" || !Number.isFinite(v)) throw this.fail(job, `${ctx.ptr}/${k}`, `'${k}' must be a number.`);
      return v;
    };
    const exMinBool = s.exclusiveMinimum === true;
    const exMaxBool = s.exclusiveMaximum === true;
    const minimum = bound("minimum");
    const maximum = bound("maximum");
    const exMin = typeof s.exclusiveMinimum === "boolean" ? null : bound("exclusiveMinimum");
    const exMax = typeof s.exclusiveMaximum === "boolean" ? null : bound("exclusiveMaximum");
    const clamp = (v: bigint) => (v > limit ? limit + 1n : v < -limit ? -limit - 1n : v);
    if (minimum !== null) {
      const v = clamp(BigInt(Math.ceil(minimum)));
      lo = exMinBool && Number.isInteger(minimum) ? v + 1n : v;
      if (lo < -limit) lo = -limit;
    }
    if (exMin !== null) {
      const v = clamp(BigInt(Math.floor(exMin)) + 1n);
      if (v > lo) lo = v;
    }
    if (maximum !== null) {
      const v = clamp(BigInt(Math.floor(maximum)));
      const h = exMaxBool && Number.isInteger(maximum) ? v - 1n : v;
      if (h < hi) hi = h;
    }
    if (exMax !== null) {
      const v = clamp(BigInt(Math.ceil(exMax)) - 1n);
      if (v < hi) hi = v;
    }
    if (lo > hi) throw this.fail(job, ctx.ptr, "the integer bounds admit no value (within 16 digits).", true);
    if (lo === -limit && hi === limit) return this.primitive("json-int");
    return `(${integerRange(lo, hi)})`;
  }
}

/**
 * Whether some finite JSON value satisfies `schema` as the grammar reads it (run after a successful conversion, so
 * the schema is well-formed). A minimal finite value never nests a `$ref` inside itself, so a ref met again on the
 * current path counts as unusable; `known` memoises refs proven finite (true in every context).
 */
export function finite(root: unknown, schema: unknown, path: Set<string>, known: Set<string>): boolean {
  if (typeof schema !== "object" || schema === null) return schema !== false;
  const s = schema as JsonSchema;
  const sub = (x: unknown) => finite(root, x, path, known);
  if (typeof s.$ref === "string") {
    const ref = s.$ref;
    if (known.has(ref)) return true;
    if (path.has(ref)) return false;
    path.add(ref);
    const ok = sub(resolvePointer(root, ref));
    path.delete(ref);
    if (ok) known.add(ref);
    return ok;
  }
  if ("const" in s || "enum" in s) return true;
  if (Array.isArray(s.allOf)) {
    // As converted: one object with every part's properties and required names (parts may be refs).
    const parts = [{ ...s, allOf: undefined }, ...s.allOf.map((p) => (typeof p === "object" && p !== null && typeof (p as JsonSchema).$ref === "string" ? resolvePointer(root, (p as JsonSchema).$ref as string) : p))];
    const properties: JsonSchema = {};
    const required: unknown[] = [];
    for (const p of parts) {
      if (typeof p !== "object" || p === null) continue;
      Object.assign(properties, (p as JsonSchema).properties ?? {});
      if (Array.isArray((p as JsonSchema).required)) required.push(...((p as JsonSchema).required as unknown[]));
    }
    return finite(root, { type: "object", properties, required }, path, known);
  }
  for (const k of ["anyOf", "oneOf"] as const) if (Array.isArray(s[k])) return (s[k] as unknown[]).some(sub);
  const type = s.type ?? inferType(s);
  const types = Array.isArray(type) ? type : [type];
  return types.some((t) => {
    if (t === "object") {
      const props = (s.properties ?? {}) as JsonSchema;
      const required = Array.isArray(s.required) ? (s.required as string[]) : [];
      return required.every((r) => sub(props[r]));
    }
    if (t === "array") {
      const min = num(s.minItems, 0);
      const prefix = Array.isArray(s.prefixItems) ? s.prefixItems : Array.isArray(s.items) ? s.items : [];
      const rest = Array.isArray(s.prefixItems) ? s.items : Array.isArray(s.items) ? s.additionalItems : s.items;
      return prefix.slice(0, min).every(sub) && (min <= prefix.length || rest === undefined || sub(rest));
    }
    return true;
  });
}

/** The 400 for a schema whose conversion ran out of stack. */
export function tooComplex(param: string | null): KeelHttpError {
  return markUnsupported(invalidValue(param, `Invalid schema for '${param ?? "the request"}' at '#': the schema is too complex to convert (too deep or too large); simplify it.`));
}

/** Errors for valid schemas the grammar cannot honour (vs invalid schemas). */
const UNSUPPORTED = new WeakSet<KeelHttpError>();

/** Marks a schema 400 as "valid schema, not guidable" (see {@link isUnsupportedSchema}). */
export function markUnsupported(err: KeelHttpError): KeelHttpError {
  UNSUPPORTED.add(err);
  return err;
}

/** Whether a schema 400 is about a valid schema that guided generation cannot honour (not an invalid schema). */
export function isUnsupportedSchema(err: unknown): boolean {
  return typeof err === "object" && err !== null && UNSUPPORTED.has(err as KeelHttpError);
}

/**
 * Checks a schema that will NOT be guided (e.g. tools under unguided `auto`): throws the 400 for an invalid schema
 * (not a schema, bad keyword values, an invalid regex, an unresolvable or structure-free recursive `$ref`), and
 * accepts valid schemas that merely use keywords a grammar cannot honour.
 */
export function checkSchema(schema: unknown, param: string): void {
  try {
    new GbnfBuilder().addSchema(schema, "check", param);
  } catch (e) {
    if (!isUnsupportedSchema(e)) throw e;
  }
}

/** Annotation keywords: never constrain. */
const ANNOTATIONS = new Set(["title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly", "writeOnly", "$anchor"]);

function num(v: unknown, dflt: number): number {
  return typeof v === "number" && Number.isFinite(v) ? Math.max(0, Math.floor(v)) : dflt;
}

function sanitizePrefix(p: string): string {
  const clean = p.replace(/[^a-zA-Z0-9]+/g, "-").replace(/^-+|-+$/g, "");
  return clean || "s";
}

function escapePointer(seg: string): string {
  return seg.replace(/~/g, "~0").replace(/\//g, "~1");
}

/** Resolves `#`, `#/a/b` (with ~0/~1 and %-escapes) inside `root`; undefined when absent. */
export function resolvePointer(root: unknown, ref: string): unknown {
  if (ref === "#") return root;
  if (!ref.startsWith("#/")) return undefined;
  let cur: unknown = root;
  for (const raw of ref.slice(2).split("/")) {
    const seg = safeDecode(raw).replace(/~1/g, "/").replace(/~0/g, "~");
    if (typeof cur !== "object" || cur === null || !Object.prototype.hasOwnProperty.call(cur, seg)) return undefined;
    cur = (cur as Record<string, unknown>)[seg];
  }
  return cur;
}

/** %-decoding of a pointer segment; a stray `%` stays literal. */
function safeDecode(seg: string): string {
  try {
    return decodeURIComponent(seg);
  } catch {
    return seg;
  }
}

/** The type a schema without `type` constrains, from its keywords (undefined: any value). */
function inferType(s: JsonSchema): string | undefined {
  if ("properties" in s || "additionalProperties" in s || "required" in s) return "object";
  if ("items" in s || "prefixItems" in s || "minItems" in s || "maxItems" in s) return "array";
  if ("pattern" in s || "minLength" in s || "maxLength" in s || "format" in s) return "string";
  if ("minimum" in s || "maximum" in s || "exclusiveMinimum" in s || "exclusiveMaximum" in s) return "number";
  return undefined;
}

function jsonTypeMatches(v: unknown, t: unknown): boolean {
  switch (t) {
    case "null":
      return v === null;
    case "boolean":
      return typeof v === "boolean";
    case "string":
      return typeof v === "string";
    case "integer":
      return typeof v === "number" && Number.isInteger(v);
    case "number":
      return typeof v === "number";
    case "array":
      return Array.isArray(v);
    case "object":
      return typeof v === "object" && v !== null && !Array.isArray(v);
    default:
      return false;
  }
}

/**
 * Convenience: one schema to a complete GBNF text whose `root` rule matches one value (no surrounding whitespace).
 * Throws a KeelHttpError 400 on a bad schema (see {@link GbnfBuilder.addSchema}).
 */
export function schemaToGbnf(schema: unknown, opts: { prefix?: string; param: string }): { grammar: string; rule: string } {
  const b = new GbnfBuilder();
  const rule = b.addSchema(schema, opts.prefix ?? "s", opts.param);
  b.define("root", rule);
  return { grammar: b.text(), rule };
}
