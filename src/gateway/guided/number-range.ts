/**
 * Numeric ranges as GBNF: integers digit by digit ({@link integerRange}), and JSON numbers within bounds (`minimum`/`maximum`, exclusive forms; bounds may be fractional), written
 * without an exponent (a bounded number is spelled `-?I(.F)?`, at most 16 integral digits). Comparison is decimal
 * on the written text, so it agrees with a validator up to double rounding of 17+ significant digits.
 *
 * A magnitude range [A, B] is split on the integral part: strictly between the bounds' integral parts any fraction
 * goes; on a bound's own integral part the fraction digits are compared digit by digit with the bound's.
 */
import { literal } from "./gbnf-text.js";

/** Largest integral part, in digits. */
const MAX_DIGITS = 16;
const INT_LIMIT = 10n ** BigInt(MAX_DIGITS) - 1n;

/** A set of fraction digit strings: a GBNF expression for the non-empty ones (null: none) and whether "" is in. */
interface Frac {
  expr: string | null;
  empty: boolean;
}

const ANY_FRAC: Frac = { expr: "[0-9]+", empty: true };
/** Non-empty digit strings with a non-zero digit (0.f > 0). */
const NONZERO = "[0-9]* [1-9] [0-9]*";

/** `d` followed by a member of `r`. */
function prepend(d: string, r: Frac): string | null {
  if (r.expr === null) return r.empty ? literal(d) : null;
  return r.empty ? `${literal(d)} (${r.expr})?` : `${literal(d)} (${r.expr})`;
}

function alts(...xs: Array<string | null>): string | null {
  const kept = xs.filter((x): x is string => x !== null);
  return kept.length === 0 ? null : kept.join(" | ");
}

const digitClass = (lo: number, hi: number) => (lo > hi ? null : lo === hi ? literal(String(lo)) : `[${lo}-${hi}]`);

/** { f : 0.f ≥ 0.b } (or > when `ex`); `b` has no trailing zeros. */
function fracGE(b: string, ex: boolean): Frac {
  if (b === "") return ex ? { expr: NONZERO, empty: false } : ANY_FRAC;
  const d = Number(b[0]);
  const higher = d < 9 ? `${digitClass(d + 1, 9)} [0-9]*` : null;
  return { expr: alts(higher, prepend(b[0]!, fracGE(b.slice(1), ex))), empty: false };
}

/** { f : 0.f ≤ 0.b } (or < when `ex`). */
function fracLE(b: string, ex: boolean): Frac {
  if (b === "") return ex ? { expr: null, empty: false } : { expr: '"0"+', empty: true };
  const d = Number(b[0]);
  const lower = d > 0 ? `${digitClass(0, d - 1)} [0-9]*` : null;
  return { expr: alts(lower, prepend(b[0]!, fracLE(b.slice(1), ex))), empty: true };
}

/** { f : 0.a ≤ 0.f ≤ 0.b } with exclusivity per side; 0.a ≤ 0.b. */
function fracBetween(a: string, b: string, exA: boolean, exB: boolean): Frac {
  if (a === "" && b === "") return exA || exB ? { expr: null, empty: false } : { expr: '"0"+', empty: true };
  const a0 = Number(a[0] ?? "0");
  const b0 = Number(b[0] ?? "0");
  const empty = a === "" && !exA; // 0 ≥ 0.a; and 0 ≤ 0.b holds (b non-empty here)
  if (a0 === b0) return { expr: prepend(String(a0), fracBetween(a.slice(1), b.slice(1), exA, exB)), empty };
  const low = prepend(String(a0), fracGE(a.slice(1), exA));
  const mid = b0 - a0 >= 2 ? `${digitClass(a0 + 1, b0 - 1)} [0-9]*` : null;
  const high = prepend(String(b0), fracLE(b.slice(1), exB));
  return { expr: alts(low, mid, high), empty };
}

/** Integral part `I` (GBNF) followed by an optional/mandatory `.F`. */
function withFrac(intExpr: string, f: Frac): string | null {
  if (f.expr === null) return f.empty ? `(${intExpr})` : null;
  return f.empty ? `(${intExpr}) ("." (${f.expr}))?` : `(${intExpr}) "." (${f.expr})`;
}

/** A non-negative decimal bound: integral part and fraction digits (no trailing zeros). */
interface Dec {
  int: bigint;
  frac: string;
}

/** Decimal form of a finite non-negative JS number (its shortest round-trip spelling, exponent expanded). */
export function toDec(v: number): Dec {
  let s = String(Math.abs(v));
  const m = /^(\d+)(?:\.(\d+))?e([+-]\d+)$/.exec(s);
  if (m) {
    const digits = m[1]! + (m[2] ?? "");
    const point = m[1]!.length + Number(m[3]);
    s = point <= 0 ? `0.${"0".repeat(-point)}${digits}` : point >= digits.length ? digits + "0".repeat(point - digits.length) : `${digits.slice(0, point)}.${digits.slice(point)}`;
  }
  const [i, f = ""] = s.split(".");
  return { int: BigInt(i!), frac: f.replace(/0+$/, "") };
}

