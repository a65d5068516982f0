"""The guard refuses two questions that name other channels for one thing (guard
`_CHANNEL_WAYS`: online, in the app, by phone, in person, by post, by email): "Can I pay
by card at the counter?" / "Can I pay by card online?" (0.79 with MiniLM). Each way a
channel is said reads as one token, so "by phone" / "over the phone" is one channel."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok, signature


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I pay by card at the counter?", "Can I pay by card online?"),
    ("Can I pay my bill by phone?", "Can I pay my bill in the app?"),
    ("Can I top up my card online?", "Can I top up my card at a shop?"),
    ("Can I open an account online?", "Can I open an account at a branch?"),
    ("Can I pay my tax online?", "Can I pay my tax at the post office?"),
    ("Can I submit the form by email?", "Can I submit the form by post?"),
])
def test_another_channel_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I cancel my order by phone?", "Can I cancel my order over the phone?"),
    ("Can I renew my passport online?", "Is it possible to renew my passport on the website?"),
    ("How do I return an item I bought online?", "How can I return something I ordered online?"),
])
def test_the_same_channel_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


def test_a_channel_reads_as_one_token() -> None:
    assert signature("Can I pay over   the phone?").tokens[-1] == "by-phone"
    assert signature("Can I pay at the counter?").tokens[-1] == "in-person"


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", [
    "in " * 1400, "by " + " " * 4000 + "phone", "at the " * 600, "over the " * 500,
    "online " * 600, "in the app " * 400, "at " + "the " * 1300 + "counter",
])
def test_long_runs_stay_linear(text: str) -> None:
    """The channels' pattern is literal words with blanks between (4,000 characters)."""
    assert not guard_ok(text + " by phone", text + " online")
