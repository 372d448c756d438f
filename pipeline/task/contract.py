"""The task contract: everything a generic stage may know about a model, declared and checked.

In: nothing (types). Out: ``InputSpec``/``OutputSpec`` (names, dtypes, shapes whose dynamic axes
are named after what they mean: ``batch``, ``width``, ``sequence``), ``DataSplit`` (one value that
names a data split by task, split, sample count, folder and content digest, so a data set edited
in place changes every stage key that reads it), ``Batch`` (row indices, the feeds by input name,
the labels), ``MetricsSpec`` (the metrics, the primary one and each one's direction and unit) and
``Task``, the protocol a task implements: read a split, batch it, stack single requests as a
serving batcher would, turn outputs into predictions and scores. ``Prunable`` and
``PruningHelper`` are the optional part channel pruning reads (a task that can be pruned hands out
its helper; one that cannot says why in ``no_pruning``). ``check`` lists what a task object gets
wrong. The built-in OCR tasks (``pipeline.models.ocr.crnn``), an ONNX file
(``pipeline.models.onnx_file``) and a torch factory (``pipeline.models.torch_factory``) are the
implementations; no stage below them names a model, an axis or a metric.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple, Protocol, runtime_checkable

import numpy as np

from pipeline.task.metric import MetricSpec

AXIS_MEANINGS = ("batch", "width", "height", "sequence", "time", "dynamic")


@dataclass(frozen=True)
class InputSpec:
    """One model input. ``shape`` holds an int per fixed axis and a meaning per dynamic one."""
    name: str
    dtype: str                    # a numpy dtype name: float32, int64, ...
    shape: tuple

    @property
    def dynamic(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}


@dataclass(frozen=True)
class OutputSpec:
    name: str
    dtype: str
    shape: tuple


@dataclass(frozen=True)
class MetricsSpec:
    """The metrics a task reports; the gate, the mixed search and the runtime choice judge the
    primary one through its ``MetricSpec.drop`` (direction and unit included)."""
    specs: tuple[MetricSpec, ...]
    primary: str

    def __post_init__(self):
        if self.primary not in {s.name for s in self.specs}:
            raise ValueError(f"primary metric {self.primary!r} is not among "
                             f"{[s.name for s in self.specs]}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)

    @property
    def primary_spec(self) -> MetricSpec:
        return self.spec(self.primary)

    def spec(self, name: str) -> MetricSpec:
        return next(s for s in self.specs if s.name == name)


@dataclass(frozen=True)
class DataSplit:
    """Which samples a stage reads: part of its cache key, so it carries the content digest."""
    task: Any                     # the task's key: a built-in name or a frozen source spec
    split: str                    # calibration | evaluation
    count: int
    folder: str                   # where the data lives (a built-in task's data_dir)
    digest: str                   # sha256 over the split's content


class Batch(NamedTuple):
    indices: list[int]            # rows of the split, in the order of the batch
    feeds: dict                   # input name -> array [batch, ...]
    labels: list                  # one per row; None entries when the data has no labels


@runtime_checkable
class Task(Protocol):
    key: Any                      # hashable; ``pipeline.models.task(key)`` rebuilds the task
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    metrics: MetricsSpec
    size_axis: tuple[str, int]    # (input, axis): the dynamic axis timing buckets batches by
    dynamic_op_types: tuple[str, ...]  # ops quantized dynamically (no calibration) by default
    prune_ignored: tuple[str, ...]     # modules pruning keeps whole by default
    label_free: bool              # no labels: scored by agreement with the FP16 baseline's outputs
    max_batch: int | None         # the largest batch the graph runs (1: a sample at a time);
                                  # None: any. batches() and example() never exceed it

    def split(self, which: str, count: int, data_dir: str) -> DataSplit: ...

    def dataset(self, split: DataSplit): ...

    def sizes(self, ds) -> np.ndarray: ...

    def batches(self, ds, batch_size: int, sort: bool = True,
                bounded: bool = False) -> Iterator[Batch]: ...

    def stack(self, requests: list[dict]) -> dict: ...

    def example(self, batch: int = 1) -> dict: ...

    def predictions(self, outputs) -> list: ...

    def margins(self, outputs) -> list[float]: ...

    # label-free tasks also take ``truth``: the data's own labels (None entries without)
    def score(self, predictions: list, labels: list) -> dict[str, float]: ...


class PruningHelper(Protocol):
    """What the ``prune`` stage asks of a model's pruning helper: the trace input, a held-out
    sample and its scores, the params that rebuild the pruned network, and a recovery loop."""
    MAC_INPUT: str                # what the MAC counts are per, in words
    HELD_OUT_SEED: int | None     # the seed the held-out sample comes from (None: the data's own)
    rebuild_by_history: bool      # the params cannot describe pruned widths: save the history

    def example(self): ...        # the trace input: a tensor, or a tuple of them

    def params_of(self, net) -> dict: ...

    def held_out_what(self, count: int) -> str: ...

    def held_out(self, count: int) -> list: ...

    def score(self, net, held: list) -> dict[str, float]: ...

    def recover(self, net, steps: int, lr: float, batch_size: int, seed: int, on_step=None,
                bf16: bool | None = None) -> float | None: ...


@runtime_checkable
class Prunable(Protocol):
    """A task whose network channel pruning can shrink (``pipeline.prune`` reads it only through
    this, so the models a task comes from are never named there). A task that is not one, or
    whose ``no_pruning`` holds a reason, is refused with that reason before anything is built.
    (The layers it keeps whole are the ``Task``'s ``prune_ignored``.)"""

    def pruning_helper(self, net) -> PruningHelper: ...


def size_of(task: Task, feeds: dict) -> int:
    """The size of a batch's bucketing axis (a text line's width, a sequence's length)."""
    name, axis = task.size_axis
    return int(feeds[name].shape[axis])


def rows(feeds: dict) -> int:
    return int(next(iter(feeds.values())).shape[0])


def one(feeds: dict, k: int) -> dict:
    """Row ``k`` of a batch as a batch of one."""
    return {n: a[k:k + 1] for n, a in feeds.items()}


def check(task) -> list[str]:
    """What ``task`` gets wrong about the contract, one line each (empty: it conforms). Runs the
    task's own example through its declared inputs, so a mismatch shows before any stage."""
    problems = []
    for attr in ("key", "inputs", "outputs", "metrics", "size_axis", "dynamic_op_types",
                 "prune_ignored", "label_free", "split", "dataset", "sizes", "batches", "stack", "example",
                 "predictions", "margins", "score"):
        if not hasattr(task, attr):
            problems.append(f"missing {attr}")
    if problems:
        return problems
    if not task.inputs or not task.outputs:
        problems.append("declares no inputs or no outputs")
    if not isinstance(task.metrics, MetricsSpec):
        problems.append("metrics is not a MetricsSpec")
    names = {i.name for i in task.inputs}
    name, axis = task.size_axis
    spec = next((i for i in task.inputs if i.name == name), None)
    if spec is None:
        problems.append(f"size_axis names input {name!r}, not one of {sorted(names)}")
    elif axis not in spec.dynamic:
        problems.append(f"size_axis {task.size_axis} is not a dynamic axis of {name}")
    for i in task.inputs:
        if i.dynamic.get(0) != "batch":
            problems.append(f"input {i.name}: axis 0 must be the dynamic batch axis")
        bad = [m for m in i.dynamic.values() if m not in AXIS_MEANINGS]
        if bad:
            problems.append(f"input {i.name}: unknown axis meaning(s) {bad}")
    two = min(2, task.max_batch or 2)  # a graph of batch 1 only is fed one sample at a time
    ex = task.example(two)
    if set(ex) != names:
        problems.append(f"example feeds {sorted(ex)} != declared inputs {sorted(names)}")
    for i in task.inputs:
        a = ex.get(i.name)
        if a is None:
            continue
        if str(a.dtype) != i.dtype:
            problems.append(f"example {i.name} is {a.dtype}, declared {i.dtype}")
        if a.ndim != len(i.shape) or any(isinstance(d, int) and d != s
                                         for d, s in zip(i.shape, a.shape)):
            problems.append(f"example {i.name} has shape {a.shape}, declared {i.shape}")
        elif a.shape[0] != two:
            problems.append(f"example({two}) gave a batch of {a.shape[0]}")
    return problems

