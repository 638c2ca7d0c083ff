/**
 * TEST SUPPORT ONLY: a small GBNF recogniser for the subset Keel emits (literals, classes, rule references, groups,
 * alternation, `* + ? {m} {m,} {m,n}`), over code points, with llama.cpp's meaning (a string is accepted when some
 * derivation of the rule spans it exactly — not PEG's first match). It computes, for each (expression, position),
 * the set of positions where the expression can end, memoised; left recursion is reported as an error.
 */

/** A parsed GBNF expression. */
type Expr =
  | { kind: "lit"; cps: number[] }
  | { kind: "class"; negated: boolean; ranges: Array<[number, number]> }
  | { kind: "ref"; name: string }
  | { kind: "seq"; items: Expr[] }
  | { kind: "alt"; options: Expr[] }
  | { kind: "rep"; item: Expr; min: number; max: number | null };

/** Parsed grammar: rule name → expression. */
export class GbnfGrammar {
  /** Rules by name. */
  readonly rules = new Map<string, Expr>();

  constructor(text: string) {
    for (const line of text.split("\n")) {
      const t = line.trim();
      if (t === "" || t.startsWith("#")) continue;
      const m = /^([a-zA-Z0-9-]+)\s*::=(.*)$/.exec(t);
      if (!m) throw new Error(`bad rule line: ${t}`);
      const p = new ExprParser(m[2]!);
      const e = p.parseAlt();
      p.end();
      if (this.rules.has(m[1]!)) throw new Error(`rule ${m[1]} defined twice`);
      this.rules.set(m[1]!, e);
    }
    for (const [name, e] of this.rules) checkRefs(e, this.rules, name);
  }

  /** Whether `input` matches rule `rule` exactly. */
  accepts(rule: string, input: string): boolean {
    return new Matcher(this, Array.from(input, (c) => c.codePointAt(0)!)).ends(this.ref(rule), 0).has(Array.from(input).length);
  }

  /** A reference expression to rule `name` (which must exist). */
  private ref(name: string): Expr {
    if (!this.rules.has(name)) throw new Error(`no rule ${name}`);
    return { kind: "ref", name };
  }
}

function checkRefs(e: Expr, rules: Map<string, Expr>, where: string): void {
  switch (e.kind) {
    case "ref":
      if (!rules.has(e.name)) throw new Error(`rule ${where} refers to undefined ${e.name}`);
      return;
    case "seq":
      e.items.forEach((i) => checkRefs(i, rules, where));
      return;
    case "alt":
      e.options.forEach((i) => checkRefs(i, rules, where));
      return;
    case "rep":
      checkRefs(e.item, rules, where);
      return;
    default:
      return;
  }
}