/**
 * Magnitudes m with A ≤ m ≤ B (exclusive per flag; B null = unbounded), spelled `I(.F)?`. Returns null when empty.
 */
function magnitude(A: Dec, exA: boolean, B: Dec | null, exB: boolean): string | null {
  const intLit = (n: bigint) => literal(n.toString());
  if (B !== null && A.int === B.int) return withFrac(intLit(A.int), fracBetween(A.frac, B.frac, exA, exB));
  const out: Array<string | null> = [withFrac(intLit(A.int), fracGE(A.frac, exA))];
  const top = B === null ? INT_LIMIT : B.int - 1n;
  if (A.int + 1n <= top) out.push(withFrac(uintRange(A.int + 1n, top).join(" | "), ANY_FRAC));
  if (B !== null) out.push(withFrac(intLit(B.int), fracLE(B.frac, exB)));
  return alts(...out);
}

/** A bound of a number range: value and exclusivity. */
export interface Bound {
  value: number;
  exclusive: boolean;
}

/** GBNF for JSON numbers x with lo ≤ x ≤ hi (null = unbounded); null when no number qualifies. */
export function numberRange(lo: Bound | null, hi: Bound | null): string | null {
  const zero: Dec = { int: 0n, frac: "" };
  // Beyond 16 integral digits: an upper bound is no bound; a lower bound leaves nothing on its side.
  const huge = (b: Bound | null) => b !== null && toDec(b.value).int > INT_LIMIT;
  if (huge(hi)) hi = null;
  if (huge(lo)) lo = null;
  const parts: Array<string | null> = [];
  // 1. x ≥ 0 part: magnitudes in [max(lo, 0), hi].
  if (hi === null || hi.value > 0 || (hi.value === 0 && !hi.exclusive)) {
    const from = lo !== null && lo.value >= 0 ? toDec(lo.value) : zero;
    const exFrom = lo !== null && lo.value >= 0 ? lo.exclusive : false;
    parts.push(magnitude(from, exFrom, hi === null ? null : toDec(hi.value), hi?.exclusive ?? false));
  }
  // 2. x < 0 part: "-" magnitudes in (max(-hi, 0), -lo].
  if (lo === null || lo.value < 0) {
    const from = hi !== null && hi.value < 0 ? toDec(hi.value) : zero;
    const exFrom = hi !== null && hi.value < 0 ? hi.exclusive : true;
    const m = magnitude(from, exFrom, lo === null ? null : toDec(lo.value), lo?.exclusive ?? false);
    parts.push(m === null ? null : `"-" (${m})`);
  }
  return alts(...parts);
}

// ---------------------------------------------------------------- integers

/** GBNF alternatives for the integers in [lo, hi] (JSON spelling: no leading zeros, no "-0"). */
export function integerRange(lo: bigint, hi: bigint): string {
  const alts: string[] = [];
  if (hi >= 0n) alts.push(...uintRange(lo > 0n ? lo : 0n, hi));
  if (lo < 0n) {
    const mags = uintRange(hi < -1n ? -hi : 1n, -lo);
    alts.push(`"-" (${mags.join(" | ")})`);
  }
  return alts.join(" | ");
}

/** Alternatives for non-negative integers in [a, b], split by digit count. */
export function uintRange(a: bigint, b: bigint): string[] {
  const out: string[] = [];
  const la = a.toString().length;
  const lb = b.toString().length;
  for (let len = la; len <= lb; len++) {
    const floor = len === 1 ? 0n : 10n ** BigInt(len - 1);
    const ceil = 10n ** BigInt(len) - 1n;
    const x = a > floor ? a : floor;
    const y = b < ceil ? b : ceil;
    if (x <= y) out.push(sameLength(x.toString(), y.toString()));
  }
  return out;
}

/** GBNF for the decimal strings of equal length n between `lo` and `hi` (inclusive), digit by digit. */
function sameLength(lo: string, hi: string): string {
  if (lo === hi) return literal(lo);
  const n = lo.length;
  if (n === 1) return `[${lo}-${hi}]`;
  const restLo = lo.slice(1);
  const restHi = hi.slice(1);
  const anyRest = `[0-9]{${n - 1}}`;
  if (lo[0] === hi[0]) return `"${lo[0]}" (${sameLength(restLo, restHi)})`;
  if (/^0+$/.test(restLo) && /^9+$/.test(restHi)) return `[${lo[0]}-${hi[0]}] ${anyRest}`;
  const alts: string[] = [];
  const d0 = Number(lo[0]);
  const d1 = Number(hi[0]);
  alts.push(`"${d0}" (${sameLength(restLo, "9".repeat(n - 1))})`);
  if (d1 - d0 >= 2) alts.push(`[${d0 + 1}-${d1 - 1}] ${anyRest}`);
  alts.push(`"${d1}" (${sameLength("0".repeat(n - 1), restHi)})`);
  return alts.join(" | ");
}
