"""What an engine's answer depends on besides the request: one digest, for cache keys.

A cached answer is replayed only for the request it answered under the settings that
made it (Redis keeps entries a day): the chat template and how Weir renders a chat
(`chat_text.render_digest`), the tool parser that reads calls out of the text, the
structured-output options that shape JSON answers, the model and how it is loaded
(tokenizer, dtype, quantization), its context length (where an answer with no
`max_tokens` stops), its generation-config defaults, and vLLM's own arguments
(`extra_args`: a reasoning parser, another generation config, ...). What only changes
how fast answers come (batch size, memory, prefix caching, parallelism) is no part of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

#: Bump where the digest's parts change meaning, so that every key moves with them.
ANSWER_VERSION = 1


def answer_digest(settings: Mapping[str, Any]) -> str:
    """A digest of the answer-affecting `settings` (any JSON-able values; others by
    their text). Cache keys hold it: an answer cached under other settings answered
    another question."""
    data = orjson.dumps([ANSWER_VERSION, settings],
                        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    return hashlib.sha256(data).hexdigest()[:32]
