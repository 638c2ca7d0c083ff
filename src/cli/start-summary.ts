/**
 * What the start log says about how requests will be parsed and guided (`--tool_parser`, `--reasoning_parser`,
 * `--enable_tool_guided_generation`) and about every setting one flag implies for another (flash attention forced on
 * by a u8 KV cache, prompts capped by `--dynamic_split_fuse false`), for one served model: the flags path
 * (cli/serve.ts) and every `--config_path` entry (cli/serve-config.ts) log the same lines.
 *
 * @module
 */
import type { AgentFlags } from "../gateway/models/agent-config.js";
import type { EngineConfig } from "../protocol/engine-config.js";
import type { EngineName } from "./flag-table.js";

/** One start line: its level, JSON fields (with `event`) and message. */
export interface StartLine {
  level: "info" | "warn";
  fields: Record<string, unknown> & { event: string };
  msg: string;
}

/** The line naming the tool-call parser, whether calls are guided, and the reasoning parser. */
export function agentLine(a: AgentFlags): StartLine {
  const tools =
    a.toolParser === null
      ? "tool calls not parsed (--tool_parser unset: a chat request with tools is a 400 naming the flag)"
      : a.toolParser === "auto"
        ? "tool calls parsed in the format of the model's chat template (--tool_parser auto: chosen and logged when the engine is ready)"
        : `tool calls parsed as ${a.toolParser} (--tool_parser ${a.toolParser})`;
  const guide =
    a.toolParser === null
      ? a.guideAuto
        ? "; --enable_tool_guided_generation true does nothing without --tool_parser"
        : ""
      : a.guideAuto
        ? ", guided by the tool's JSON schema under every tool_choice (--enable_tool_guided_generation true)"
        : ", guided under tool_choice required or a named function only (--enable_tool_guided_generation false)";
  const reasoning = a.reasoningParser === null ? "reasoning not parsed (stays in content; --reasoning_parser unset)" : `reasoning parsed as ${a.reasoningParser} into reasoning_content (--reasoning_parser ${a.reasoningParser})`;
  return {
    level: a.toolParser === null && a.guideAuto ? "warn" : "info",
    fields: { event: "agents", toolParser: a.toolParser, reasoningParser: a.reasoningParser, toolGuidedGeneration: a.guideAuto },
    msg: `${tools}${guide}; ${reasoning}`,
  };
}

/**
 * A line for each setting the flags imply beyond what they name, as `engine` (the start configuration the engine
 * gets) shows it. `flashAttentionFlag`: what `--flash_attention` said.
 */
export function impliedLines(engineName: EngineName, engine: Pick<EngineConfig, "flashAttention" | "kvCacheType" | "maxPromptLen" | "maxNumBatchedTokens">, flashAttentionFlag: boolean): StartLine[] {
  const out: StartLine[] = [];
  if (engineName === "llama.cpp" && engine.kvCacheType === "q8_0") {
    const forced = engine.flashAttention && !flashAttentionFlag;
    out.push({
      level: "info",
      fields: { event: "implied", setting: "flash_attention", value: engine.flashAttention, because: "kv_cache_precision u8" },
      msg: `--kv_cache_precision u8: K and V cached as q8_0${forced ? ", and flash attention turned on (llama.cpp needs it for a quantized V cache; --flash_attention was false)" : ", with flash attention (on)"}`,
    });
  }
  if (engine.maxPromptLen !== undefined) {
    out.push({
      level: "info",
      fields: { event: "implied", setting: "max_prompt_len", value: engine.maxPromptLen, because: "dynamic_split_fuse false" },
      msg: `--dynamic_split_fuse false: a prompt is prefilled in one step, so one longer than --max_num_batched_tokens (${engine.maxPromptLen}) is refused with a 400`,
    });
  }
  return out;
}

/** What {@link serverLines} reads of the parsed flags. */
interface ServerFlags {
  notes: readonly { level: "info" | "warn"; msg: string; engine?: string }[];
  allowedOrigins?: unknown;
  allowCredentials?: boolean;
}

/**
 * The server-wide start lines, once whatever the number of models: a line per flag note (a flag that changes nothing
 * on the engines served, or that is applied differently) and whether an API key is required. `engines` are the
 * engines served: a note for one engine only is logged when that engine serves a model.
 */
export function serverLines(o: ServerFlags, apiKeyRequired: boolean, engines: readonly string[]): { notes: StartLine[]; security: StartLine } {
  const notes: StartLine[] = o.notes.filter((n) => n.engine === undefined || engines.includes(n.engine)).map((n) => ({ level: n.level, fields: { event: "flag" }, msg: n.msg }));
  const security: StartLine = {
    level: "info",
    fields: { event: "security", apiKeyRequired, corsOrigins: o.allowedOrigins, allowCredentials: o.allowCredentials ?? false },
    msg: apiKeyRequired ? "API key required on /v1/ and /v3/ routes" : "no API key: every route is open",
  };
  return { notes, security };
}
