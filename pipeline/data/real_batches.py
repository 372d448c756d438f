"""Real batches for timing: the one place benchmark, compare, regions, explain, the load test and
the project's benchmarks take their inputs from.

In: a task (``pipeline.task.contract.Task``) and a data split read through it. Out: feeds
(input name -> array, every input of the model, int64 ones included) cut from real samples:
bucketed by the real sizes of the task's dynamic axis (``size_axis``: a text line's width, a
sequence's length), so timings describe the input distribution rather than one shape; or the
first batches in order; or single requests for a serving batcher. Timing on zeros or on one
shape would hide a runtime that falls back to a slow kernel for some sizes. ``bucket_axis`` picks
that axis for a user's model, in this one place: the dynamic axis whose sizes vary in the data
(a 3 x 48 x width input varies in its width, never in its height), or the one the user names.
"""
from __future__ import annotations

import numpy as np


def bucket_axis(inputs, samples: list[dict], named: str = "") -> tuple[str, int]:
    """(input, axis) to bucket batches by. ``inputs``: the task's ``InputSpec``s; ``samples``:
    per sample, each input's array without the batch axis. ``named`` (``data.bucket_axis``): an
    axis index of the first input (``3``), of a named one (``image:3``) or an axis meaning
    (``width``). Unnamed: of the non-batch dynamic axes, the one with the most distinct sizes
    over ``samples`` (the first declared on a tie, or when none varies); none at all: the batch
    axis (fixed-size inputs have one shape). ValueError when ``named`` is no dynamic axis."""
    dyn = [(i.name, a) for i in inputs for a, m in i.dynamic.items() if m != "batch"]
    if named:
        name, _, axis = named.rpartition(":")
        spec = next((i for i in inputs if i.name == (name or inputs[0].name)), None)
        if spec is not None and axis.isdigit() and int(axis) in spec.dynamic \
                and spec.dynamic[int(axis)] != "batch":
            return spec.name, int(axis)
        by_meaning = [(i.name, a) for i in inputs for a, m in i.dynamic.items() if m == named]
        if not name and len(by_meaning) == 1:
            return by_meaning[0]
        choices = ", ".join(f"{n}:{a} ({next(i for i in inputs if i.name == n).dynamic[a]})"
                            for n, a in dyn) or "none (every axis but the batch is fixed)"
        raise ValueError(f"not a dynamic axis of the model's inputs; they are: {choices}")
    if not dyn:
        return inputs[0].name, 0
    distinct = [len({s[n].shape[a - 1] for s in samples if n in s}) for n, a in dyn]
    return dyn[distinct.index(max(distinct))]


def size_buckets(sizes: np.ndarray, n: int) -> list[np.ndarray]:
    """Indices of the samples split into ``n`` buckets of equal count by dynamic-axis size."""
    order = np.argsort(np.asarray(sizes), kind="stable")
    return [b for b in np.array_split(order, n) if b.size]


def bucketed(t, ds, batch_size: int, buckets: int, per_bucket: int,
             rng: np.random.Generator) -> tuple[list[dict], list[int]]:
    """``per_bucket`` batches of ``batch_size`` random samples from each size bucket; returns the
    feeds and each batch's bucket."""
    inputs, bucket_of = [], []
    for k, idx in enumerate(size_buckets(t.sizes(ds), buckets)):
        for _ in range(per_bucket):
            pick = [int(i) for i in rng.choice(idx, size=min(batch_size, idx.size), replace=False)]
            inputs.append(next(t.batches(ds.select(pick), batch_size)).feeds)
            bucket_of.append(k)
    return inputs, bucket_of


def in_order(t, ds, batch_size: int, count: int = 8) -> list[dict]:
    """Up to ``count`` batches of consecutive samples (at least one, however small the set)."""
    n = min(count, max(1, len(ds) // batch_size))
    return [next(t.batches(ds.select(range(k * batch_size, min((k + 1) * batch_size, len(ds)))),
                           batch_size)).feeds for k in range(n)]


def spread(t, ds, batch_size: int) -> dict:
    """One batch of samples spread evenly over the set (a profile's representative input)."""
    pick = list(range(0, len(ds), max(1, len(ds) // batch_size)))[:batch_size]
    return next(t.batches(ds.select(pick), batch_size)).feeds


def singles(t, ds, limit: int = 256) -> list[dict]:
    """Single requests (batches of one) from the first ``limit`` samples."""
    from pipeline.task.contract import one, rows

    return [one(b.feeds, k) for b in t.batches(ds.select(range(min(limit, len(ds)))), 1)
            for k in range(rows(b.feeds))]
