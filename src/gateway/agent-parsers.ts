/**
 * Where the gateway takes the output parsers and the guide builder from (branches `parsers` and `grammar`).
 * Until they are merged, nothing is recognised: `--tool_parser auto` resolves to none.
 */
import type { ToolParserName } from "./tools.js";

export function pickToolParser(_template: string): ToolParserName | null {
  return null;
}
