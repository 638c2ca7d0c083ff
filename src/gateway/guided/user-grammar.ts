/**
 * A client's GBNF grammar (llama.cpp's `grammar`, vLLM's `structured_outputs.grammar`), read strictly and re-written
 * in Keel's own GBNF under prefixed rule names, so what reaches an engine is text Keel wrote: llama.cpp parses it
 * and the OpenVINO worker's reader (gbnf_parse.py) takes every construct it holds.
 *
 * Dialect (llama.cpp's): `name ::= alternatives` rules (names of `a-z A-Z 0-9 -`), a newline ends a rule outside
 * parentheses, `#` comments, `"literals"` and `[classes]` (`^` negates, `a-z` ranges) with the escapes `\x`, `\u`,
 * `\U`, `\t`, `\r`, `\n`, `\\`, `\"`, `\[`, `\]`, `.` (any character), groups, `|`, and `* + ? {m} {m,} {m,n}`.
 * The grammar starts at `root`.
 *
 * Refused with a 400 naming the field (before anything reaches the engine): a syntax error (with its line), token
 * references (`<...>`), a missing `root`, an undefined or twice-defined rule, an empty class, a rule that derives no
 * finite text, left recursion and an unbounded repetition of something that can match nothing (llama.cpp refuses
 * both), groups nested deeper than 64, a text longer than 64 K characters, and the size and repetition limits every
 * Keel grammar has (gbnf-limits.ts; 256 K characters counted with repetitions expanded).
 */
import { invalidValue, type KeelHttpError } from "../http/errors.js";
import { bodyProblem } from "./gbnf-limits.js";
import { GrammarProblem, type Item, MAX_USER_GRAMMAR_CHARS, Reader } from "./gbnf-reader.js";
import { classOf, literal } from "./gbnf-text.js";
import type { GbnfBuilder } from "./json-schema-gbnf.js";

export { MAX_USER_GRAMMAR_CHARS } from "./gbnf-reader.js";

/** Prefix of the client's rules in the emitted grammar (no Keel rule starts with it). */
export const USER_RULE_PREFIX = "gr-";

/** Calls `f` on every item of `alts`, nested ones included (iteratively over groups and repetitions). */
function eachItem(alts: Item[][], f: (item: Item) => void): void {
  const stack: Item[][][] = [alts];
  while (stack.length > 0) {
    for (const seq of stack.pop()!) {
      for (let item of seq) {
        f(item);
        // A repetition's item, then a group's alternatives (pushed for later).
        if (item.kind === "rep") {
          item = item.item;
          f(item);
        }
        if (item.kind === "group") stack.push(item.alts);
      }
    }
  }
}

/** Rules reachable from `root`, in definition order; throws for an undefined reference. */
function reachable(rules: Map<string, Item[][]>): Set<string> {
  const seen = new Set<string>(["root"]);
  const todo = ["root"];
  while (todo.length > 0) {
    const name = todo.pop()!;
    eachItem(rules.get(name)!, (item) => {
      if (item.kind !== "ref" || seen.has(item.name)) return;
      if (!rules.has(item.name)) throw new GrammarProblem(`rule '${name}' refers to the undefined rule '${item.name}'`);
      seen.add(item.name);
      todo.push(item.name);
    });
  }
  return new Set([...rules.keys()].filter((n) => seen.has(n)));
}

/** An item's dependency for a property: known true/false, or the symbol (rule or group) it depends on. */
type Dep = boolean | number;

/**
 * The grammar as symbols for the fixed points: every reachable rule, then every group inside them (a group is a
 * symbol of its own, so no property needs a recursive walk), each with its alternatives.
 */
class Symbols {
  /** Alternatives per symbol. */
  readonly alts: Item[][][] = [];
  /** Symbol of each rule name. */
  readonly ofRule = new Map<string, number>();
  /** Symbol of each group item. */
  readonly ofGroup = new Map<Item, number>();