class ExprParser {
  /** Code points of the rule body. */
  private readonly s: number[];
  /** Read position. */
  private i = 0;
  constructor(text: string) {
    this.s = Array.from(text, (c) => c.codePointAt(0)!);
  }
  private ws(): void {
    while (this.s[this.i] === 0x20 || this.s[this.i] === 0x09) this.i++;
  }
  end(): void {
    this.ws();
    if (this.i !== this.s.length) throw new Error(`trailing text at ${this.i}: ${String.fromCodePoint(...this.s.slice(this.i))}`);
  }
  parseAlt(): Expr {
    const options = [this.parseSeq()];
    this.ws();
    while (this.s[this.i] === 0x7c) {
      this.i++;
      options.push(this.parseSeq());
      this.ws();
    }
    return options.length === 1 ? options[0]! : { kind: "alt", options };
  }
  private parseSeq(): Expr {
    const items: Expr[] = [];
    for (;;) {
      this.ws();
      const c = this.s[this.i];
      if (c === undefined || c === 0x7c || c === 0x29) break;
      let atom: Expr;
      if (c === 0x22) atom = this.parseLiteral();
      else if (c === 0x5b) atom = this.parseClass();
      else if (c === 0x28) {
        this.i++;
        atom = this.parseAlt();
        this.ws();
        if (this.s[this.i] !== 0x29) throw new Error("missing )");
        this.i++;
      } else {
        const start = this.i;
        while (this.s[this.i] !== undefined && /[a-zA-Z0-9-]/.test(String.fromCodePoint(this.s[this.i]!))) this.i++;
        if (start === this.i) throw new Error(`unexpected ${String.fromCodePoint(c)} at ${this.i}`);
        atom = { kind: "ref", name: String.fromCodePoint(...this.s.slice(start, this.i)) };
      }
      items.push(this.parseQuant(atom));
    }
    return items.length === 1 ? items[0]! : { kind: "seq", items };
  }
  private parseQuant(atom: Expr): Expr {
    const c = this.s[this.i];
    if (c === 0x2a) return this.i++, { kind: "rep", item: atom, min: 0, max: null };
    if (c === 0x2b) return this.i++, { kind: "rep", item: atom, min: 1, max: null };
    if (c === 0x3f) return this.i++, { kind: "rep", item: atom, min: 0, max: 1 };
    if (c === 0x7b) {
      const m = /^\{(\d+)(,(\d*))?\}/.exec(String.fromCodePoint(...this.s.slice(this.i, this.i + 30)));
      if (!m) throw new Error("bad {m,n}");
      this.i += m[0].length;
      const min = Number(m[1]);
      const max = m[2] === undefined ? min : m[3] === "" ? null : Number(m[3]);
      return { kind: "rep", item: atom, min, max };
    }
    return atom;
  }
  private char(): number {
    const c = this.s[this.i++];
    if (c === undefined) throw new Error("unexpected end");
    if (c !== 0x5c) return c;
    const e = String.fromCodePoint(this.s[this.i++]!);
    const hexN = (n: number) => {
      const h = String.fromCodePoint(...this.s.slice(this.i, this.i + n));
      if (!/^[0-9a-fA-F]+$/.test(h) || h.length !== n) throw new Error("bad hex");
      this.i += n;
      return parseInt(h, 16);
    };
    switch (e) {
      case "x":
        return hexN(2);
      case "u":
        return hexN(4);
      case "U":
        return hexN(8);
      case "t":
        return 9;
      case "r":
        return 13;
      case "n":
        return 10;
      case "\\":
      case '"':
      case "[":
      case "]":
        return e.codePointAt(0)!;
      default:
        throw new Error(`unknown escape \\${e}`);
    }
  }
  private parseLiteral(): Expr {
    this.i++;
    const cps: number[] = [];
    while (this.s[this.i] !== 0x22) {
      if (this.s[this.i] === undefined) throw new Error("unterminated literal");
      cps.push(this.char());
    }
    this.i++;
    return { kind: "lit", cps };
  }
  private parseClass(): Expr {
    this.i++;
    let negated = false;
    if (this.s[this.i] === 0x5e) {
      negated = true;
      this.i++;
    }
    const ranges: Array<[number, number]> = [];
    while (this.s[this.i] !== 0x5d) {
      if (this.s[this.i] === undefined) throw new Error("unterminated class");
      const lo = this.char();
      if (this.s[this.i] === 0x2d && this.s[this.i + 1] !== 0x5d) {
        this.i++;
        ranges.push([lo, this.char()]);
      } else ranges.push([lo, lo]);
    }
    this.i++;
    return { kind: "class", negated, ranges };
  }
}

class Matcher {
  /** End positions per (expression, start). */
  private readonly memo = new Map<Expr, Map<number, Set<number>>>();
  /** (rule, start) pairs being computed: re-entry = left recursion. */
  private readonly active = new Set<string>();
  constructor(
    /** The grammar whose rules references resolve to. */
    private readonly g: GbnfGrammar,
    /** The text being matched, as code points. */
    private readonly input: number[],
  ) {}

  ends(e: Expr, pos: number): Set<number> {
    let byPos = this.memo.get(e);
    if (!byPos) this.memo.set(e, (byPos = new Map()));
    const known = byPos.get(pos);
    if (known) return known;
    const out = this.compute(e, pos);
    byPos.set(pos, out);
    return out;
  }

  private compute(e: Expr, pos: number): Set<number> {
    const out = new Set<number>();
    switch (e.kind) {
      case "lit": {
        for (let k = 0; k < e.cps.length; k++) if (this.input[pos + k] !== e.cps[k]) return out;
        out.add(pos + e.cps.length);
        return out;
      }
      case "class": {
        const c = this.input[pos];
        if (c === undefined) return out;
        const inSet = e.ranges.some(([a, b]) => c >= a && c <= b);
        if (inSet !== e.negated) out.add(pos + 1);
        return out;
      }
      case "ref": {
        const key = `${e.name}@${pos}`;
        if (this.active.has(key)) throw new Error(`left recursion through ${e.name}`);
        this.active.add(key);
        try {
          return this.ends(this.g.rules.get(e.name)!, pos);
        } finally {
          this.active.delete(key);
        }
      }
      case "seq": {
        let cur = new Set([pos]);
        for (const item of e.items) {
          const next = new Set<number>();
          for (const p of cur) for (const q of this.ends(item, p)) next.add(q);
          cur = next;
          if (cur.size === 0) break;
        }
        return cur;
      }
      case "alt": {
        for (const o of e.options) for (const q of this.ends(o, pos)) out.add(q);
        return out;
      }
      case "rep": {
        let frontier = new Set([pos]);
        if (e.min === 0) out.add(pos);
        const seen = new Set<string>();
        for (let n = 1; e.max === null || n <= e.max; n++) {
          const next = new Set<number>();
          for (const p of frontier) for (const q of this.ends(e.item, p)) if (q > p || e.max !== null) next.add(q);
          if (next.size === 0) break;
          if (n >= e.min) for (const q of next) out.add(q);
          const sig = [...next].sort((a, b) => a - b).join(",");
          if (e.max === null) {
            // Unbounded: stop once a frontier repeats (no new positions reachable).
            if (seen.has(sig)) break;
            seen.add(sig);
          }
          frontier = next;
        }
        return out;
      }
    }
  }
}

