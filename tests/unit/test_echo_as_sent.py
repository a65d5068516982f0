"""`EchoAsSent`: an upstream's echo given back as the caller sent the prompt, however
the upstream splits it over its chunks."""

from __future__ import annotations

from typing import Any

from proxy.preparing import EchoAsSent
from proxy.protocol import CompletionRequest

SENT = "Ｓay\u200b hello"  # (the sanitizer passes on "Say hello")


def _echo() -> EchoAsSent:
    req = CompletionRequest.model_validate({"model": "m", "prompt": "Say hello",
                                            "echo": True})
    sent = CompletionRequest.model_validate({"model": "m", "prompt": SENT, "echo": True})
    return EchoAsSent(req, sent)


def _relayed(texts: list[str], last: str | None = "stop") -> str:
    """The text a choice streamed as `texts` goes out with."""
    echo, out = _echo(), ""
    for n, t in enumerate(texts):
        choice: dict[str, Any] = {"index": 0, "text": t,
                                  "finish_reason": last if n == len(texts) - 1 else None}
        echo([choice])
        out += choice["text"]
    return out


def test_an_echo_split_anywhere_is_given_back_as_sent() -> None:
    whole = "Say hello ok"
    for cut in range(1, len(whole)):
        for second in range(cut + 1, len(whole) + 1):
            texts = [whole[:cut], whole[cut:second], whole[second:]]
            assert _relayed(texts) == SENT + " ok", texts
    assert _relayed(["", "S", "ay", " hello", " ok"]) == SENT + " ok"


def test_text_that_is_not_the_echo_goes_out_as_it_came() -> None:
    assert _relayed(["Say", " goodbye"]) == "Say goodbye"  # (left it: not swapped)
    assert _relayed(["Say", " hel"]) == "Say hel"  # (ended inside it)
    assert _relayed(["Hello"]) == "Hello"
