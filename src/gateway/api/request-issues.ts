/**
 * Request validation issues → the catalogued 400s (http/errors.ts): zod issues of every API's body schema, and the
 * custom issues the schemas report (a missing field, an unsupported one), each naming its field path.
 */
import type { z } from "zod";
import { describe, invalidJson, KeelHttpError, invalidValue, missingField, show, unsupportedField } from "../http/errors.js";
import { MAX_TOP_LOGPROBS, SAMPLING_RANGES } from "./sampling.js";

/** Largest value of uint32 fields (`max_tokens`, `seed`), as in OVMS. */
export const UINT32_MAX = 4_294_967_295;
/** How a custom issue is reported; carried in zod's `params`. */
type IssueKind = "invalid_type" | "invalid_value" | "missing_field" | "unsupported_field";

export interface IssueCtx {
  addIssue(issue: { code: "custom"; message: string; path?: PropertyKey[]; params?: Record<string, unknown>; input?: unknown }): void;
}

export function report(ctx: IssueCtx, kind: IssueKind, detail: string, path: PropertyKey[] = [], input?: unknown): void {
  ctx.addIssue({ code: "custom", message: detail, path, params: { kind }, input });
}

export { describe };

const TYPE_NAMES: Record<string, string> = {
  string: "a string",
  number: "a number",
  int: "an integer",
  boolean: "a boolean",
  array: "an array",
  object: "an object",
};

/** Human range of each numeric top-level field, used for its range errors. */
export const RANGES: Record<string, string> = {
  max_tokens: `must be an integer between 1 and ${UINT32_MAX}`,
  max_completion_tokens: `must be an integer between 1 and ${UINT32_MAX}`,
  temperature: "must be between 0 and 2",
  top_p: "must be greater than 0 and at most 1",
  top_k: "must be -1 or 0 (all tokens) or a positive integer",
  seed: `must be an integer between 0 and ${UINT32_MAX}`,
  best_of: "must be a positive integer",
  logprobs: `must be an integer between 0 and ${MAX_TOP_LOGPROBS}`,
  ...SAMPLING_RANGES,
};

/** `["messages", 0, "role"]` → `messages[0].role`; `[]` → null. */
function toParam(path: readonly PropertyKey[]): string | null {
  let out = "";
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`;
    else out += out === "" ? String(key) : `.${String(key)}`;
  }
  return out === "" ? null : out;
}

/** Converts one zod issue into the catalogued 400 error. */
export function issueToError(issue: z.core.$ZodIssue): KeelHttpError {
  const param = toParam(issue.path);
  const input = (issue as { input?: unknown }).input;
  if (param === null) {
    // An empty body reaches validation as undefined (Keel's body parser lets it through): docs/api.md calls it invalid JSON.
    if (input === undefined) return invalidJson("(The request body is empty.)");
    return invalidValue(null, `Invalid type for the request body: expected a JSON object, but got ${describe(input)} instead.`);
  }
  if (issue.code === "custom") {
    const kind = (issue.params?.kind ?? "invalid_value") as IssueKind;
    switch (kind) {
      case "missing_field":
        return missingField(param);
      case "unsupported_field":
        return unsupportedField(param, issue.message || undefined);
      case "invalid_type":
        return invalidValue(param, `Invalid type for '${param}': ${issue.message}`);
      default:
        return invalidValue(param, `Invalid value for '${param}': ${issue.message}`);
    }
  }
  // JSON cannot carry `undefined`, so an undefined input is an absent key.
  if (input === undefined) return missingField(param);
  const range = RANGES[param];
  switch (issue.code) {
    case "invalid_type": {
      if (range && issue.expected === "int" && typeof input === "number") {
        return invalidValue(param, `Invalid value for '${param}': ${range} (got ${show(input)}).`);
      }
      const expected = TYPE_NAMES[issue.expected] ?? issue.expected;
      return invalidValue(param, `Invalid type for '${param}': expected ${expected}, but got ${describe(input)} instead.`);
    }
    case "too_small":
    case "too_big": {
      if (range) return invalidValue(param, `Invalid value for '${param}': ${range} (got ${show(input)}).`);
      const limit = Number(issue.code === "too_small" ? issue.minimum : issue.maximum);
      if (issue.origin === "array" && Array.isArray(input)) {
        return issue.code === "too_small"
          ? invalidValue(param, `Invalid value for '${param}': expected a non-empty array, but got an empty array.`)
          : invalidValue(param, `Invalid value for '${param}': expected an array with at most ${limit} items, but got ${input.length}.`);
      }
      if (issue.origin === "string") {
        return issue.code === "too_small"
          ? invalidValue(param, `Invalid value for '${param}': expected a non-empty string.`)
          : invalidValue(param, `Invalid value for '${param}': expected a string of at most ${limit} characters.`);
      }
      const op = issue.code === "too_small" ? (issue.inclusive ? ">=" : ">") : issue.inclusive ? "<=" : "<";
      return invalidValue(param, `Invalid value for '${param}': expected a value ${op} ${limit} (got ${show(input)}).`);
    }
    case "invalid_value": {
      const allowed = issue.values.map((v) => `'${String(v)}'`).join(", ");
      return invalidValue(param, `Invalid value for '${param}': expected one of ${allowed} (got ${show(input)}).`);
    }
    default:
      return invalidValue(param, `Invalid value for '${param}'.`);
  }
}
