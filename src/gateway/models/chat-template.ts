/**
 * Renders a model's Hugging Face chat template (Jinja) into a prompt string.
 *
 * @module
 */
import { Template } from "@huggingface/jinja";
import { invalidValue, templateError } from "../http/errors.js";
import type { ToolCall, ToolParserName, ToolSpec } from "../tools.js";
import { sanitizeForJson } from "../requests/utf8-stream.js";
import { injectTools, probeToolSupport, type TemplateToolSupport } from "./tool-prompt.js";
import { withinNesting } from "../http/json-depth.js";
import { loneSurrogatePath } from "../http/lone-surrogate.js";

/**
 * One chat message as the template sees it: `content` is already flattened
 * to a single string (text parts joined with `"\n"`; see `chat-request.ts`).
 */
export interface ChatMessage {
  /** `system`, `user`, `assistant`, `tool` or `developer`. */
  role: string;
  content: string;
  /** Assistant: the calls it made (arguments as JSON text, as the API carries them). */
  toolCalls?: ToolCall[];
  /** Tool: the id of the call this message answers. */
  toolCallId?: string;
  /** Optional participant / tool name. */
  name?: string;
  /** Assistant: its reasoning (`reasoning_content`), for templates that render earlier thinking. */
  reasoningContent?: string;
}

/** The special-token strings a chat template may reference. */
export interface ChatTemplateSpecials {
  /** Beginning-of-sequence token text, exposed as `bos_token`. */
  bosToken: string;
  /** End-of-sequence token text, exposed as `eos_token`. */
  eosToken: string;
}

/** Options of {@link ChatTemplate.render}. */
export interface ChatRenderOptions {
  /**
   * Whether to end the prompt with the header of an assistant turn
   * (`add_generation_prompt`, as in `transformers`'
   * `apply_chat_template`). Default `true`.
   */
  addGenerationPrompt?: boolean;
  /**
   * Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`), as vLLM and OVMS pass them. They
   * may not replace the variables the renderer sets itself (see {@link RESERVED_TEMPLATE_VARIABLES}).
   */
  kwargs?: Readonly<Record<string, unknown>>;
  /**
   * Tools to declare to the model (`tools`, in OpenAI's nested shape as HF templates expect). The caller applies
   * `tool_choice` first (none → no tools; a named function → only that one). Empty/absent = `tools` undefined.
   */
  tools?: readonly ToolSpec[];
}

/** Tools injected into the messages for a template that cannot show them (tool-prompt.ts): the call format and what the template drops. */
export interface ToolPrompt {
  /** The `--tool_parser` format the instructions and the rewritten history use. */
  format: ToolParserName;
  /** What the template shows by itself (probed at engine ready). */
  support: TemplateToolSupport;
}

/** Variables the renderer sets; `chat_template_kwargs` may not override them (refused with 400). */
export const RESERVED_TEMPLATE_VARIABLES = ["messages", "bos_token", "eos_token", "add_generation_prompt", "tools", "raise_exception", "strftime_now"] as const;

/**
 * A parsed chat template, rendered per request with the variables of the
 * `transformers` chat-templating convention: `messages` (list of
 * `{role, content}` objects), `bos_token`, `eos_token` and
 * `add_generation_prompt`. The interpreter is `@huggingface/jinja`, which
 * also provides `raise_exception(msg)` and `strftime_now(fmt)`.
 *
 * Parse errors surface once, at construction (model load); render errors are
 * per request.
 */
export class ChatTemplate {
  readonly #template: Template;
  readonly #specials: ChatTemplateSpecials;
  /** The Jinja source (to recognise the model's tool-call format for `--tool_parser auto`). */
  readonly source: string;
  /** Set when tools are injected into the messages (the template cannot show them); null = rendered as given. */
  readonly toolPrompt: ToolPrompt | null;
  /** {@link toolSupport}'s answer, probed once. */
  #support: TemplateToolSupport | null = null;

  /**
   * Parses the template.
   *
   * @param template - Jinja source, e.g. `tokenizer.chat_template` from GGUF
   *   metadata or `tokenizer_config.json`.
   * @param specials - Special-token texts passed to every render.
   * @throws Error (a plain `Error`, not a `KeelHttpError`: this is a model
   *   configuration problem found at load time, not a client error) when the
   *   template does not parse; the message includes the parser's.
   * @param toolPrompt - Inject tools into the messages (see {@link withToolPrompt}); default none.
   */
  constructor(template: string, specials: ChatTemplateSpecials, toolPrompt: ToolPrompt | null = null) {
    try {
      this.#template = new Template(template);
    } catch (err) {
      throw new Error(`Chat template does not parse: ${messageOf(err)}`, { cause: err });
    }
    this.#specials = { ...specials };
    this.source = template;
    this.toolPrompt = toolPrompt;
  }

