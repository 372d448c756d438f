"""The compare stage's record, typed: two models timed head to head.

In: a ``compare`` artifact (``pipeline.stages.compare``: model ``a`` is the stage's parent,
``b`` its ``other``). Out: ``Comparison``: a's speedup over b with its 95 % interval, each
one's median time, and whether the rounds were noisy; read once where a recipe reads the stage.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.measure.results import Speedup


@dataclass(frozen=True)
class Comparison:
    a_over_b: Speedup        # t_b / t_a per round: above 1, a is faster
    ms_a: float
    ms_b: float
    noisy: bool

    @classmethod
    def of(cls, art) -> Comparison:
        meta = art.meta
        return cls(Speedup.of(meta["a_over_b_speedup"]), meta["ms_a"], meta["ms_b"],
                   bool(meta["noisy"]))
