/**
 * From a validated request to the engine's {@link GuideSpec} (or null: nothing to constrain), or a 400.
 *
 * Decisions (documented in docs/protocol.md's guided section by the integrating branch):
 * - An output constraint (`response_format` json_object/json_schema, `structured_outputs` regex/choice/grammar/json,
 *   `grammar`) → one rule for the whole output (output-rule.ts), `then: "end"`.
 * - `tool_choice` required / a named function → after reasoning, `ws call (ws call)*` over the tools (one call when
 *   `parallel_tool_calls` is false; exactly one call of the named tool), `then: "end"`. Needs a tool parser (400 otherwise).
 * - `auto` with `--enable_tool_guided_generation` → free text with triggers: hermes3 `<tool_call>` (+ an atStart
 *   `{` for a bare-JSON call); qwen3coder `<tool_call>` and `<function=NAME>` per known name (never a bare
 *   `<function=`); llama3 `<|python_tag|>` and an atStart `{`.
 * - Reasoning (`--reasoning_parser`): a prompt that already opened `<think>` starts in `reasoning`; otherwise a
 *   forced rule starts with the gate `"<think>" | body` so the model may still think first.
 * - `tool_choice` none, no tool with `parameters`, or `auto` without guidance → null; unguided `auto` still gets
 *   a 400 for an INVALID parameters schema (not an object schema, invalid regex, unresolvable or structure-free
 *   recursive `$ref`…), while valid schemas using keywords a grammar cannot honour pass (nothing is guided).
 * - `response_format` (non-text) together with tools and `tool_choice` ≠ none → 400: the output cannot be both a
 *   call and a JSON document; OpenAI allows the pair, Keel refuses it rather than silently drop one.
 */
import type { GuidePhase, GuideSpec, GuideTrigger } from "../../protocol/messages.js";
import { invalidValue } from "../http/errors.js";
import type { ReasoningParserName, ToolParserName, ToolSpec } from "../tools.js";
import { addCallRules, checkParametersShape, toolParam } from "./call-grammars.js";
import { literal } from "./gbnf-text.js";
import { GbnfBuilder, checkSchema, tooComplex } from "./json-schema-gbnf.js";
import { addOutputRule, constraintField, schemaParam } from "./output-rule.js";
import { checkSchemaLimits, newTotals } from "./schema-limits.js";
import type { BuildGuide, GuideRequest } from "./types.js";

/** Reasoning markers per reasoning parser. */
const REASONING_MARKERS: Readonly<Record<ReasoningParserName, { open: string; close: string }>> = {
  qwen3: { open: "<think>", close: "</think>" },
};

/** Special-token texts each call format's grammar spells. */
const CALL_SPECIAL_TOKENS: Readonly<Record<ToolParserName, readonly string[]>> = {
  hermes3: ["<tool_call>", "</tool_call>"],
  qwen3coder: ["<tool_call>", "</tool_call>"],
  llama3: ["<|python_tag|>"],
};

/** Whitespace allowed before and between forced calls (bounded). */
const CALL_WS = "call-ws";
const CALL_WS_BODY = "[ \\t\\n]{0,8}";

/** Most recent guides by request key: agents resend the same tools every turn, and 50 tools cost ~10–25 ms. */
const CACHE_SIZE = 32;
/** Insertion-ordered map used as an LRU (oldest first). */
const cache = new Map<string, GuideSpec | null>();

/**
 * The guide for `req` (see the module comment). Results are frozen and may be shared between requests. Throws a
 * KeelHttpError 400 for a request that cannot be guided or an invalid schema (never cached).
 */
export const buildGuide: BuildGuide = (req: GuideRequest): GuideSpec | null => {
  // Before anything recursive (the cache key's JSON.stringify included): the schemas' size limits, iteratively.
  checkRequestLimits(req);
  let key: string;
  try {
    key = JSON.stringify(req);
  } catch (e) {
    if (e instanceof RangeError) throw tooComplex(null);
    throw e;
  }
  if (cache.has(key)) {
    const hit = cache.get(key)!;
    cache.delete(key);
    cache.set(key, hit);
    return hit;
  }
  let spec: GuideSpec | null;
  try {
    spec = build(req);
  } catch (e) {
    // Last resort (the limits should make it unreachable): a walk out of stack is the client's schema, a 400.
    if (e instanceof RangeError) throw tooComplex(null);
    throw e;
  }
  const frozen = spec === null ? null : deepFreeze(spec);
  cache.set(key, frozen);
  if (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value!);
  return frozen;
};

