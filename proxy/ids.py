"""Identifiers for requests, answers, leases and engine requests.

They must be unique, not secret: nothing is authorised by knowing one. Each is 128 bits
from a generator seeded once per process from the OS (and again after a fork), not a
system call per id: on these machines `os.urandom` costs tens of microseconds a call
under load, and a request used to make four of them.
"""

from __future__ import annotations

import os
import random

from .errors import shown

_rng = random.Random(os.urandom(32))


def _reseed() -> None:
    _rng.seed(os.urandom(32))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)


def new_hex(bits: int = 128) -> str:
    """`bits` random bits as lower-case hex (bits / 4 characters)."""
    return f"{_rng.getrandbits(bits):0{bits // 4}x}"


def shown_id(record_id: str) -> str:
    """A caller's id as an error message quotes it: at most 80 characters (an id is the
    caller's text, of any length)."""
    return shown(record_id, 80)
