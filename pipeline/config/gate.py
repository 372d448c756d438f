"""The ``gate=`` group's schema (``conf/gate/``): what a candidate must meet to ship.

In: nothing (typed config). Out: ``GateConfig`` (accuracy drops in each metric's own scale, output
agreement, speedup, p99 against the SLO, model size). Values are checked when the config is made
(exit 2); metric names in ``max_accuracy_drop`` are checked by compose, which knows the task.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pipeline.config.checks import positive
from pipeline.core.errors import ConfigError


@dataclass
class GateConfig:
    # The largest drop below the FP16 baseline, in each metric's own scale (pipeline.metrics.
    # limits): null = each metric's default (0.3 points of an accuracy, 0.01 of a mean cosine and
    # 0.03 of its 1st percentile, ...); a number = the primary metric's limit; a mapping
    # {metric: limit} = those metrics judged too, e.g. {cosine_mean: 0.005, cer: 0.5}.
    max_accuracy_drop: Any = None
    min_output_agreement: float = 0.95      # share of outputs that agree with the FP16 baseline's
    output_rtol: float = 0.25               # continuous outputs: a row agrees within this relative
                                            # L2 error (0.25 ~ cosine 0.969 for unit vectors)
    min_speedup: float = 1.0                # lower 95 % bound vs the fastest float: never slower
    speedup_batch_size: int = 8             # the batch size the speed gate is judged at
    require_aa_check: bool = True           # refuse timings whose A/A self-check was off
    check_slo_p99: bool = True              # candidate p99 at the gate's batch <= slo.p99_ms
    max_model_mb: Optional[float] = None    # size limit of the shipped file; null = none

    def __post_init__(self):
        drop = self.max_accuracy_drop
        if isinstance(drop, dict):  # metric names are checked by compose (pipeline.metrics)
            drop = self.max_accuracy_drop = {str(k): v for k, v in drop.items()}
        for key, value in (drop.items() if isinstance(drop, dict) else [("", drop)]):
            where = f"gate.max_accuracy_drop{'.' + key if key else ''}={value!r}"
            if value is None and not key:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}: expected a number, null, or a mapping metric -> "
                                  "limit such as {cosine_mean: 0.01}")
            if not 0 <= value <= 100:
                raise ConfigError(f"{where}: must be in [0, 100] (a drop in the metric's own "
                                  "scale: points of an accuracy, a cosine, ...)")
        if not 0 < self.output_rtol < 10:
            raise ConfigError(f"gate.output_rtol={self.output_rtol}: must be in (0, 10)")
        if self.min_speedup < 0:
            raise ConfigError(f"gate.min_speedup={self.min_speedup}: must be >= 0")
        if not 0 <= self.min_output_agreement <= 1:
            raise ConfigError(f"gate.min_output_agreement={self.min_output_agreement}: must be "
                              "in [0, 1]")
        if self.max_model_mb is not None and self.max_model_mb <= 0:
            raise ConfigError(f"gate.max_model_mb={self.max_model_mb}: must be > 0 or null")
        positive(self, "gate", "speedup_batch_size")
