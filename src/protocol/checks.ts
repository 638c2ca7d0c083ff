/**
 * The protocol's cross-field checks: the rules JSON Schema cannot say (one field bounded by another, no duplicate
 * within a list, a size in UTF-8 bytes). Each has a name; a zod schema runs them through {@link withChecks}, which
 * also writes their names into the generated JSON Schema under {@link CHECKS_KEYWORD}, so that another engine's
 * validator (the Python worker's messages.py) runs its own implementation of each named check — and refuses to
 * start on a name it does not know.
 */
import { z } from "zod";

/** The JSON Schema keyword listing the named checks an object must pass once its properties are valid. */
export const CHECKS_KEYWORD = "x-keel-checks";

/** Largest GBNF text a guide may carry (bytes of UTF-8): a grammar for 200 tools is about 80 KB. */
export const MAX_GUIDE_GRAMMAR_BYTES = 4 * 1024 * 1024;

/** Root rule name the engine adds for a trigger matched inside a token (llama-adapter.ts); a guide may not use it. */
export const RESERVED_RULE = "keel-prefixed-root";

/** One failed check: where (relative to the checked object) and why. */
export interface CheckIssue {
  path: (string | number)[];
  message: string;
}

type Phase = { kind: string };
type Guide = { grammar: string; start: Phase; reasoning?: { after: Phase } | undefined };
type Params = { maxTokens: number | null; minTokens?: number | undefined; logitBias?: [number, number][] | undefined };

/** Every named check; the Python worker implements the same names (messages.py `_CHECKS`). */
export const CHECKS = {
  /** `guide.grammar` is at most {@link MAX_GUIDE_GRAMMAR_BYTES} bytes of UTF-8. */
  grammarSize: (g: Guide): CheckIssue | null =>
    Buffer.byteLength(g.grammar) <= MAX_GUIDE_GRAMMAR_BYTES ? null : { path: ["grammar"], message: `must be at most ${MAX_GUIDE_GRAMMAR_BYTES} bytes` },
  /** The grammar does not define the engine's reserved root rule. */
  reservedRuleUndefined: (g: Guide): CheckIssue | null =>
    new RegExp(`^\\s*${RESERVED_RULE}\\s*::=`, "m").test(g.grammar) ? { path: ["grammar"], message: `defines the reserved rule ${RESERVED_RULE}` } : null,
  /** A reasoning phase without markers could never end. */
  reasoningHasMarkers: (g: Guide): CheckIssue | null =>
    (g.start.kind === "reasoning" || g.reasoning?.after.kind === "reasoning") && !g.reasoning
      ? { path: ["reasoning"], message: "a reasoning phase needs reasoning.open/close" }
      : null,
  /** The phase after reasoning is not reasoning again. */
  reasoningEnds: (g: Guide): CheckIssue | null =>
    g.reasoning?.after.kind === "reasoning" ? { path: ["reasoning", "after"], message: "must not be reasoning again" } : null,
  /** `minTokens` does not exceed `maxTokens`. */
  minTokensWithinMax: (p: Params): CheckIssue | null =>
    p.minTokens !== undefined && p.maxTokens !== null && p.minTokens > p.maxTokens
      ? { path: ["minTokens"], message: `minTokens (${p.minTokens}) must not exceed maxTokens (${p.maxTokens})` }
      : null,
  /** No token is biased twice. */
  logitBiasUnique: (p: Params): CheckIssue | null => {
    const seen = new Set<number>();
    for (const [token] of p.logitBias ?? []) {
      if (seen.has(token)) return { path: ["logitBias"], message: `token ${token} is biased twice` };
      seen.add(token);
    }
    return null;
  },
};

export type CheckName = keyof typeof CHECKS;

/** The object schema with the named checks run after its shape (zod) and listed in its JSON Schema. */
export function withChecks<S extends z.ZodObject>(schema: S, names: CheckName[]): S {
  return schema
    .superRefine((value, ctx) => {
      for (const name of names) {
        const issue = (CHECKS[name] as (v: unknown) => CheckIssue | null)(value);
        if (issue) ctx.addIssue({ code: "custom", path: issue.path, message: issue.message });
      }
    })
    .meta({ [CHECKS_KEYWORD]: names });
}
