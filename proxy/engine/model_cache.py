"""Where Weir keeps the models it builds itself, and how a build is published safely.

A built model is written into a temporary folder beside its target and renamed into
place only once it is whole, so a crash never leaves a half-written model where a later
start would load it. Builders of the same model take an exclusive lock first: when two
servers start at once on an empty cache, the second waits, finds the first one's result
valid, and reuses it instead of building (and renaming over) a second copy.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def default_cache_dir() -> Path:
    """Where generated models live: $WEIR_CACHE_DIR, else $XDG_CACHE_HOME/weir."""
    if env := os.environ.get("WEIR_CACHE_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "weir"


@contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on `target`'s builds (a lock file beside it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def publish(target: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmp)` in a fresh temporary folder beside `target`, then rename it there.

    An existing `target` (an invalid copy: callers check validity first, under
    `build_lock`) is moved aside and removed only after the new copy is in place.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{target.name}-", dir=target.parent))
    old: Path | None = None
    try:
        tmp.chmod(0o755)  # mkdtemp makes it owner-only
        build(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".old-{target.name}-", dir=target.parent))
            target.rename(old / target.name)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def ensure_built(target: Path, is_valid: Callable[[Path], bool],
                 build: Callable[[Path], None]) -> Path:
    """Return `target`, building it first unless a valid copy is already there."""
    if is_valid(target):
        return target
    with build_lock(target):
        if is_valid(target):  # built by another process while we waited for the lock
            return target
        return publish(target, build)
