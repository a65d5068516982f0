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
import re
from collections.abc import Callable, Mapping
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


#: How `weights_fingerprint` samples a large file (its bytes are never all read): its
#: first and last `_SPAN` bytes (of a safetensors file's tensor data: past its header;
#: less where the checkpoint has many files, `_SPANS` over them all, at least `_CHUNK`),
#: `_CHUNKS` chunks of up to `_CHUNK` bytes (an eighth of the span) evenly spread
#: between, and of a safetensors file also its header and the first `_TENSOR` bytes of
#: each tensor (up to `_TENSORS` per file, evenly spread). A file up to `_WHOLE` bytes
#: (configs, vocabularies) is read whole. About 170 KiB for a checkpoint of one file, a
#: few MB for one of many shards.
_SPAN, _SPANS, _CHUNK, _CHUNKS, _TENSOR, _TENSORS = (
    64 << 10, 1 << 20, 4 << 10, 8, 256, 2048)
_WHOLE, _HEADER_MAX = 256 << 10, 8 << 20
#: A hub cache's blob: named by its content's hash (git's for small files, sha256 for
#: large ones), the same on every machine that downloaded it.
_BLOB = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def weights_fingerprint(model: str) -> str | None:
    """What identifies the checkpoint that `model` (a folder, or a hub id the hub's local
    cache holds) names, read once at start (in a thread): each file of the folder by its
    name, its size and a digest of its bytes, whole for a small file (config.json, the
    tokenizer's), else of a bounded sample (`_SPAN` and the rest: a safetensors file's
    header, the start of each tensor, its data's first and last 64 KiB; a few MB read
    for the whole checkpoint). A link into a hub cache's blobs counts by the blob's name
    (its content's hash; not read). Content only, never a time or a path: replicas that
    each copied or downloaded one checkpoint (at other times, without `cp -p`) have one
    fingerprint, and share Redis's entries; one retrained with the same shapes, or
    replaced in place, has another. None where no folder is found (the model's name then
    stands for it, as before) or a file cannot be read."""
    folder = model if os.path.isdir(model) else _hub_folder(model)
    if folder is None:
        return None
    h = hashlib.sha256()
    try:
        with os.scandir(folder) as it:
            # (follows links; a subfolder, or a dot file (`.gitattributes`, a lock, an
            # editor's), is no part of what is loaded)
            files = sorted((f.name, f.path, f.stat().st_size, os.path.basename(
                os.readlink(f.path)) if f.is_symlink() else "") for f in it
                if not f.name.startswith(".") and f.is_file())
        large = sum(size > _WHOLE and not _BLOB.fullmatch(blob) for _, _, size, blob in files)
        span = max(_CHUNK, min(_SPAN, _SPANS // max(1, 2 * large)))
        for name, path, size, blob in files:
            if _BLOB.fullmatch(blob):
                which = "blob " + blob
            else:
                which = _sampled(path, size, name.endswith(".safetensors"), span).hex()
            h.update(f"{name}\0{size}\0{which}\n".encode())
    except OSError:
        return None
    return h.hexdigest()[:32]


def _sampled(path: str, size: int, safetensors: bool, span: int) -> bytes:
    """A digest of the file at `path` (`size` bytes): whole up to `_WHOLE`, else of
    the sample `weights_fingerprint` reads (`span` bytes at each end; offsets from its
    size and header only)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        fd = f.fileno()

        def take(offset: int, n: int) -> None:
            n = max(0, min(n, size - offset))
            data = os.pread(fd, n, offset) if n else b""
            h.update(len(data).to_bytes(8, "little") + data)

        if size <= _WHOLE:
            take(0, size)
            return h.digest()
        start = 0
        if safetensors:
            start = _safetensors_sample(take, fd, size)
        take(start, span)
        chunk = max(512, min(_CHUNK, span // 8))
        for i in range(1, _CHUNKS + 1):
            take(start + (size - start) * i // (_CHUNKS + 1), chunk)
        take(max(start, size - span), span)
    return h.digest()


def _safetensors_sample(take: Callable[[int, int], None], fd: int, size: int) -> int:
    """Sample a safetensors file's header (its tensors' names, dtypes, shapes and
    places) and the first `_TENSOR` bytes of its tensors; where its data starts (0 where
    the header cannot be read: the file is then sampled as any)."""
    n = int.from_bytes(os.pread(fd, 8, 0), "little")
    if not 0 < n <= min(_HEADER_MAX, size - 8):
        return 0
    raw = os.pread(fd, n, 8)
    take(8, n)
    try:
        header = orjson.loads(raw)
        places = sorted(int(t["data_offsets"][0]) for name, t in header.items()
                        if name != "__metadata__")
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError,
            IndexError):
        return 8 + n
    step = max(1, -(-len(places) // _TENSORS))  # (ceil: at most `_TENSORS` of them)
    for at in places[::step]:
        if 0 <= at < size - 8 - n:
            take(8 + n + at, _TENSOR)
    return 8 + n


def _hub_folder(model: str) -> str | None:
    """The hub cache's snapshot folder of `model` (a hub id), if it is held locally."""
    try:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # (not a hub id, no hub library: no folder)
        return None
    return os.path.dirname(found) if isinstance(found, str) else None
