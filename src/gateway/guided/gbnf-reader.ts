/**
 * Reading llama.cpp's GBNF dialect (a client's `grammar`) into rules of {@link Item}s, strictly: `name ::=
 * alternatives` rules (names of `a-z A-Z 0-9 -`), a newline ends a rule outside parentheses, `#` comments,
 * `"literals"` and `[classes]` (`^` negates, `a-z` ranges) with llama.cpp's escapes only, `.`, groups, `|`,
 * `* + ? {m} {m,} {m,n}`. Token references (`<...>`) and groups deeper than 64 are refused. What the rules mean
 * together (root, references, recursion) is user-grammar.ts's question.
 */
import { MAX_GROUP_DEPTH } from "./gbnf-limits.js";
import { type CharSet, charSet, HEX_WIDTH, MAX_CODE_POINT, negate } from "./gbnf-text.js";

/** One item of a sequence: a literal, a class (code-point set), a rule reference, a group or a repetition. */
export type Item =
  | { kind: "lit"; text: string }
  | { kind: "class"; set: CharSet }
  | { kind: "ref"; name: string }
  | { kind: "group"; alts: Item[][] }
  | { kind: "rep"; item: Item; min: number; max: number | null };

/** The escapes llama.cpp's parser knows, by their letter. */
const SIMPLE_ESCAPES: Readonly<Record<string, number>> = { t: 9, r: 13, n: 10, "\\": 0x5c, '"': 0x22, "[": 0x5b, "]": 0x5d };
/** Whether `c` may be part of a rule name (`a-z A-Z 0-9 -`, as llama.cpp's). */
function isNameChar(c: string | undefined): boolean {
  if (c === undefined) return false;
  const x = c.charCodeAt(0);
  return (x >= 0x61 && x <= 0x7a) || (x >= 0x41 && x <= 0x5a) || (x >= 0x30 && x <= 0x39) || x === 0x2d;
}

/**
 * Longest client grammar read (characters). Far above hand-written grammars (llama.cpp's JSON grammar is ~1 K, its C
 * grammar ~3 K) and small enough that reading and checking one stays in the tens of milliseconds.
 */
export const MAX_USER_GRAMMAR_CHARS = 64 * 1024;

/** A grammar the client sent that cannot be applied; `message` says why (without the field). */
export class GrammarProblem extends Error {}

/** Reader of llama.cpp's GBNF into rules (name → alternatives), in definition order. */
export class Reader {
  /** Read position (UTF-16 index into the text). */
  private i = 0;
  /** Group nesting at the read position. */
  private depth = 0;
  readonly rules = new Map<string, Item[][]>();

  constructor(private readonly s: string) {}

  private fail(why: string): never {
    const line = this.s.slice(0, this.i).split("\n").length;
    throw new GrammarProblem(`syntax error at line ${line}: ${why}`);
  }

  /** Skips spaces, tabs and comments (and newlines when `newlines`). */
  private space(newlines: boolean): void {
    while (this.i < this.s.length) {
      const c = this.s[this.i]!;
      if (c === "#") while (this.i < this.s.length && this.s[this.i] !== "\n" && this.s[this.i] !== "\r") this.i++;
      else if (c === " " || c === "\t" || (newlines && (c === "\n" || c === "\r"))) this.i++;
      else return;
    }
  }

  private name(): string {
    const start = this.i;
    while (isNameChar(this.s[this.i])) this.i++;
    if (this.i === start) this.fail(`expected a rule name, got ${JSON.stringify(this.s.slice(this.i, this.i + 10))}`);
    return this.s.slice(start, this.i);
  }

  /** Reads every rule. */
  read(): Map<string, Item[][]> {
    this.space(true);
    if (this.i >= this.s.length) throw new GrammarProblem("the grammar defines no rule");
    while (this.i < this.s.length) {
      // 1. `name ::=`, 2. its alternatives, 3. the end of the line.
      const name = this.name();
      this.space(false);
      if (!this.s.startsWith("::=", this.i)) this.fail(`expected '::=' after rule name '${name}'`);
      this.i += 3;
      this.space(true);
      const alts = this.alternates(false);
      if (this.rules.has(name)) this.fail(`rule '${name}' is defined twice`);
      this.rules.set(name, alts);
      const c = this.s[this.i];
      if (c !== undefined && c !== "\n" && c !== "\r") this.fail(`unexpected ${JSON.stringify(c)}`);
      this.space(true);
    }
    return this.rules;
  }

  private alternates(nested: boolean): Item[][] {
    const alts = [this.sequence(nested)];
    while (this.s[this.i] === "|") {
      this.i++;
      this.space(true);
      alts.push(this.sequence(nested));
    }
    return alts;
  }

