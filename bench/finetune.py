"""Issue 14's last candidate: MiniLM fine-tuned on the labelled TUNE part, judged on the
held-out part.

`python -m bench.finetune [--epochs 4] [--lr 2e-5]` (a few minutes on 2 cores; needs the
dev extras: sentence-transformers)

Training pairs, all from tests/data/semantic_tune.yaml: its paraphrases (and the
paraphrases of one stored question paired with each other) against its near misses and
every pair of its distinct stored questions. Loss: CoSENT (every positive pair's cosine
above every negative's in the batch), AdamW, batches of 32, seed 0. The threshold is then
tuned on the tune part only, as bench/embedders.py does for every candidate, and the
held-out and original sets are reported at it. "Separable" is the held-out part's own
best threshold (the lowest with no false hit there): an upper bound no honest threshold
reaches, reported for the base model and the fine-tuned one alike, to tell a model that
separates paraphrases better from one that merely moved its scores.
Writes bench/results/finetune.json and .md.
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.embedders import load_set, make_runtime, rates, score_set, tune
from bench.report import write


def pairs(data: dict[str, Any]) -> list[tuple[str, str, float]]:
    pos = [tuple(p) for p in data["paraphrase"]]
    by: dict[str, list[str]] = {}
    for a, b in pos:
        by.setdefault(a, []).append(b)
    pos += [(x, y) for v in by.values() for x, y in itertools.combinations(v, 2)]
    neg = [tuple(p) for rows in data["near_miss"].values() for p in rows]
    neg += list(itertools.combinations(sorted(by), 2))
    return [(a, b, 1.0) for a, b in pos] + [(a, b, 0.0) for a, b in neg]


def train(out: Path, epochs: int, lr: float) -> dict[str, Any]:
    import torch
    from sentence_transformers import SentenceTransformer

    from proxy.embed_models import minilm_dir

    torch.manual_seed(0)
    rng = random.Random(0)
    data = pairs(load_set("tune"))
    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def embed(texts: list[str]) -> Any:
        out = model(model.preprocess(texts))["sentence_embedding"]
        return torch.nn.functional.normalize(out, dim=1)

    losses = []
    start = time.perf_counter()
    for _ in range(epochs):
        rng.shuffle(data)
        total = 0.0
        for i in range(0, len(data), 32):
            batch = data[i:i + 32]
            cos = (embed([p[0] for p in batch]) * embed([p[1] for p in batch])).sum(1) * 20
            label = torch.tensor([p[2] for p in batch])
            worse = (label[:, None] > label[None, :]).float()  # row positive, column negative
            diff = cos[None, :] - cos[:, None] - (1 - worse) * 1e12
            loss = torch.logsumexp(torch.cat([torch.zeros(1), diff.flatten()]), 0)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach())
        losses.append(round(total, 2))
    model.eval()
    model.save(str(out))
    return {"pairs": len(data), "epochs": epochs, "lr": lr, "epoch_losses": losses,
            "train_s": round(time.perf_counter() - start, 1)}


def judge(model: str) -> dict[str, Any]:
    runtime = make_runtime(model)
    scored = {n: score_set(load_set(n), runtime) for n in ("tune", "heldout", "original")}
    threshold = tune(scored["tune"])
    separable = tune(scored["heldout"])
    return {"tuned_threshold": threshold,
            "at_tuned": {n: rates(s, threshold) for n, s in scored.items()},
            "heldout_separable": rates(scored["heldout"], separable)}


def markdown(res: dict[str, Any]) -> str:
    def cell(r: dict[str, Any]) -> str:
        false = r["near_miss_hits"] + r["different_question_hits"]
        return f"{r['paraphrase_hit_rate']:.0%} / {false}"

    rows = [f"| {name} | {r['tuned_threshold']} | {cell(r['at_tuned']['tune'])} | "
            f"{cell(r['at_tuned']['heldout'])} | {cell(r['at_tuned']['original'])} | "
            f"{r['heldout_separable']['threshold']}: {cell(r['heldout_separable'])} |"
            for name, r in res["models"].items()]
    t = res["training"]
    return "\n".join([
        "# MiniLM fine-tuned on the tune part (bench/finetune.py)", "",
        f"CoSENT on {t['pairs']} labelled pairs of tests/data/semantic_tune.yaml, "
        f"{t['epochs']} epochs, lr {t['lr']}, {t['train_s']} s on the CPU. Cells: paraphrase "
        "hits / false hits (near misses and distinct stored questions).", "",
        "| model | threshold (tuned on tune) | tune | held-out | original | held-out "
        "separable (its own best threshold) |",
        "|---|---|---|---|---|---|", *rows, "",
        "Fine-tuning fits the tune part (its paraphrases nearly all hit) but barely moves "
        "how well the held-out part separates: the held-out paraphrases it hits at the "
        "tuned threshold come with false hits, and at the held-out's own best threshold it "
        "is within a few points of the base model. Not adopted; issue 14's held-out target "
        "needs a model that separates paraphrases from same-topic questions better than "
        "MiniLM, which these sets are too small to teach it."]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.finetune")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="weir-finetune-") as tmp:
        training = train(Path(tmp), args.epochs, args.lr)
        res = {"training": training,
               "models": {"builtin:minilm-torch (base)": judge("builtin:minilm-torch"),
                          "fine-tuned": judge(tmp)}}
    write("finetune", res, markdown(res).rstrip("\n"))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
