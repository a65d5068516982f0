"""What identifies the weights in the answer digest (`weights_fingerprint`): a
checkpoint replaced in the same folder kept its digest, and cache keys with it, so
Redis replayed the old model's answers for a day; and replicas that each copied one
checkpoint must keep one digest, or they stop sharing Redis's entries."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from proxy.engine.answering import answer_digest, weights_fingerprint


def checkpoint(folder: Path, weights: bytes = b"w" * 64, config: str = '{"a": 1}') -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(config)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def safetensors(tensors: dict[str, int]) -> bytes:
    """A safetensors file of `tensors` (name -> bytes, as U8), its data a pattern."""
    header: dict[str, object] = {}
    data, at = bytearray(), 0
    for name, n in tensors.items():
        header[name] = {"dtype": "U8", "shape": [n], "data_offsets": [at, at + n]}
        turn = len(data) % 251
        data += (PATTERN[turn:] + PATTERN * (n // 251 + 1))[:n]
        at += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + bytes(data)


PATTERN = bytes(range(251))
#: Three tensors of about 1 MiB (the file is sampled, not read whole; the start of `b`
#: is in no chunk but its own tensor's).
BIG = {"a.weight": (1 << 20) + 123, "b.weight": (1 << 20) + 4567, "c.weight": 1 << 20}


def test_a_checkpoint_replaced_in_its_folder_moves_the_fingerprint(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path / "m")
    first = weights_fingerprint(str(folder))
    assert first is not None and weights_fingerprint(str(folder)) == first  # untouched
    checkpoint(folder, weights=b"v" * 80)  # other weights (another size)
    second = weights_fingerprint(str(folder))
    assert second not in (None, first)
    checkpoint(folder, weights=b"u" * 80)  # same size, other bytes
    third = weights_fingerprint(str(folder))
    assert third not in (None, first, second)
    config = os.stat(folder / "config.json")  # another config, same size and time
    (folder / "config.json").write_text('{"a": 2}')
    os.utime(folder / "config.json", ns=(config.st_atime_ns, config.st_mtime_ns))
    assert weights_fingerprint(str(folder)) not in (None, first, second, third)
    assert answer_digest({"weights": first}) != answer_digest({"weights": second})


def test_copies_of_a_checkpoint_have_one_fingerprint_whatever_their_times(
        tmp_path: Path) -> None:
    """Replicas that each copied (no `cp -p`) or downloaded one checkpoint have files
    with other times: the fingerprint took the times, so each replica had its own
    digest and none shared Redis's entries (the point of that layer). It is of the
    files' names, sizes and bytes only; rewriting a file with the same bytes keeps it."""
    a = checkpoint(tmp_path / "a", weights=safetensors(BIG))
    (a / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    b = tmp_path / "b"
    shutil.copytree(a, b, copy_function=shutil.copyfile)  # (times not kept)
    for i, name in enumerate(sorted(os.listdir(b))):
        os.utime(b / name, ns=(10**9 * (i + 1), 10**9 * (i + 7)))
    (b / ".gitattributes").write_text("another\n")  # (a dot file is not loaded)
    assert weights_fingerprint(str(a)) == weights_fingerprint(str(b)) is not None
    (b / "model.safetensors").write_bytes((a / "model.safetensors").read_bytes())
    assert weights_fingerprint(str(a)) == weights_fingerprint(str(b))


@pytest.mark.parametrize("where", ["a_start", "b_start", "data_start", "data_end",
                                   "header"])
def test_retrained_weights_with_the_same_shapes_move_it(tmp_path: Path, where: str) -> None:
    """Same names, sizes and header (shapes), one byte other where the sample reads:
    the start of any tensor, the data's first or last bytes, or the header."""
    blob = bytearray(safetensors(BIG))
    data = 8 + int.from_bytes(blob[:8], "little")
    at = {"a_start": data + 17, "b_start": data + (1 << 20) + 126, "data_start": data + 4000,
          "data_end": len(blob) - 5000, "header": 20}[where]
    a = checkpoint(tmp_path / "a", weights=bytes(blob))
    blob[at] ^= 1
    b = checkpoint(tmp_path / "b", weights=bytes(blob))
    assert weights_fingerprint(str(a)) not in (None, weights_fingerprint(str(b)))


def test_what_it_reads_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start reads a sample of each weights file, not the weights: a few hundred KiB
    a file however large (the 64 MiB here hold nothing but zeros past their header)."""
    folder = checkpoint(tmp_path / "m", weights=safetensors(BIG))
    with open(folder / "model-00002.safetensors", "wb") as f:
        f.write(safetensors({f"t{i}": 1 for i in range(4000)}))
        f.truncate(64 << 20)
    with open(folder / "model.bin", "wb") as f:
        f.truncate(64 << 20)
    read = 0
    pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        nonlocal read
        got = pread(fd, n, offset)
        read += len(got)
        return got
    monkeypatch.setattr(os, "pread", counted)
    assert weights_fingerprint(str(folder)) is not None
    assert 0 < read < 2 << 20
    for i in range(60):  # many shards: less of each
        with open(folder / f"shard-{i:05}.safetensors", "wb") as f:
            f.write(safetensors({"t": 8}))
            f.truncate(64 << 20)
    read = 0
    assert weights_fingerprint(str(folder)) is not None
    assert 0 < read < 3 << 20


def test_a_model_with_no_folder_has_none(tmp_path: Path) -> None:
    assert weights_fingerprint(str(tmp_path / "missing")) is None
    assert weights_fingerprint("no-such-org/no-such-model") is None


def test_hub_cache_links_are_told_by_their_blobs_not_their_times(tmp_path: Path) -> None:
    """The hub cache's snapshot files link to blobs named by their content's hash: two
    replicas that downloaded one revision at other times have one fingerprint (the blob
    is not read); another revision (another blob) has another. A link elsewhere (a path,
    no hash) is told by what it points to."""
    sha1, sha2, cfg = "1" * 64, "2" * 64, "3" * 40

    def snapshot(name: str, blob: str, target: str = "../blobs/") -> Path:
        blobs, snap = tmp_path / name / "blobs", tmp_path / name / "snapshot"
        blobs.mkdir(parents=True)
        snap.mkdir()
        (blobs / blob).write_bytes(b"w" * 64)
        (blobs / cfg).write_text("{}")
        os.symlink(f"{target}{blob}", snap / "model.safetensors")
        os.symlink(f"../blobs/{cfg}", snap / "config.json")
        return snap
    a, b, c = snapshot("a", sha1), snapshot("b", sha1), snapshot("c", sha2)
    os.utime(tmp_path / "b" / "blobs" / sha1, ns=(0, 10**9))
    assert weights_fingerprint(str(a)) == weights_fingerprint(str(b)) is not None
    assert weights_fingerprint(str(c)) not in (None, weights_fingerprint(str(a)))
    d, e = snapshot("d", "weights"), snapshot("e", "weights")
    (tmp_path / "e" / "blobs" / "weights").write_bytes(b"v" * 64)
    assert weights_fingerprint(str(d)) not in (None, weights_fingerprint(str(e)))
