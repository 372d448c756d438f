"""Sentence pairs with gold similarity scores (STS-B style): Spearman's rho of the pairs' cosines.

In: per sample, an embedding (a prediction's ``output``) and its pair label (``{"pair": i,
"gold": score}``: both sides of pair ``i`` carry the same one). Out: ``spearman``, the rank
correlation between each complete pair's cosine similarity and its gold score, in [-1, 1]; NaN
when fewer than 3 complete pairs are scored or either side is constant (a rank correlation of a
constant is undefined, and the gate fails closed on NaN). A subset of samples (the quantization
search ranks on one) scores the pairs it holds both sides of. Pure numpy (no scipy dependency):
average ranks for ties, then Pearson's r of the ranks, which is what ``scipy.stats.spearmanr``
computes.
"""
from __future__ import annotations

import math

import numpy as np

from pipeline.task.metric import MetricSpec

# Rank correlation in [-1, 1]: a drop of 0.01 is what two runs of a good encoder differ by.
SPECS = {"spearman": MetricSpec("spearman", True, "", needs_labels=True, limit=0.01,
                                scale="rho")}


def ranks(x) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.bincount(inverse, weights=r) / counts)[inverse]


def spearman(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) != len(b):
        raise ValueError(f"{len(a)} values against {len(b)}")
    if len(a) < 3:
        return math.nan
    ra, rb = ranks(a) - (len(a) + 1) / 2, ranks(b) - (len(b) + 1) / 2
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom > 0 else math.nan


def pair_cosines(embeddings: list, pair_labels: list) -> tuple[list[float], list[float]]:
    """(cosine, gold) of every pair whose two sides are both among the samples."""
    sides: dict[int, list] = {}
    gold: dict[int, float] = {}
    for e, lab in zip(embeddings, pair_labels):
        sides.setdefault(int(lab["pair"]), []).append(np.asarray(e, dtype=np.float64).ravel())
        gold[int(lab["pair"])] = float(lab["gold"])
    cos, g = [], []
    for p, vs in sides.items():
        if len(vs) != 2:
            continue
        n = np.linalg.norm(vs[0]) * np.linalg.norm(vs[1])
        cos.append(float(vs[0] @ vs[1] / n) if n > 0 else 0.0)
        g.append(gold[p])
    return cos, g


def score(embeddings: list, pair_labels: list) -> dict[str, float]:
    cos, gold = pair_cosines(embeddings, pair_labels)
    return {"spearman": spearman(cos, gold)}
