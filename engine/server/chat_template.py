"""Chat messages to the prompt text the model was trained on, with the checkpoint's Jinja template.

Real checkpoints ship their template (Kimi's K2-style `chat_template`); it is rendered the way
transformers renders it (sandboxed Jinja, `tojson` without HTML escaping, `raise_exception`). Synthetic
checkpoints have none and use `SYNTHETIC_CHAT_TEMPLATE`, the same layout with the synthetic tokenizer's
special tokens:

    [<|im_system|>tool_declare<|im_middle|>{tools as JSON}<|im_end|>]
    <|im_system|>system<|im_middle|>{content}<|im_end|>          (also any other non-chat role)
    <|im_user|>user<|im_middle|>{content}<|im_end|>
    <|im_assistant|>assistant<|im_middle|>[<think>{reasoning}</think>]{content}
        [<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>
         {arguments}<|tool_call_end|>...<|tool_calls_section_end|>]<|im_end|>
    <|im_system|>tool<|im_middle|>## Return of {tool_call_id}\\n{content}<|im_end|>
    <|im_assistant|>assistant<|im_middle|>                          (the generation prompt)
"""

from __future__ import annotations

import json
from datetime import datetime

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

SYNTHETIC_CHAT_TEMPLATE = """\
{%- if tools -%}
<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}
<|im_user|>user<|im_middle|>
{%- elif message.role == 'assistant' -%}
<|im_assistant|>assistant<|im_middle|>
{%- else -%}
<|im_system|>{{ message.role }}<|im_middle|>
{%- endif -%}
{%- if message.role == 'assistant' and message.reasoning_content -%}
<think>{{ message.reasoning_content }}</think>
{%- endif -%}
{%- if message.role == 'tool' -%}
## Return of {{ message.tool_call_id }}{{ '\\n' }}
{%- endif -%}
{{ message.content or '' }}
{%- if message.role == 'assistant' and message.tool_calls -%}
<|tool_calls_section_begin|>
{%- for call in message.tool_calls -%}
<|tool_call_begin|>functions.{{ call.function.name }}:{{ loop.index0 }}<|tool_call_argument_begin|>
{{- call.function.arguments }}<|tool_call_end|>
{%- endfor -%}
<|tool_calls_section_end|>
{%- endif -%}
<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_assistant|>assistant<|im_middle|>
{%- endif -%}
"""


class ChatTemplateError(ValueError):
    """The template refused the conversation (e.g. `raise_exception` for an unsupported turn order)."""


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False):
    return json.dumps(
        value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii
    )


def _raise_exception(message: str):
    raise ChatTemplateError(message)


class ChatTemplate:
    def __init__(self, source: str, *, special_tokens: dict[str, str] | None = None):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.source = source
        self._template = env.from_string(source)
        self._special = special_tokens or {}  # bos_token, eos_token, ... as templates expect them

    def render(
        self, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt=True
    ) -> str:
        try:
            return self._template.render(
                messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **self._special
            )
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, KeyError, IndexError) as e:  # the conversation broke the template
            raise ChatTemplateError(f"the chat template failed on this conversation: {e}") from e