  constructor(names: Set<string>, rules: Map<string, Item[][]>) {
    for (const name of names) {
      this.ofRule.set(name, this.alts.length);
      this.alts.push(rules.get(name)!);
    }
    for (const name of names) {
      eachItem(rules.get(name)!, (item) => {
        if (item.kind !== "group") return;
        this.ofGroup.set(item, this.alts.length);
        this.alts.push(item.alts);
      });
    }
  }

  /**
   * Least fixed point of a property over the symbols, in linear time (each sequence counts the symbols it still
   * waits for; a symbol proven wakes the sequences waiting on it): which can match the empty text, which derive
   * some finite text. `leaf` says what a literal or class contributes. Returns the property of any item.
   */
  solve(leaf: (item: Extract<Item, { kind: "lit" | "class" }>) => boolean): (item: Item) => boolean {
    const dep = (item: Item): Dep => {
      switch (item.kind) {
        case "ref":
          return this.ofRule.get(item.name)!;
        case "group":
          return this.ofGroup.get(item)!;
        case "rep":
          return item.min === 0 ? true : dep(item.item);
        default:
          return leaf(item);
      }
    };
    const known = this.alts.map(() => false);
    const waiting: Array<Array<{ sym: number; seq: number }>> = this.alts.map(() => []);
    const missing: number[][] = this.alts.map((alts) => alts.map(() => 0));
    const proven: number[] = [];
    const prove = (sym: number): void => {
      if (known[sym]) return;
      known[sym] = true;
      proven.push(sym);
    };
    // 1. Each sequence: impossible (a false item), or waiting for its distinct symbols.
    this.alts.forEach((alts, sym) =>
      alts.forEach((seq, q) => {
        const deps = new Set<number>();
        for (const item of seq) {
          const d = dep(item);
          if (d === false) return;
          if (typeof d === "number") deps.add(d);
        }
        missing[sym]![q] = deps.size;
        for (const d of deps) waiting[d]!.push({ sym, seq: q });
        if (deps.size === 0) prove(sym);
      }),
    );
    // 2. Propagate.
    while (proven.length > 0) {
      for (const w of waiting[proven.pop()!]!) if (--missing[w.sym]![w.seq]! === 0) prove(w.sym);
    }
    return (item) => {
      const d = dep(item);
      return typeof d === "boolean" ? d : known[d]!;
    };
  }
}

/** Whether an item can match the empty text. */
type Nullable = (item: Item) => boolean;

/** The rules an item may start with (before consuming a character). */
function leftRefs(seq: Item[], nullable: Nullable, out: Set<string>): void {
  for (const item of seq) {
    if (item.kind === "ref") out.add(item.name);
    else if (item.kind === "group") for (const s of item.alts) leftRefs(s, nullable, out);
    else if (item.kind === "rep") leftRefs([item.item], nullable, out);
    if (!nullable(item)) return;
  }
}

/** Throws for left recursion (a rule that can reach itself before any character), as llama.cpp refuses it. */
function checkLeftRecursion(names: Set<string>, rules: Map<string, Item[][]>, nullable: Nullable): void {
  const edges = new Map<string, string[]>();
  for (const name of names) {
    const out = new Set<string>();
    for (const seq of rules.get(name)!) leftRefs(seq, nullable, out);
    edges.set(name, [...out]);
  }
  // Iterative depth-first search: 1 = on the current path, 2 = done.
  const state = new Map<string, 1 | 2>();
  for (const start of names) {
    if (state.has(start)) continue;
    const stack: Array<{ name: string; next: number }> = [{ name: start, next: 0 }];
    state.set(start, 1);
    while (stack.length > 0) {
      const top = stack[stack.length - 1]!;
      const succ = edges.get(top.name)![top.next++];
      if (succ === undefined) {
        state.set(top.name, 2);
        stack.pop();
      } else if (state.get(succ) === 1) {
        throw new GrammarProblem(`rule '${succ}' is left-recursive (it can reach itself before matching a character)`);
      } else if (!state.has(succ)) {
        state.set(succ, 1);
        stack.push({ name: succ, next: 0 });
      }
    }
  }
}

