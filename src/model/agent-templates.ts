/**
 * Chat templates of Keel's tiny agent models (`keel-tiny-qwen3`, `keel-tiny-qwen3coder`): written for Keel, after
 * the behaviour of the Qwen3 and Qwen3-Coder templates, so that tool calls, tool results, reasoning and
 * `enable_thinking` render into the same shapes a real model of those families sees, on a model small enough for
 * determinism tests.
 *
 * Both templates are ChatML (`<|im_start|>role\n…<|im_end|>\n`) and read the variables of the `transformers`
 * convention: `messages` (role, content, and for assistants `tool_calls` and `reasoning_content`; for tools
 * `tool_call_id`), `tools` (OpenAI nested `{type, function: {...}}` or flat `{name, description, parameters}`),
 * `add_generation_prompt`, and (Qwen3 only) `enable_thinking`.
 *
 * Tool-call `arguments` may be an object (rendered key by key, values JSON unless they are strings) or a JSON string
 * as OpenAI clients send it (hermes: inserted verbatim; qwen3coder: inserted verbatim inside the function element,
 * since a Jinja template cannot parse JSON: a gateway that wants parameters parses it first).
 *
 * @module
 */

/** The tags the agent templates use; the tiny agent models make each a single USER_DEFINED token. */
export const AGENT_TAGS = Object.freeze(["<think>", "</think>", "<tool_call>", "</tool_call>"] as const);

/**
 * Shared Jinja macros-as-text: the index of the last user message (reasoning of earlier assistant turns is
 * dropped, as Qwen3 does, because the model never sees its old thoughts) and the grouping of consecutive `tool`
 * messages into one user turn of `<tool_response>` blocks.
 */
const LAST_USER_INDEX =
    "{%- set ns = namespace(last_user=-1) -%}" +
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}";

/** Renders one `tool` message inside a user turn opened by the first of a run of tool messages. */
const TOOL_MESSAGE =
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}" +
    "{{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' -}}" +
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}";

/** Sets `text` to the message content as a string (a missing / null content, as on tool-call turns, is empty). */
const MESSAGE_TEXT = "{%- set text = message.content if message.content is string else '' -%}";

/**
 * Qwen3-style template: hermes tool calls (`<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`) and thinking
 * (`<think>\n…\n</think>\n\n` before the answer of the turns after the last user message; `enable_thinking=false`
 * closes an empty think block in the generation prompt, so the model answers directly).
 */
export const QWEN3_STYLE_TEMPLATE = [
    LAST_USER_INDEX,
    // 1. System turn: the client's system message, then the tool catalogue when tools are given.
    "{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}",
    "{%- if tools -%}",
    "{{- '<|im_start|>system\\n' -}}",
    "{%- if has_system -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}",
    "{{- '# Tools\\n\\nYou can call the functions below to help with the request. Their signatures, one JSON object per line, are inside <tools></tools>:\\n<tools>' -}}",
    "{%- for tool in tools -%}{{- '\\n' + ((tool.function if tool.function is defined else tool) | tojson) -}}{%- endfor -%}",
    "{{- '\\n</tools>\\n\\nTo call a function, write a JSON object with its name and arguments between <tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function name>, \"arguments\": <arguments object>}\\n</tool_call><|im_end|>\\n' -}}",
    "{%- elif has_system -%}",
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}",
    "{%- endif -%}",
    // 2. The conversation.
    "{%- for message in messages -%}",
    MESSAGE_TEXT,
    "{%- if message.role == 'system' and loop.first -%}",
    "{%- elif message.role == 'assistant' -%}",
    // 2a. Reasoning: the field, else a think block the client left inside the content.
    "{%- set reasoning = '' -%}",
    "{%- if message.reasoning_content is string -%}{%- set reasoning = message.reasoning_content -%}",
    "{%- elif '</think>' in text -%}",
    "{%- set reasoning = text.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}",
    "{%- set text = text.split('</think>')[-1].lstrip('\\n') -%}",
    "{%- endif -%}",
    "{{- '<|im_start|>assistant\\n' -}}",
    "{%- if loop.index0 > ns.last_user and reasoning -%}{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' -}}{%- endif -%}",
    "{{- text -}}",
    // 2b. Tool calls, one hermes block each.
    "{%- if message.tool_calls -%}",
    "{%- for call in message.tool_calls -%}",
    "{%- set fn = call.function if call.function is defined else call -%}",
    "{%- if not loop.first or text -%}{{- '\\n' -}}{%- endif -%}",
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' -}}",
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}",
    "{{- '}\\n</tool_call>' -}}",
    "{%- endfor -%}",
    "{%- endif -%}",
    "{{- '<|im_end|>\\n' -}}",
    "{%- elif message.role == 'tool' -%}",
    TOOL_MESSAGE,
    "{%- else -%}",
    "{{- '<|im_start|>' + message.role + '\\n' + text + '<|im_end|>\\n' -}}",
    "{%- endif -%}",
    "{%- endfor -%}",
    // 3. Generation prompt; thinking switched off = an empty, closed think block.
    "{%- if add_generation_prompt -%}",
    "{{- '<|im_start|>assistant\\n' -}}",
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}",
    "{%- endif -%}"
].join("");

