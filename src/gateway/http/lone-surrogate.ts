/**
 * JSON may spell a lone UTF-16 surrogate (`"\ud800"`), which is no Unicode character and has no UTF-8 form: a prompt
 * holding one would reach the tokenizer as U+FFFD, a stop string could never match, a tool argument could never be
 * echoed. Such a body is a 400 naming the field, as a body that is not UTF-8 is (recipe M1).
 */
import { isWellFormed } from "../requests/utf8-stream.js";

/**
 * The path (`messages[0].content`, `stop[1]`) of the first string or key in a parsed JSON body that holds a lone
 * surrogate: `""` for the body itself, null when there is none. The body's nesting is bounded before it is parsed.
 */
export function loneSurrogatePath(value: unknown, path = ""): string | null {
  if (typeof value === "string") return isWellFormed(value) ? null : path;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const hit = loneSurrogatePath(value[i], `${path}[${i}]`);
      if (hit !== null) return hit;
    }
    return null;
  }
  if (value !== null && typeof value === "object") {
    for (const [key, v] of Object.entries(value)) {
      const at = path === "" ? key : `${path}.${key}`;
      if (!isWellFormed(key)) return at;
      const hit = loneSurrogatePath(v, at);
      if (hit !== null) return hit;
    }
  }
  return null;
}

/** The 400's message for a lone surrogate at `path`. */
export function loneSurrogateMessage(path: string): string {
  const field = path === "" ? "the body" : `'${path}'`;
  return `Invalid value for ${field}: it holds a lone UTF-16 surrogate (a \\uD800–\\uDFFF escape without its pair), which is no Unicode character; send the character itself or its full surrogate pair.`;
}