  private sequence(nested: boolean): Item[] {
    const items: Item[] = [];
    for (;;) {
      const c = this.s[this.i];
      let item: Item;
      if (c === '"') item = { kind: "lit", text: this.literal() };
      else if (c === "[") item = { kind: "class", set: this.charClass() };
      else if (c === ".") {
        this.i++;
        item = { kind: "class", set: charSet([[0, MAX_CODE_POINT]]) };
      } else if (c === "(") {
        this.i++;
        if (++this.depth > MAX_GROUP_DEPTH) throw new GrammarProblem(`groups nest deeper than ${MAX_GROUP_DEPTH} (limit ${MAX_GROUP_DEPTH})`);
        this.space(true);
        const alts = this.alternates(true);
        if (this.s[this.i] !== ")") this.fail("expected ')'");
        this.i++;
        this.depth--;
        item = { kind: "group", alts };
      } else if (c === "<") {
        this.fail("token references (<...>) are not supported; spell the token's text as a literal");
      } else if (isNameChar(c)) {
        // A name followed by `::=` starts the next rule (llama.cpp reads a newline first; so do we, below).
        item = { kind: "ref", name: this.name() };
      } else break;
      items.push(this.postfix(item));
      this.space(nested);
    }
    return items;
  }

  private postfix(item: Item): Item {
    const c = this.s[this.i];
    if (c === "*" || c === "+" || c === "?") {
      this.i++;
      return { kind: "rep", item, min: c === "+" ? 1 : 0, max: c === "?" ? 1 : null };
    }
    if (c !== "{") return item;
    this.i++;
    this.space(false);
    const min = this.integer();
    let max: number | null = min;
    this.space(false);
    if (this.s[this.i] === ",") {
      this.i++;
      this.space(false);
      max = /[0-9]/.test(this.s[this.i] ?? "") ? this.integer() : null;
      this.space(false);
    }
    if (this.s[this.i] !== "}") this.fail("expected '}' closing a repetition");
    this.i++;
    if (max !== null && max < min) this.fail(`repetition {${min},${max}} has its maximum below its minimum`);
    return { kind: "rep", item, min, max };
  }

  private integer(): number {
    const m = /^[0-9]{1,9}/.exec(this.s.slice(this.i, this.i + 10));
    if (!m) this.fail("expected a number in a repetition");
    this.i += m[0].length;
    return Number(m[0]);
  }

  /** One (possibly escaped) code point inside a literal or class. */
  private char(what: string): number {
    const c = this.s.codePointAt(this.i);
    if (c === undefined) this.fail(`unterminated ${what}`);
    if (c !== 0x5c) {
      this.i += c > 0xffff ? 2 : 1;
      return c;
    }
    const e = this.s[this.i + 1] ?? "";
    this.i += 2;
    if (e in SIMPLE_ESCAPES) return SIMPLE_ESCAPES[e]!;
    const width = HEX_WIDTH[e];
    const digits = width === undefined ? "" : this.s.slice(this.i, this.i + width);
    if (width === undefined || digits.length !== width || !/^[0-9a-fA-F]+$/.test(digits)) this.fail(`unknown escape '\\${e}'`);
    this.i += width;
    const cp = parseInt(digits, 16);
    if (cp > MAX_CODE_POINT) this.fail(`escape '\\${e}${digits}' is not a code point`);
    return cp;
  }

  private literal(): string {
    this.i++;
    let out = "";
    while (this.s[this.i] !== '"') {
      if (this.s[this.i] === undefined) this.fail("unterminated string");
      out += String.fromCodePoint(this.char("string"));
    }
    this.i++;
    return out;
  }

  private charClass(): CharSet {
    this.i++;
    const negated = this.s[this.i] === "^";
    if (negated) this.i++;
    const ranges: Array<[number, number]> = [];
    while (this.s[this.i] !== "]") {
      if (this.s[this.i] === undefined) this.fail("unterminated character class");
      const lo = this.char("character class");
      let hi = lo;
      if (this.s[this.i] === "-" && this.s[this.i + 1] !== "]" && this.s[this.i + 1] !== undefined) {
        this.i++;
        hi = this.char("character class");
        if (hi < lo) this.fail(`character range ${String.fromCodePoint(lo)}-${String.fromCodePoint(hi)} is reversed`);
      }
      ranges.push([lo, hi]);
    }
    this.i++;
    const set = negated ? negate(charSet(ranges)) : charSet(ranges);
    if (set.length === 0) this.fail("a character class that matches no character");
    return set;
  }
}
