/**
 * Chat templates the model layer provides when a model brings none: the gateway renders with ChatML then (and the
 * tiny models Keel generates store it as their own `tokenizer.chat_template`).
 */

/** ChatML template (the format `<|im_start|>role\ncontent<|im_end|>\n`), with `add_generation_prompt` support. */
export const CHATML_TEMPLATE =
    "{%- for message in messages -%}" +
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}" +
    "{%- endfor -%}" +
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";