  /** What this template shows of tools, tool calls and system messages by itself (probed once, without injection). */
  toolSupport(): TemplateToolSupport {
    const plain = this.toolPrompt === null ? this : new ChatTemplate(this.source, this.#specials);
    this.#support ??= probeToolSupport((messages, tools, addGenerationPrompt) => plain.render(messages, { tools, addGenerationPrompt }));
    return this.#support;
  }

  /** The same template rendering tools into the messages in `format` (for a template that cannot show them). */
  withToolPrompt(format: ToolParserName): ChatTemplate {
    return new ChatTemplate(this.source, this.#specials, { format, support: this.toolSupport() });
  }

  /**
   * Renders the prompt for `messages`.
   *
   * @returns The prompt text (special tokens appear as text, to be tokenized
   *   with special-token parsing on).
   * @throws KeelHttpError 400 `template_error` when the template raises
   *   (`raise_exception`, e.g. "Conversation roles must alternate
   *   user/assistant/…") or fails at runtime, with the interpreter's message;
   *   or when it renders an empty prompt.
   */
  render(messages: readonly ChatMessage[], opts: ChatRenderOptions = {}): string {
    const kwargs = opts.kwargs ?? {};
    for (const key of Object.keys(kwargs)) {
      if ((RESERVED_TEMPLATE_VARIABLES as readonly string[]).includes(key)) {
        throw invalidValue(`chat_template_kwargs.${key}`, `Invalid value for 'chat_template_kwargs': '${key}' is set by the server and cannot be overridden.`);
      }
    }
    // A template that cannot show tools gets them (and the calls and results it would drop) inside the messages.
    const tp = this.toolPrompt;
    const shown = tp === null ? messages : injectTools(messages, opts.tools ?? [], tp.format, tp.support);
    const tools = tp === null ? opts.tools : undefined;
    let prompt: string;
    try {
      prompt = this.#template.render({
        ...kwargs,
        messages: shown.map(templateMessage),
        ...(tools && tools.length > 0 ? { tools: tools.map(templateTool) } : {}),
        bos_token: this.#specials.bosToken,
        eos_token: this.#specials.eosToken,
        add_generation_prompt: opts.addGenerationPrompt ?? true,
      });
    } catch (err) {
      throw templateError(messageOf(err));
    }
    if (prompt.length === 0) throw templateError("the rendered prompt is empty.");
    return prompt;
  }
}

/** A tool as HF templates read it: `{type: "function", function: {name, description?, parameters?}}`. */
export function templateTool(t: ToolSpec): Record<string, unknown> {
  const fn: Record<string, unknown> = { name: t.name };
  if (t.description !== undefined) fn.description = t.description;
  if (t.parameters !== undefined) fn.parameters = t.parameters;
  return { type: "function", function: fn };
}

/**
 * A message as HF templates read it. Only the keys the message has are set (templates test `is defined`).
 * `tool_calls[].function.arguments` becomes an object when it is a JSON object — templates `tojson` it, which
 * would otherwise double-encode the text; anything else stays the string.
 */
export function templateMessage(m: ChatMessage): Record<string, unknown> {
  const out: Record<string, unknown> = { role: m.role, content: m.content };
  if (m.toolCalls !== undefined) {
    out.tool_calls = m.toolCalls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: argumentsValue(c.arguments) } }));
  }
  if (m.toolCallId !== undefined) out.tool_call_id = m.toolCallId;
  if (m.name !== undefined) out.name = m.name;
  if (m.reasoningContent !== undefined) out.reasoning_content = m.reasoningContent;
  return out;
}

function argumentsValue(text: string): unknown {
  // Too deep for the template's recursive `tojson`: passed on as the text it is.
  if (!withinNesting(text)) return text;
  try {
    const v: unknown = JSON.parse(text);
    // A lone surrogate escaped inside the text (`"\\ud800"`) is no character once parsed: the text stays as sent.
    return typeof v === "object" && v !== null && !Array.isArray(v) && loneSurrogatePath(v) === null ? v : text;
  } catch {
    return text;
  }
}

function messageOf(err: unknown): string {
  const raw = err instanceof Error ? err.message : String(err);
  return sanitizeForJson(raw.length > 500 ? raw.slice(0, 500) + "…" : raw);
}