/** The limits of schema-limits.ts over every schema of the request (their totals are per request). */
function checkRequestLimits(req: GuideRequest): void {
  const totals = newTotals();
  req.tools.forEach((t, i) => {
    if (t.parameters !== undefined) checkSchemaLimits(t.parameters, toolParam(i), totals);
  });
  if (req.responseFormat.kind === "json_schema") checkSchemaLimits(req.responseFormat.schema, schemaParam(req.responseFormat), totals);
}

function deepFreeze<T>(v: T): T {
  if (typeof v === "object" && v !== null) {
    for (const x of Object.values(v)) deepFreeze(x);
    Object.freeze(v);
  }
  return v;
}

/** Two tools with one name would make a call ambiguous (which schema?): refused when guiding. */
function checkUniqueNames(tools: readonly ToolSpec[]): void {
  const seen = new Map<string, number>();
  tools.forEach((t, i) => {
    const first = seen.get(t.name);
    if (first !== undefined) {
      throw invalidValue(`tools[${i}].function.name`, `Invalid value for 'tools[${i}].function.name': '${t.name}' is already the name of tools[${first}].`);
    }
    seen.set(t.name, i);
  });
}

function build(req: GuideRequest): GuideSpec | null {
  const rf = req.responseFormat;
  const toolsActive = req.toolChoice.kind !== "none" && req.tools.length > 0;
  // 1. The refused combination.
  if (rf.kind !== "text" && toolsActive) {
    const field = constraintField(rf);
    throw invalidValue(field, `Invalid value for '${field}': a structured output cannot be combined with tools unless tool_choice is 'none'.`);
  }
  // 2. Structured output (JSON, regex, choice or grammar).
  if (rf.kind !== "text") {
    const b = new GbnfBuilder();
    return forced(b, addOutputRule(b, rf), req, []);
  }
  // 3. Tools.
  if (!toolsActive) return null;
  const choice = req.toolChoice;
  if (choice.kind === "function" && !req.tools.some((t) => t.name === choice.name)) {
    throw invalidValue("tool_choice", `Invalid value for 'tool_choice': no tool named '${choice.name}' in 'tools'.`);
  }
  if (!req.tools.some((t) => t.parameters !== undefined)) return null;
  if (choice.kind === "auto") {
    if (!req.guideAuto || req.toolParser === null) {
      // Not guided: still refuse invalid schemas (recipe M2), but not valid ones a grammar could not honour.
      req.tools.forEach((t, i) => {
        checkParametersShape(t, toolParam(i));
        if (t.parameters !== undefined) checkSchema(t.parameters, toolParam(i));
      });
      return null;
    }
    checkUniqueNames(req.tools);
    return auto(req, req.toolParser);
  }
  checkUniqueNames(req.tools);
  let tools: readonly ToolSpec[] = req.tools;
  if (choice.kind === "function") {
    tools = [req.tools.find((t) => t.name === choice.name)!];
  }
  if (req.toolParser === null) {
    throw invalidValue(
      "tool_choice",
      `Invalid value for 'tool_choice': '${choice.kind === "function" ? choice.name : "required"}' needs the server to run with --tool_parser.`,
    );
  }
  const parser = req.toolParser;
  // A named function is called exactly once (as vLLM's named tool_choice); `required` may call several.
  const several = req.parallelToolCalls && choice.kind !== "function";
  const b = new GbnfBuilder();
  const indexOf = (t: ToolSpec) => req.tools.indexOf(t);
  const rules = addCallRules(b, parser, tools, indexOf);
  const ws = b.define(CALL_WS, CALL_WS_BODY);
  let body: string;
  if (parser === "llama3") {
    const sep = `";" ${b.primitive("space")}`;
    body = `${ws} "<|python_tag|>"? ${rules.call}${several ? ` (${sep} ${rules.call})*` : ""}`;
  } else {
    body = `${ws} ${rules.call}${several ? ` (${ws} ${rules.call})*` : ""}`;
  }
  return forced(b, b.define("calls-forced", body), req, CALL_SPECIAL_TOKENS[parser]);
}