/** Throws for `* + {m,}` over an item that can match nothing (llama.cpp's expansion would be left-recursive). */
function checkRepetitions(names: Set<string>, rules: Map<string, Item[][]>, nullable: Nullable): void {
  for (const name of names) {
    eachItem(rules.get(name)!, (item) => {
      if (item.kind === "rep" && item.max === null && nullable(item.item)) {
        throw new GrammarProblem(`rule '${name}' repeats without bound something that can match nothing`);
      }
    });
  }
}

/** Keel's GBNF for an item (rule names prefixed). */
function emitItem(item: Item): string {
  switch (item.kind) {
    case "lit":
      return literal(item.text);
    case "class":
      return classOf(item.set);
    case "ref":
      return USER_RULE_PREFIX + item.name;
    case "group":
      return `(${emitAlts(item.alts)})`;
    case "rep": {
      const inner = item.item.kind === "group" || item.item.kind === "ref" || item.item.kind === "class" ? emitItem(item.item) : `(${emitItem(item.item)})`;
      if (item.max === null) return item.min === 0 ? `${inner}*` : item.min === 1 ? `${inner}+` : `${inner}{${item.min},}`;
      if (item.min === 0 && item.max === 1) return `${inner}?`;
      if (item.max === 0) return '""';
      return item.min === item.max ? `${inner}{${item.min}}` : `${inner}{${item.min},${item.max}}`;
    }
  }
}

function emitAlts(alts: Item[][]): string {
  return alts.map((seq) => (seq.length === 0 ? '""' : seq.map(emitItem).join(" "))).join(" | ");
}

/**
 * Reads, checks and adds the client's grammar `text` (request field `field`) to `b`; returns the name of its root
 * rule. Throws a KeelHttpError 400 `invalid_value` naming `field` for anything in the module comment.
 */
export function addUserGrammar(b: GbnfBuilder, text: string, field: string): string {
  const fail = (why: string): KeelHttpError => invalidValue(field, `Invalid grammar in '${field}': ${why}.`);
  if (text.length > MAX_USER_GRAMMAR_CHARS) throw fail(`the grammar is longer than ${MAX_USER_GRAMMAR_CHARS} characters (limit ${MAX_USER_GRAMMAR_CHARS})`);
  try {
    // 1. Read; 2. the rules root reaches (undefined references refused); 3. what llama.cpp would refuse or loop on.
    const rules = new Reader(text).read();
    if (!rules.has("root")) throw new GrammarProblem("the grammar has no 'root' rule (generation starts there)");
    const names = reachable(rules);
    const symbols = new Symbols(names, rules);
    const productive = symbols.solve(() => true);
    const barren = [...names].find((n) => !productive({ kind: "ref", name: n }));
    if (barren !== undefined) throw new GrammarProblem(`rule '${barren}' derives no finite text`);
    const nullable = symbols.solve((item) => item.kind === "lit" && item.text === "");
    checkRepetitions(names, rules, nullable);
    checkLeftRecursion(names, rules, nullable);
    // 4. Keel's text, rule by rule, under the limits every grammar has.
    b.lastParam = field;
    for (const name of names) {
      const body = emitAlts(rules.get(name)!);
      const problem = bodyProblem(body);
      if (problem !== null) throw new GrammarProblem(`rule '${name}': ${problem}`);
      b.define(USER_RULE_PREFIX + name, body);
    }
    return USER_RULE_PREFIX + "root";
  } catch (e) {
    if (e instanceof GrammarProblem) throw fail(e.message);
    if (e instanceof RangeError) throw fail("the grammar is too deeply nested");
    throw e;
  }
}
