"""Generate the embedded default's model: a tiny random-weight Llama.

No model hub is reachable on the machines Weir is built on, so the embedded default
serves a model Weir makes itself: a byte-level BPE tokenizer (2k vocab) trained on a
generated corpus, a chat template, and a 2-layer Llama with random weights (~1 MB).
Its output is gibberish, but it is a real Hugging Face checkpoint: vLLM loads and serves
it like any other, with continuous batching, prefix caching and structured output.

Head dim is 64 on purpose: vLLM's CPU attention kernels reject 16.
"""

from __future__ import annotations

import json
import random
from functools import partial
from pathlib import Path

from .model_cache import default_cache_dir, ensure_built, publish

__all__ = ["DEMO_MODEL_NAME", "build_demo_model", "default_cache_dir", "ensure_demo_model"]

#: Bump when the generated files change, so cached copies are rebuilt.
DEMO_VERSION = "1"
DEMO_MODEL_NAME = "weir-demo"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

SPECIAL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "<|system|>",
    "<|developer|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|end|>",
]

_WORDS = (
    "the a an how what why when where who which can could should would is are was were "
    "do does did have has had my your our their order account password reset refund "
    "shipping delivery cancel change update email phone address payment card invoice "
    "price plan subscription upgrade downgrade support help error login logout sign in "
    "out up down data model gateway cache token request response time day week month "
    "year one two three four five six seven eight nine ten hundred thousand please thanks "
    "hello hi yes no not and or but if then else for to from with without in on at by "
    "of about into over under again new old big small fast slow good bad first last "
    "weir engine server client api key user tenant role admin stream json schema"
).split()


def demo_model_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / f"{DEMO_MODEL_NAME}-v{DEMO_VERSION}"


def _corpus(rng: random.Random, lines: int = 4000) -> list[str]:
    out = []
    for _ in range(lines):
        n = rng.randint(3, 18)
        out.append(" ".join(rng.choice(_WORDS) for _ in range(n)) + rng.choice(".?!"))
    # Digits and punctuation so numbers and JSON tokenize into something sensible.
    out.append(" ".join(str(i) for i in range(1000)))
    out.append('{"a": 1, "b": [true, false, null], "c": "x"} [] {} : , " \\ /')
    return out


def build_demo_model(target: Path, *, seed: int = 0, vocab_size: int = 2048) -> Path:
    """Write the model to `target` (atomically: built in a temp dir, then renamed)."""
    return publish(target, partial(_write_demo_model, seed=seed, vocab_size=vocab_size))


def _write_demo_model(tmp: Path, *, seed: int, vocab_size: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(seed)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="<|end|>",
        unk_token="<unk>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(tmp)

    eos_id = tok.token_to_id("<|end|>")
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=eos_id,
        pad_token_id=tok.token_to_id("</s>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # A wider spread of logits than the default init, so greedy decoding wanders
    # over the vocabulary instead of repeating one token.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
        for tid in (tok.token_to_id(t) for t in SPECIAL_TOKENS):
            if tid != eos_id:
                model.lm_head.weight[tid].zero_()
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config.bos_token_id, "eos_token_id": eos_id})
    )
    (tmp / "WEIR_DEMO").write_text(
        "Random-weight demo model generated by `weir make-demo-model`. Output is gibberish.\n"
    )


def ensure_demo_model(cache_dir: Path | None = None) -> Path:
    """Return the cached demo model's directory, building it on first use."""
    return ensure_built(demo_model_dir(cache_dir), lambda d: (d / "WEIR_DEMO").exists(),
                        partial(_write_demo_model, seed=0, vocab_size=2048))
