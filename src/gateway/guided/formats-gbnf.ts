/**
 * GBNF for JSON-schema string `format`s, over the string CONTENT (ASCII only, so the same text serves JSON and raw
 * qwen3coder modes). Each accepts a subset of what ajv-formats' full mode accepts (soundness.test.ts checks it).
 */

/** Pieces of the `format` rules (ASCII only, so the same text serves JSON and raw modes). */
const MONTH_DAY = '("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])';
/** Gregorian leap years: divisible by 4, and by 400 when by 100. */
const LEAP_YEAR = '[0-9] [0-9] ("0" [48] | [2468] [048] | [13579] [26]) | ([02468] [048] | [13579] [26]) "00"';
const DATE = `([0-9]{4} "-" (${MONTH_DAY}) | (${LEAP_YEAR}) "-02-29")`;
const TIME = '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ([zZ] | [\\x2D+] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])';
/** RFC 3986 pieces: a path character (unreserved, sub-delims, ":" "@", percent-encoding) and a host character. */
const PCHAR = "([a-zA-Z0-9\\x2D._~!$&'()*+,;=:@] | \"%\" [0-9a-fA-F] [0-9a-fA-F])";
const HOSTCHAR = "([a-zA-Z0-9\\x2D._~!$&'()*+,;=] | \"%\" [0-9a-fA-F] [0-9a-fA-F])";
/** An email as validators accept it: dot-separated atoms, then dot-separated labels without edge hyphens. */
const EMAIL_ATOM = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~\\x2D]{1,64}";
const EMAIL_LABEL = "[a-zA-Z0-9] ([a-zA-Z0-9\\x2D]{0,61} [a-zA-Z0-9])?";

/**
 * `format` rules over the string content; each accepts a subset of what ajv-formats' full mode accepts (checked by
 * the soundness test): real calendar dates (leap years included), times with a timezone, RFC 3986 URIs with an
 * authority, a rooted path or a rootless path.
 */
export const FORMATS: Readonly<Record<string, string>> = {
  date: DATE,
  time: TIME,
  "date-time": `${DATE} [tT] ${TIME}`,
  uuid: "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}",
  email: `${EMAIL_ATOM} ("." ${EMAIL_ATOM})* "@" ${EMAIL_LABEL} ("." ${EMAIL_LABEL})+`,
  uri: `[a-zA-Z] [a-zA-Z0-9+.\\x2D]* ":" ("//" ${HOSTCHAR}* (":" [0-9]*)? ("/" ${PCHAR}*)* | "/" (${PCHAR}+ ("/" ${PCHAR}*)*)? | ${PCHAR}+ ("/" ${PCHAR}*)*) ("?" (${PCHAR} | [/?])*)? ("#" (${PCHAR} | [/?])*)?`,
};