/**
 * Qwen3-Coder-style template: XML tool calls
 * (`<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`), the tool catalogue
 * rendered as XML with each parameter's name, type and description, no thinking.
 */
export const QWEN3CODER_STYLE_TEMPLATE = [
    // 1. System turn.
    "{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}",
    "{%- if tools or has_system -%}",
    "{{- '<|im_start|>system\\n' -}}",
    "{%- if has_system -%}{{- messages[0].content -}}{%- endif -%}",
    "{%- if tools -%}",
    "{%- if has_system -%}{{- '\\n\\n' -}}{%- endif -%}",
    "{{- '# Tools\\n\\nThese functions are available:\\n\\n<tools>' -}}",
    "{%- for tool in tools -%}",
    "{%- set fn = tool.function if tool.function is defined else tool -%}",
    "{{- '\\n<function>\\n<name>' + fn.name + '</name>' -}}",
    "{%- if fn.description is string -%}{{- '\\n<description>' + fn.description + '</description>' -}}{%- endif -%}",
    "{{- '\\n<parameters>' -}}",
    "{%- if fn.parameters is mapping and fn.parameters.properties is mapping -%}",
    "{%- for pname, p in fn.parameters.properties | items -%}",
    "{{- '\\n<parameter>\\n<name>' + pname + '</name>' -}}",
    "{%- if p.type is defined -%}{{- '\\n<type>' + (p.type if p.type is string else p.type | tojson) + '</type>' -}}{%- endif -%}",
    "{%- if p.description is string -%}{{- '\\n<description>' + p.description + '</description>' -}}{%- endif -%}",
    "{%- if p.enum is defined -%}{{- '\\n<enum>' + (p.enum | tojson) + '</enum>' -}}{%- endif -%}",
    "{{- '\\n</parameter>' -}}",
    "{%- endfor -%}",
    "{%- if fn.parameters.required is defined -%}{{- '\\n<required>' + (fn.parameters.required | tojson) + '</required>' -}}{%- endif -%}",
    "{%- endif -%}",
    "{{- '\\n</parameters>\\n</function>' -}}",
    "{%- endfor -%}",
    "{{- '\\n</tools>\\n\\nTo call a function, reply with exactly this shape and nothing after it:\\n\\n<tool_call>\\n<function=name_of_the_function>\\n<parameter=name_of_a_parameter>\\nits value\\n</parameter>\\n</function>\\n</tool_call>\\n\\nGive every required parameter; a value may span several lines.' -}}",
    "{%- endif -%}",
    "{{- '<|im_end|>\\n' -}}",
    "{%- endif -%}",
    // 2. The conversation.
    "{%- for message in messages -%}",
    MESSAGE_TEXT,
    "{%- if message.role == 'system' and loop.first -%}",
    "{%- elif message.role == 'assistant' -%}",
    "{{- '<|im_start|>assistant\\n' + text -}}",
    "{%- if message.tool_calls -%}",
    "{%- for call in message.tool_calls -%}",
    "{%- set fn = call.function if call.function is defined else call -%}",
    "{%- if not loop.first or text -%}{{- '\\n' -}}{%- endif -%}",
    "{{- '<tool_call>\\n<function=' + fn.name + '>\\n' -}}",
    "{%- if fn.arguments is mapping -%}",
    "{%- for key, value in fn.arguments | items -%}",
    "{{- '<parameter=' + key + '>\\n' + (value if value is string else value | tojson) + '\\n</parameter>\\n' -}}",
    "{%- endfor -%}",
    "{%- elif fn.arguments is string -%}{{- fn.arguments + '\\n' -}}",
    "{%- endif -%}",
    "{{- '</function>\\n</tool_call>' -}}",
    "{%- endfor -%}",
    "{%- endif -%}",
    "{{- '<|im_end|>\\n' -}}",
    "{%- elif message.role == 'tool' -%}",
    TOOL_MESSAGE,
    "{%- else -%}",
    "{{- '<|im_start|>' + message.role + '\\n' + text + '<|im_end|>\\n' -}}",
    "{%- endif -%}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
].join("");
