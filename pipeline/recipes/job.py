"""A sub-recipe's job: the run's facts and the settings it reads, frozen, instead of the whole
``Config`` plus positional arguments.

In: the run's ``Config``, its task and data splits (built once by the recipe). Out: ``Int8Job``,
what the INT8 sub-recipe (``pipeline.recipes.int8``, its steps, the mixed and region searches)
reads and nothing else: the ``quant``, ``bench`` and ``gate`` settings, how the target runs,
the evaluation batch size, the model's name for messages, the task and its evaluation and
calibration splits. ``quant=auto`` builds each candidate from one job with other quant
settings (``with_quant``), never from a copied ``Config``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from pipeline.config import BenchConfig, GateConfig, QuantConfig


@dataclass(frozen=True)
class Int8Job:
    quant: QuantConfig
    bench: BenchConfig        # how long a latency trial may time (min_rounds, max_seconds)
    gate: GateConfig          # the speed gate's batch, min_speedup, the accuracy limits
    hw: object                # runtimes.Target: how the target runs
    model_name: str           # named when quant.exclude names a node the model lacks
    eval_batch_size: int
    task: object              # the task: its primary metric, dynamic op types, smoothing alphas
    evaluation: object        # the evaluation DataSplit
    calibration: Callable     # gives the calibration split (built only when a method needs it)

    @classmethod
    def of(cls, cfg, task, splits) -> Int8Job:
        return cls(cfg.quant, cfg.bench, cfg.gate, cfg.hardware.target(), cfg.model.name,
                   cfg.model.eval_batch_size, task, splits.evaluation, splits.calibration)

    def with_quant(self, **changes) -> Int8Job:
        """The same job with other quant settings (``mode=``, ``region_trials=`` ...)."""
        return replace(self, quant=replace(self.quant, **changes))
