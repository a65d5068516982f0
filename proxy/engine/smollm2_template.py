"""The chat template Weir serves `builtin:smollm2` with: SmolLM2's own, plus tools.

The template the GGUF ships (ChatML) renders each message's role and content and nothing
else: a request's `tools` never reached the model, nor an earlier turn's calls, so the
model was asked to call functions it was never shown. This one renders a conversation
without tools exactly as SmolLM2's own does (the same ids: prefix caching and answers
unchanged), and with tools it does what Hugging Face templates with tool support do
(Qwen2.5's and Hermes' form): a system block listing each tool's JSON schema within
`<tools></tools>` and the expected output, one `<tool_call>{"name": ..., "arguments":
...}</tool_call>` per call, which vLLM's `hermes` tool parser reads (`engine.tool_parser:
hermes`). An assistant turn's earlier calls are written in that form, and tool results
go back as `<tool_response>` blocks in a user turn (consecutive ones in one).

SmolLM2-135M was not trained to call tools: under `tool_choice: auto` it answers text
(see the README). Forced calls (`required`, a named function) are constrained by the
tools' schemas (`proxy.tools`), and the model now reads what the tools are for.
"""

from __future__ import annotations

#: SmolLM2's default system turn (where a conversation has none), as its template says.
_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- else %}"
    "{{- '" + _DEFAULT_SYSTEM + "\\n\\n' }}"
    "{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}"
    "{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>"
    "<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\n" + _DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if loop.first and message['role'] == 'system' and tools %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set f = call['function'] if call['function'] is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}"
    "{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
