/**
 * Container schemas → GBNF: objects (declared, optional and extra keys) and arrays (items, tuples, counts), for
 * {@link GbnfBuilder} (json-schema-gbnf.ts holds the semantics).
 */
import { charSet, jsonCharOf, literal, negate } from "./gbnf-text.js";
import { MAX_REPEAT } from "./pattern-gbnf.js";
import { type Ctx, type SchemaJob, type JsonSchema, finite, escapePointer } from "./json-schema-support.js";
import type { GbnfBuilder } from "./json-schema-gbnf.js";

/** An object schema: declared properties in order, required ones mandatory, then extra keys of `additionalProperties`. */
export function objectRule(b: GbnfBuilder, job: SchemaJob, s: JsonSchema, ctx: Ctx): string {
  const sp = b.primitive("space");
  const props = s.properties ?? {};
  if (typeof props !== "object" || props === null || Array.isArray(props)) throw b.fail(job, ctx.ptr, "'properties' must be an object.");
  const required = s.required ?? [];
  if (!Array.isArray(required) || required.some((r) => typeof r !== "string")) throw b.fail(job, ctx.ptr, "'required' must be an array of strings.");
  const names = Object.keys(props);
  for (const r of required as string[]) {
    if (!names.includes(r)) throw b.fail(job, ctx.ptr, `required property '${r}' is not declared in 'properties'.`, true);
  }
  const addl = s.additionalProperties;
  if ("minProperties" in s && (typeof s.minProperties !== "number" || s.minProperties > required.length)) {
    throw b.fail(job, ctx.ptr, "'minProperties' above the number of required properties is not supported.", true);
  }
  if ("maxProperties" in s && (typeof s.maxProperties !== "number" || s.maxProperties < names.length || (addl !== undefined && addl !== false))) {
    throw b.fail(job, ctx.ptr, "'maxProperties' below the number of declared properties is not supported.", true);
  }
  // Any object: no `properties` keyword and extra keys not restricted. (`properties: {}` declares none: `{}`.)
  if (!("properties" in s) && (addl === undefined || addl === true)) return b.primitive("json-object");
  const guarded: Ctx = { ...ctx, unguarded: new Set() };
  const req = new Set(required as string[]);
  // Optional properties whose schema has no finite value can never appear: left out.
  const declared = names;
  const live = names.filter((n) => req.has(n) || b.usable(job, (props as JsonSchema)[n]));
  for (const n of names) {
    if (!live.includes(n)) b.validateOnly(job, (props as JsonSchema)[n], { ...guarded, ptr: `${ctx.ptr}/properties/${escapePointer(n)}`, depth: ctx.depth + 1 }, "json");
  }
  const kv = live.map((name) => {
    const value = b.visit(job, (props as JsonSchema)[name], { ...guarded, ptr: `${ctx.ptr}/properties/${escapePointer(name)}`, depth: ctx.depth + 1 }, "json");
    return `${literal(JSON.stringify(name))} ${sp} ":" ${sp} ${value} ${sp}`;
  });
  let extra: string | null = null;
  const addlLive = addl !== undefined && addl !== false && b.usable(job, addl);
  if (addl !== undefined && addl !== false && !addlLive) b.validateOnly(job, addl, { ...guarded, ptr: `${ctx.ptr}/additionalProperties`, depth: ctx.depth + 1 }, "json");
  if (addlLive) {
    const value = addl === true ? b.primitive("json-value") : b.visit(job, addl, { ...guarded, ptr: `${ctx.ptr}/additionalProperties`, depth: ctx.depth + 1 }, "json");
    extra = b.define(b.fresh(job.prefix, "extra-kv"), `${otherKey(b, job, declared)} ${sp} ":" ${sp} ${value} ${sp}`);
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
    const n = i > 0 ? b.define(b.fresh(job.prefix, `obj-${i}n`), variant(false)) : "";
    const f = needFirst[i] ? b.define(b.fresh(job.prefix, `obj-${i}f`), variant(true)) : "";
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
/** A key other than the declared `names` (the keys of extra properties). */
export function otherKey(b: GbnfBuilder, job: SchemaJob, names: readonly string[]): string {
  const str = b.primitive("json-string");
  if (names.length === 0 || names.some((n) => /["\\\u0000-\u001f]/.test(n))) return str;
  const char = b.primitive("json-char");
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
    return b.define(b.fresh(job.prefix, "key"), alts.join(" | "));
  };
  return `"\\"" ${emit(root)}`;
}

/** `expr` as a rule reference: itself when it already is a rule name, else a new rule. */
/** An array schema: `prefixItems` / draft-7 tuple `items`, then `items`, within minItems..maxItems. */
export function arrayRule(b: GbnfBuilder, job: SchemaJob, s: JsonSchema, ctx: Ctx): string {
  const sp = b.primitive("space");
  const guarded: Ctx = { ...ctx, unguarded: new Set() };
  // Items are rule references: a repetition over an inline item would repeat the item's own generated rules too
  // (llama.cpp multiplies them against its threshold, see gbnf-limits.ts).
  const sub = (x: unknown, seg: string) => b.asRule(job, b.visit(job, x, { ...guarded, ptr: `${ctx.ptr}/${seg}`, depth: ctx.depth + 1 }, "json"), "item");
  if ("prefixItems" in s && !Array.isArray(s.prefixItems)) throw b.fail(job, `${ctx.ptr}/prefixItems`, "'prefixItems' must be an array of schemas.");
  let prefix: unknown[] = [];
  let rest: unknown = s.items ?? true;
  if (Array.isArray(s.prefixItems)) {
    prefix = s.prefixItems;
    rest = s.items ?? true;
  } else if (Array.isArray(s.items)) {
    prefix = s.items;
    rest = s.additionalItems ?? true;
  }
  const min = b.count(job, s, "minItems", ctx) ?? 0;
  const max = b.count(job, s, "maxItems", ctx);
  if (max !== null && max < min) throw b.fail(job, ctx.ptr, "'maxItems' is below 'minItems'.");
  if (min > MAX_REPEAT || (max !== null && max > MAX_REPEAT)) throw b.fail(job, ctx.ptr, `item counts above ${MAX_REPEAT} are not supported.`, true);
  // Items whose schema has no finite value end the array there (they can never be written).
  const dead = prefix.findIndex((p) => !b.usable(job, p));
  const pruned = dead >= 0 || (rest !== false && !b.usable(job, rest));
  if (pruned) {
    prefix.forEach((p, i) => i >= dead && dead >= 0 && b.validateOnly(job, p, { ...guarded, ptr: `${ctx.ptr}/items/${i}`, depth: ctx.depth + 1 }, "json"));
    if (rest !== false) b.validateOnly(job, rest, { ...guarded, ptr: `${ctx.ptr}/items`, depth: ctx.depth + 1 }, "json");
    if (dead >= 0) prefix = prefix.slice(0, dead);
    rest = false;
  }
  const k = max === null ? prefix.length : Math.min(prefix.length, max);
  const prefixRules = prefix.slice(0, k).map((p, i) => sub(p, `${Array.isArray(s.prefixItems) ? "prefixItems" : "items"}/${i}`));
  const restRule = rest === false ? null : sub(rest, Array.isArray(s.prefixItems) || !Array.isArray(s.items) ? "items" : "additionalItems");
  if (restRule === null && min > k) {
    throw b.fail(job, ctx.ptr, pruned ? "the schema admits no finite value (its required items cannot finish)." : "'minItems' exceeds the number of allowed items.", true);
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
      const more = b.define(b.fresh(job.prefix, "more"), `(${sep}${item(restRule)})${rep(Math.max(0, lo - 1), hi === null ? null : hi - 1)}`);
      tail = lo === 0 ? `(${item(restRule)} ${more})?` : `${item(restRule)} ${more}`;
    } else tail = b.define(b.fresh(job.prefix, "more"), `(${sep}${item(restRule)})${rep(lo, hi)}`);
  }
  // Prefix positions from the end: position i is mandatory below minItems. Each position is its own rule that
  // names the next, so a long tuple never nests groups (20000 nested optional groups crashed llama.cpp's parser).
  let body = tail;
  for (let i = k - 1; i >= 0; i--) {
    const one = `${i === 0 ? "" : sep}${item(prefixRules[i]!)} ${body}`;
    body = i < min ? one : `(${one})?`;
    if (i > 0) body = b.define(b.fresh(job.prefix, `prefix-${i}`), body);
  }
  const name = b.define(b.fresh(job.prefix, "items"), body);
  return `"[" ${sp} ${name} "]"`;
}
