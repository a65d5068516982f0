"""What identifies the weights in the answer digest (`weights_fingerprint`): a
checkpoint replaced in the same folder kept its digest, and cache keys with it, so
Redis replayed the old model's answers for a day."""

from __future__ import annotations

import os
from pathlib import Path

from proxy.engine.answering import answer_digest, weights_fingerprint


def checkpoint(folder: Path, weights: bytes = b"w" * 64, config: str = '{"a": 1}') -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(config)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_a_checkpoint_replaced_in_its_folder_moves_the_fingerprint(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "m")
    first = weights_fingerprint(str(folder))
    assert first is not None and weights_fingerprint(str(folder)) == first  # untouched
    checkpoint(folder, weights=b"v" * 80)  # other weights (another size)
    second = weights_fingerprint(str(folder))
    assert second not in (None, first)
    st = os.stat(folder / "model.safetensors")  # same size, written again
    os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = weights_fingerprint(str(folder))
    assert third not in (None, first, second)
    config = os.stat(folder / "config.json")  # another config, same size and time
    (folder / "config.json").write_text('{"a": 2}')
    os.utime(folder / "config.json", ns=(config.st_atime_ns, config.st_mtime_ns))
    assert weights_fingerprint(str(folder)) not in (None, first, second, third)
    assert answer_digest({"weights": first}) != answer_digest({"weights": second})


def test_a_folder_elsewhere_with_the_same_files_has_the_same_fingerprint(
        tmp_path: Path) -> None:
    """Replicas share Redis's entries: one checkpoint copied to each (the same times
    kept, as `cp -p` and image layers keep them) keeps one digest."""
    a, b = checkpoint(tmp_path / "a"), checkpoint(tmp_path / "b")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        st = os.stat(a / name)
        os.utime(b / name, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights_fingerprint(str(a)) == weights_fingerprint(str(b)) is not None


def test_a_model_with_no_folder_has_none(tmp_path: Path) -> None:
    assert weights_fingerprint(str(tmp_path / "missing")) is None
    assert weights_fingerprint("no-such-org/no-such-model") is None


def test_hub_cache_links_are_told_by_their_blobs_not_their_times(tmp_path: Path) -> None:
    """The hub cache's snapshot files link to blobs named by their content's hash: two
    replicas that downloaded one revision at other times have one fingerprint; another
    revision (another blob) has another."""
    def snapshot(name: str, blob: str) -> Path:
        blobs, snap = tmp_path / name / "blobs", tmp_path / name / "snapshot"
        blobs.mkdir(parents=True)
        snap.mkdir()
        (blobs / blob).write_bytes(b"w" * 64)
        (blobs / "cfg").write_text("{}")
        os.symlink(f"../blobs/{blob}", snap / "model.safetensors")
        os.symlink("../blobs/cfg", snap / "config.json")
        return snap
    a, b, c = snapshot("a", "sha-1"), snapshot("b", "sha-1"), snapshot("c", "sha-2")
    os.utime(tmp_path / "b" / "blobs" / "sha-1", ns=(0, 10**9))
    assert weights_fingerprint(str(a)) == weights_fingerprint(str(b)) is not None
    assert weights_fingerprint(str(c)) not in (None, weights_fingerprint(str(a)))
