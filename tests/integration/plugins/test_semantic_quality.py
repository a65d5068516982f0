"""The semantic layer on a labelled set (tests/data/semantic_pairs.yaml), with the real
embedding model and the default threshold and guard: near misses (changed numbers,
negations, swapped or changed entities, opposites) must all miss; true paraphrases must
mostly hit. Both rates are printed (`pytest -s`) for the record."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from plugins.cache.config import SemanticConfig
from plugins.cache.semantic import guard_ok
from proxy.embedding import Embedder
from proxy.settings import EmbeddingSettings

PAIRS = yaml.safe_load((Path(__file__).resolve().parents[2] / "data" /
                        "semantic_pairs.yaml").read_text())


@pytest.fixture
async def scored() -> dict[str, list[tuple[float, bool]]]:
    emb = Embedder(EmbeddingSettings())
    await emb.start()
    out: dict[str, list[tuple[float, bool]]] = {}
    for label, pairs in PAIRS.items():
        vecs, _ = await emb.embed([t for pair in pairs for t in pair])
        out[label] = [(float(np.dot(vecs[2 * i], vecs[2 * i + 1])), guard_ok(b, a))
                      for i, (a, b) in enumerate(pairs)]
    await emb.close()
    return out


def hits(rows: list[tuple[float, bool]], threshold: float, guard: bool = True) -> int:
    return sum(score >= threshold and (ok or not guard) for score, ok in rows)


async def test_labelled_pairs(scored: dict[str, list[tuple[float, bool]]]) -> None:
    t = SemanticConfig().threshold
    para, near = scored["paraphrase"], scored["near_miss"]
    para_rate = hits(para, t) / len(para)
    near_rate = hits(near, t) / len(near)
    unguarded = hits(near, t, guard=False) / len(near)
    print(f"\nsemantic @ {t}: paraphrase hit rate {para_rate:.0%} ({len(para)} pairs), "
          f"near-miss hit rate {near_rate:.0%} ({len(near)} pairs; "
          f"{unguarded:.0%} without the guard)")
    assert near_rate == 0.0
    assert para_rate >= 0.85
    assert unguarded > 0  # the guard is doing real work on this set
