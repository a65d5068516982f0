"""What an engine's answer depends on besides the request: one digest, for cache keys.

A cached answer is replayed only for the request it answered under the settings that
made it (Redis keeps entries a day): the chat template and how Weir renders a chat
(`chat_text.render_digest`), the tool parser that reads calls out of the text, the
structured-output options that shape JSON answers, the model and how it is loaded
(tokenizer, dtype, quantization), its context length (where an answer with no
`max_tokens` stops), its generation-config defaults, and vLLM's own arguments
(`extra_args`: a reasoning parser, another generation config, ...), and what identifies
the weights as loaded: the dtype `auto` resolved to, and the checkpoint's folder
(`weights_fingerprint`: a checkpoint replaced under the same path or name is another
model). What only changes how fast answers come (batch size, memory, prefix caching,
parallelism) is no part of it.
"""

from __future__ import annotations

import hashlib
import os
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


def weights_fingerprint(model: str) -> str | None:
    """What identifies the checkpoint that `model` (a folder, or a hub id the hub's local
    cache holds) names, read once at start: its config.json's bytes, and each file of
    the folder by name and size, and by where it points for a link (the hub cache's: to
    a blob named by its content's hash, the same on every replica), else by its
    modification time (a checkpoint written again in place). None where no folder is
    found (the model's name then stands for it, as before). Stat calls only, and one
    small file read: no weights are read. Replicas share Redis's entries where their
    checkpoints' files have the same times (one volume, an image's layers, `cp -p`)."""
    folder = model if os.path.isdir(model) else _hub_folder(model)
    if folder is None:
        return None
    h = hashlib.sha256()
    try:
        with os.scandir(folder) as it:
            files = sorted(it, key=lambda e: e.name)
        for f in files:
            if not f.is_file():  # (follows links; a subfolder is no weights' file)
                continue
            st = f.stat()
            which = os.readlink(f.path) if f.is_symlink() else st.st_mtime_ns
            h.update(f"{f.name}\0{st.st_size}\0{which}\n".encode())
            if f.name == "config.json":
                with open(f.path, "rb") as config:
                    h.update(hashlib.sha256(config.read()).digest())
    except OSError:
        return None
    return h.hexdigest()[:32]


def _hub_folder(model: str) -> str | None:
    """The hub cache's snapshot folder of `model` (a hub id), if it is held locally."""
    try:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # (not a hub id, no hub library: no folder)
        return None
    return os.path.dirname(found) if isinstance(found, str) else None
