/**
 * Unknown top-level request fields are refused, as OpenAI does ("Unrecognized request argument supplied"), instead
 * of being dropped: a typo (`max_token`, `temprature`) would otherwise run with defaults and the client never learn.
 * Each API passes the fields it knows; the zod object schemas of the request bodies are the natural source
 * ({@link fieldsOf}), so a field is known exactly when the route validates (and applies or refuses) it.
 */
import { unknownField } from "../http/errors.js";

/** The keys of a zod object schema's shape (the fields its route knows). */
export function fieldsOf(schema: { shape: Record<string, unknown> }, extra: readonly string[] = []): ReadonlySet<string> {
  return new Set([...Object.keys(schema.shape), ...extra]);
}

/** Edit distance of two short strings (insertions, deletions, substitutions), capped at `cap` + 1. */
function distance(a: string, b: string, cap: number): number {
  if (Math.abs(a.length - b.length) > cap) return cap + 1;
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) row[j] = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = row;
  }
  return prev[b.length]!;
}

/** The known field closest to `name` (edit distance at most 2), if any: the likely typo's intent. */
function closest(name: string, known: ReadonlySet<string>): string | undefined {
  let best: string | undefined;
  let bestD = 3;
  for (const k of known) {
    const d = distance(name.toLowerCase(), k, 2);
    if (d < bestD) [best, bestD] = [k, d];
  }
  return best;
}

/**
 * Throws a 400 `unknown_field` naming the first top-level key of `body` not in `known` (a body that is not an
 * object is left to the route's own validation).
 */
export function checkKnownFields(body: unknown, known: ReadonlySet<string>): void {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return;
  for (const key of Object.keys(body)) {
    if (!known.has(key)) throw unknownField(key, key.length <= 64 ? closest(key, known) : undefined);
  }
}