/** A guide whose output is `body` (after any reasoning), then EOG. */
function forced(b: GbnfBuilder, body: string, req: GuideRequest, callTokens: readonly string[]): GuideSpec {
  const then: GuidePhase = { kind: "rule", rule: body, then: "end" };
  if (req.reasoning === null) {
    return { grammar: b.text(), start: then, ...specials(callTokens) };
  }
  const m = REASONING_MARKERS[req.reasoning.parser];
  const reasoning = { open: m.open, close: m.close, after: then };
  const tokens = [...callTokens, m.open, m.close];
  if (req.reasoning.open) return { grammar: b.text(), start: { kind: "reasoning" }, reasoning, ...specials(tokens) };
  // The model may open reasoning itself: the gate admits the open marker or the body.
  const gate = b.define("gate", `${literal(m.open)} | ${body}`);
  return { grammar: b.text(), start: { kind: "rule", rule: gate, then: "end" }, reasoning, ...specials(tokens) };
}

function specials(tokens: readonly string[]): { specialTokens?: string[] } {
  return tokens.length > 0 ? { specialTokens: [...new Set(tokens)] } : {};
}

/** `auto` with guidance: free text, a constrained call once a trigger appears. */
function auto(req: GuideRequest, parser: ToolParserName): GuideSpec {
  const b = new GbnfBuilder();
  const indexOf = (t: ToolSpec) => req.tools.indexOf(t);
  const triggers: GuideTrigger[] = [];
  // parallel_tool_calls false: nothing but EOG after the first call.
  const then = req.parallelToolCalls ? "free" : "end";
  if (parser === "hermes3") {
    const tagged = addCallRules(b, "hermes3", req.tools, indexOf);
    const bare = addCallRules(b, "hermes3-bare", req.tools, indexOf);
    triggers.push({ text: "<tool_call>", rule: tagged.call, then });
    // A bare JSON call is the whole answer (the hermes3 parser takes a bare call only as the entire output): after it
    // only end-of-generation, or a model that writes JSON on would be forced into call after call.
    triggers.push({ text: "{", rule: bare.call, atStart: true, then: "end" });
  } else if (parser === "qwen3coder") {
    const tagged = addCallRules(b, "qwen3coder", req.tools, indexOf);
    triggers.push({ text: "<tool_call>", rule: tagged.call, then });
    for (const tool of req.tools) {
      // A call opened without <tool_call> may close it or stop; nothing else.
      const rule = b.define(b.fresh(`t${indexOf(tool)}-qf`, "bare"), `${tagged.functions.get(tool.name)!} "\\n</tool_call>"?`);
      triggers.push({ text: `<function=${tool.name}>`, rule, then });
    }
  } else {
    const one = addCallRules(b, "llama3", req.tools, indexOf);
    const sep = `";" ${b.primitive("space")}`;
    const many = req.parallelToolCalls ? ` (${sep} ${one.call})*` : "";
    const tagged = b.define("l3-tagged", `"<|python_tag|>" ${one.call}${many}`);
    const bare = b.define("l3-bare", `${one.call}${many}`);
    triggers.push({ text: "<|python_tag|>", rule: tagged, then: "end" });
    triggers.push({ text: "{", rule: bare, atStart: true, then: "end" });
  }
  const tokens: string[] = [...CALL_SPECIAL_TOKENS[parser]];
  const spec: GuideSpec = { grammar: b.text(), start: { kind: "free" }, triggers };
  if (req.reasoning !== null) {
    const m = REASONING_MARKERS[req.reasoning.parser];
    spec.reasoning = { open: m.open, close: m.close, after: { kind: "free" } };
    if (req.reasoning.open) spec.start = { kind: "reasoning" };
    tokens.push(m.open, m.close);
  }
  return { ...spec, ...specials(tokens) };
}