/**
 * TEST SUPPORT: random strings DERIVED from a grammar rule (the other direction of {@link GbnfGrammar.accepts}):
 * random alternatives, repetition counts and class members; past `maxDepth` nested rule references it takes the
 * shallowest way out so recursive grammars terminate.
 */
export class GbnfSampler {
  /** Least derivation height per rule (Infinity: cannot finish). */
  private readonly height = new Map<string, number>();

  constructor(
    /** The grammar sampled. */
    private readonly g: GbnfGrammar,
    /** Random source in [0, 1). */
    private readonly rand: () => number,
    /** Rule nesting after which the shallowest choices are taken. */
    private readonly maxDepth = 12,
  ) {
    // Fixpoint: a rule's height is 1 + the least height of its body.
    for (const name of g.rules.keys()) this.height.set(name, Infinity);
    for (let changed = true; changed; ) {
      changed = false;
      for (const [name, e] of g.rules) {
        const h = 1 + this.h(e);
        if (h < this.height.get(name)!) {
          this.height.set(name, h);
          changed = true;
        }
      }
    }
  }

  /** One random string of `rule`. */
  sample(rule: string): string {
    return String.fromCodePoint(...this.walk({ kind: "ref", name: rule }, 0));
  }

  private h(e: Expr): number {
    switch (e.kind) {
      case "lit":
      case "class":
        return 0;
      case "ref":
        return this.height.get(e.name)!;
      case "seq":
        return e.items.reduce((m, i) => Math.max(m, this.h(i)), 0);
      case "alt":
        return Math.min(...e.options.map((o) => this.h(o)));
      case "rep":
        return e.min === 0 ? 0 : this.h(e.item);
    }
  }

  private pick(n: number): number {
    return Math.floor(this.rand() * n);
  }

  private walk(e: Expr, depth: number): number[] {
    const deep = depth > this.maxDepth;
    switch (e.kind) {
      case "lit":
        return e.cps;
      case "class":
        return [this.member(e)];
      case "ref":
        return this.walk(this.g.rules.get(e.name)!, depth + 1);
      case "seq":
        return e.items.flatMap((i) => this.walk(i, depth));
      case "alt": {
        const finite = e.options.filter((o) => this.h(o) < Infinity);
        const best = Math.min(...finite.map((o) => this.h(o)));
        const pool = deep ? finite.filter((o) => this.h(o) === best) : finite;
        return this.walk(pool[this.pick(pool.length)]!, depth);
      }
      case "rep": {
        const cap = e.max ?? e.min + 4;
        const n = deep ? e.min : e.min + this.pick(Math.min(cap, e.min + 4) - e.min + 1);
        const out: number[] = [];
        for (let i = 0; i < n; i++) out.push(...this.walk(e.item, depth));
        return out;
      }
    }
  }

  /** A random member of a class: from its ranges, or (negated) from a fixed palette of varied characters. */
  private member(e: Extract<Expr, { kind: "class" }>): number {
    const inRanges = (c: number) => e.ranges.some(([a, b]) => c >= a && c <= b);
    if (!e.negated) {
      for (;;) {
        const [a, b] = e.ranges[this.pick(e.ranges.length)]!;
        const c = a + this.pick(Math.min(b - a + 1, 0x10000));
        if (c < 0xd800 || c > 0xdfff) return c; // lone surrogates never come out of UTF-8 tokens
      }
    }
    const palette = [0x61, 0x5a, 0x30, 0x20, 0x2d, 0x7b, 0x3c, 0x3e, 0x2f, 0xe9, 0x4e2d, 0x1f600, 0x7f, 0x0a, 0x22, 0x5c, 0x09];
    const ok = palette.filter((c) => !inRanges(c));
    if (ok.length === 0) throw new Error("class excludes the whole palette");
    return ok[this.pick(ok.length)]!;
  }
}
