/**
 * Scalar schemas → GBNF: strings (pattern, format, lengths), numbers and integers with bounds, for
 * {@link GbnfBuilder} (json-schema-gbnf.ts holds the semantics).
 */
import { FORMATS } from "./formats-gbnf.js";
import { type Bound, integerRange, numberRange } from "./number-range.js";
import { MAX_REPEAT, PatternError, patternToGbnf, type CharMode, RAW_ANY } from "./pattern-gbnf.js";
import { bodyProblem } from "./gbnf-limits.js";
import { MAX_DIGITS, type Ctx, type SchemaJob, type JsonSchema } from "./json-schema-support.js";
import type { GbnfBuilder } from "./json-schema-gbnf.js";

export function stringRule(b: GbnfBuilder, job: SchemaJob, s: JsonSchema, ctx: Ctx, mode: CharMode): string {
  const quote = (content: string) => (mode === "json" ? `"\\"" ${content} "\\""` : content);
  const anyChar = mode === "json" ? b.primitive("json-char") : RAW_ANY;
  const hasLen = "minLength" in s || "maxLength" in s;
  if ("pattern" in s || "format" in s) {
    if (hasLen) throw b.fail(job, ctx.ptr, "'minLength'/'maxLength' together with 'pattern' or 'format' is not supported.", true);
    if ("pattern" in s && "format" in s) throw b.fail(job, ctx.ptr, "'pattern' together with 'format' is not supported.", true);
  }
  if ("pattern" in s) {
    if (typeof s.pattern !== "string") throw b.fail(job, `${ctx.ptr}/pattern`, "'pattern' must be a string.");
    try {
      const gbnf = patternToGbnf(s.pattern, mode, anyChar);
      // Checked here too, so the 400 names the pattern's pointer (define() would only know the request field).
      const problem = bodyProblem(gbnf);
      if (problem !== null) throw b.fail(job, `${ctx.ptr}/pattern`, `${problem}.`, true);
      const body = b.define(b.fresh(job.prefix, "pattern"), gbnf);
      return quote(body);
    } catch (e) {
      if (e instanceof PatternError) throw b.fail(job, `${ctx.ptr}/pattern`, `${e.message}.`, !e.invalidRegex);
      throw e;
    }
  }
  if ("format" in s) {
    const f = FORMATS[String(s.format)];
    if (f === undefined) {
      throw b.fail(job, `${ctx.ptr}/format`, `the format ${JSON.stringify(s.format)} is not supported (supported: ${Object.keys(FORMATS).join(", ")}).`, true);
    }
    const name = `fmt-${String(s.format)}`;
    b.define(name, f);
    return quote(name);
  }
  if (hasLen) {
    const min = b.count(job, s, "minLength", ctx) ?? 0;
    const max = b.count(job, s, "maxLength", ctx);
    if (max !== null && max < min) throw b.fail(job, ctx.ptr, "'maxLength' is below 'minLength'.");
    if (min > MAX_REPEAT || (max !== null && max > MAX_REPEAT)) throw b.fail(job, ctx.ptr, `string lengths above ${MAX_REPEAT} are not supported.`, true);
    const c = mode === "json" ? b.primitive("json-char-cp") : `(${anyChar})`;
    // A rule of its own, so that a container repeating or skipping this value repeats one reference.
    return b.define(b.fresh(job.prefix, "string"), quote(max === null ? `${c}{${min},}` : `${c}{${min},${max}}`));
  }
  return mode === "json" ? b.primitive("json-string") : b.primitive("raw-text");
}

/** A number; with bounds, spelled without exponent (see number-range.ts). */
export function numberRule(b: GbnfBuilder, job: SchemaJob, s: JsonSchema, ctx: Ctx): string {
  const bound = (k: string): number | null => {
    const v = s[k];
    if (v === undefined || typeof v === "boolean") return null;
    if (typeof v !== "number" || !Number.isFinite(v)) throw b.fail(job, `${ctx.ptr}/${k}`, `'${k}' must be a number.`);
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
  if (lo === null && hi === null) return b.primitive("json-number");
  if (lo !== null && hi !== null && (lo.value > hi.value || (lo.value === hi.value && (lo.exclusive || hi.exclusive)))) {
    throw b.fail(job, ctx.ptr, "the number bounds admit no value.", true);
  }
  const expr = numberRange(lo, hi);
  if (expr === null) throw b.fail(job, ctx.ptr, "the number bounds admit no value (within 16 integral digits).", true);
  return b.define(b.fresh(job.prefix, "number"), expr);
}

export function integerRule(b: GbnfBuilder, job: SchemaJob, s: JsonSchema, ctx: Ctx): string {
  const limit = 10n ** BigInt(MAX_DIGITS) - 1n;
  let lo = -limit;
  let hi = limit;
  const bound = (k: string): number | null => {
    const v = s[k];
    if (v === undefined) return null;
    if (typeof v !== "number" || !Number.isFinite(v)) throw b.fail(job, `${ctx.ptr}/${k}`, `'${k}' must be a number.`);
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
  if (lo > hi) throw b.fail(job, ctx.ptr, "the integer bounds admit no value (within 16 digits).", true);
  if (lo === -limit && hi === limit) return b.primitive("json-int");
  return `(${integerRange(lo, hi)})`;
}
