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
 * Inexact (the grammar accepts a subset of what a validator accepts, never more, except where noted): property order
 * is fixed; `additionalProperties` absent next to `properties` means no extra keys (llama.cpp's reading; a validator
 * allows them); JSON written with non-canonical escapes (`\u0061`) inside patterns/formats/enums; numbers with more
 * than 16 integral digits; extra keys of an `additionalProperties` schema never repeat a declared name, except when a
 * declared name needs JSON escapes (then any key: more); oneOf may match several branches (more).
 */
import { invalidValue, type KeelHttpError } from "../http/errors.js";
import { literal } from "./gbnf-text.js";
import { type CharMode } from "./pattern-gbnf.js";
import { bodyProblem } from "./gbnf-limits.js";
import { checkSchemaLimits, newTotals, type SchemaTotals } from "./schema-limits.js";
import { MAX_SCHEMA_DEPTH, MAX_GBNF_CHARS, PRIMITIVES, PRIMITIVE_DEPS, rawTextRules, QWEN_TAGS, REFUSED_KEYWORDS, type Ctx, type SchemaJob, type JsonSchema, finite, tooComplex, markUnsupported, isUnsupportedSchema, ANNOTATIONS, sanitizePrefix, resolvePointer, inferType, jsonTypeMatches } from "./json-schema-support.js";
import { arrayRule, objectRule } from "./json-schema-containers.js";
import { integerRule, numberRule, stringRule } from "./json-schema-scalars.js";
export { finite, isUnsupportedSchema, markUnsupported, MAX_GBNF_CHARS, MAX_SCHEMA_DEPTH, resolvePointer, tooComplex } from "./json-schema-support.js";

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
  lastParam: string | null = null;
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

  convertAt(root: unknown, ptr: string, prefix: string, param: string, mode: CharMode): string {
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
  fail(job: SchemaJob, ptr: string, message: string, unsupported = false): KeelHttpError {
    const err = invalidValue(job.param, `Invalid schema for '${job.param}' at '${ptr}': ${message}`);
    return unsupported ? markUnsupported(err) : err;
  }

  /**
   * Whether `x` admits a finite value. Parts that do not are left out of the grammar wherever they are optional
   * (an optional property, extra keys, further items, an alternative), so every path the model can enter can
   * also be finished; where required, the whole schema is refused at its root.
   */
  usable(job: SchemaJob, x: unknown): boolean {
    return finite(job.root, x, new Set(), job.finiteRefs);
  }

  /**
   * Checks a part left out as unfinishable (see {@link usable}) for INVALID schema content, which is still a 400;
   * what it could not honour does not matter, since it can never be written.
   */
  validateOnly(job: SchemaJob, x: unknown, ctx: Ctx, mode: CharMode): void {
    try {
      this.visit(job, x, ctx, mode);
    } catch (e) {
      if (!isUnsupportedSchema(e)) throw e;
    }
  }

  /** GBNF expression for one value of `schema` at `ctx`. */
  visit(job: SchemaJob, schema: unknown, ctx: Ctx, mode: CharMode): string {
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

  visitTyped(job: SchemaJob, s: JsonSchema, type: unknown, ctx: Ctx, mode: CharMode): string {
    switch (type) {
      case "object":
        return objectRule(this, job, s, ctx);
      case "array":
        return arrayRule(this, job, s, ctx);
      case "string":
        return stringRule(this, job, s, ctx, mode);
      case "integer":
        return integerRule(this, job, s, ctx);
      case "number":
        return numberRule(this, job, s, ctx);
      case "boolean":
        // The qwen3coder template renders Python booleans; its parsers normalise them.
        return mode === "raw" ? '("true" | "false" | "True" | "False")' : this.primitive("json-bool");
      case "null":
        return mode === "raw" ? '("null" | "None")' : this.primitive("json-null");
      default:
        throw this.fail(job, ctx.ptr, `unknown type ${JSON.stringify(type)}.`);
    }
  }

  visitRef(job: SchemaJob, s: JsonSchema, ctx: Ctx, mode: CharMode): string {
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

  visitEnum(job: SchemaJob, s: JsonSchema, ctx: Ctx, mode: CharMode): string {
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
  mergeInto(job: SchemaJob, parent: JsonSchema, alt: JsonSchema, ptr: string): JsonSchema | null {
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
  mergeAllOf(job: SchemaJob, s: JsonSchema, ctx: Ctx): JsonSchema {
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
  derefShallow(job: SchemaJob, p: unknown, ptr: string): JsonSchema {
    let cur = p;
    for (let i = 0; i < MAX_SCHEMA_DEPTH && typeof cur === "object" && cur !== null && "$ref" in cur; i++) {
      const ref = (cur as JsonSchema).$ref;
      cur = typeof ref === "string" ? resolvePointer(job.root, ref) : undefined;
      if (cur === undefined) throw this.fail(job, ptr, `'$ref' ${JSON.stringify(ref)} does not resolve inside the schema.`);
    }
    if (typeof cur !== "object" || cur === null || Array.isArray(cur)) throw this.fail(job, ptr, "'allOf' members must be schemas.");
    return cur as JsonSchema;
  }

  asRule(job: SchemaJob, expr: string, hint: string): string {
    return /^[a-zA-Z0-9-]+$/.test(expr) ? expr : this.define(this.fresh(job.prefix, hint), expr);
  }

  /** A count keyword (`minItems`, `maxLength`…): absent → null; present, it must be a non-negative integer. */
  count(job: SchemaJob, s: JsonSchema, key: string, ctx: Ctx): number | null {
    const v = s[key];
    if (v === undefined) return null;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0) throw this.fail(job, `${ctx.ptr}/${key}`, `'${key}' must be a non-negative integer.`);
    return v;
  }

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
