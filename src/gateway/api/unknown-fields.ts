/**
 * Unknown top-level request fields are refused, not ignored: a typo (`temprature`) or a field of another API would
 * otherwise answer 200 with the field silently dropped. OpenAI answers 400 naming the field; so does Keel.
 */
import { unknownField } from "../http/errors.js";

/**
 * Throws a 400 `unknown_field` naming the first key of `body` that is not in `known`. A body that is not a JSON
 * object is left to the API's own schema, which reports it.
 * @param known - Every field the API defines (applied, or recognised and refused with its own message).
 */
export function refuseUnknownFields(body: unknown, known: ReadonlySet<string>): void {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return;
  for (const key of Object.keys(body)) {
    if (!known.has(key)) throw unknownField(key);
  }
}
