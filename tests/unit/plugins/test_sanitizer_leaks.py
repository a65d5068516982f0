"""Sanitizer: what the stop-48 probe of secrets found (vendor formats it missed)."""

from __future__ import annotations

import pytest

from plugins.sanitizer.detectors import BUILTIN
from proxy.text import normalize


def fires(name: str, text: str) -> bool:
    return bool(list(BUILTIN[name].find(normalize(text))))


@pytest.mark.parametrize("text", [
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # Stripe's webhook signing secret, bare
    "endpoint secret: whsec_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6",
])
def test_a_stripe_webhook_secret_is_a_secret(text: str) -> None:
    assert fires("secret", text)


@pytest.mark.parametrize("text", ["the whsec_ prefix marks Stripe's webhook secrets",
                                  "set whsec_test in the dashboard"])
def test_its_prefix_alone_is_not(text: str) -> None:
    assert not fires("secret", text)
