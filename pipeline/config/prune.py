"""The ``prune=`` group's schema (``conf/prune/``): structured channel pruning and its recovery.

In: nothing (typed config). Out: ``PruneConfig`` (method, ratio, importance, rounding, the layers
kept whole, the recovery fine-tune) and its enums. Values are checked when the config is made
(exit 2); the plan on the model's own network is ``pipeline.prune.helper.preflight``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from pipeline.config.checks import positive
from pipeline.core.errors import ConfigError


class PruneMethod(str, Enum):
    none = "none"            # no pruning: the recipe is exactly the unpruned one
    channels = "channels"    # structured channel pruning, then a recovery fine-tune


class PruneImportance(str, Enum):
    l1 = "l1"                # sum of |weight| over everything a channel group touches
    l2 = "l2"                # the same with squares
    bn_scale = "bn_scale"    # |gamma| of the BatchNorm after a conv


@dataclass
class PruneConfig:
    method: PruneMethod = PruneMethod.none
    ratio: float = 0.3                      # share of each layer's channels removed, in [0, 1)
    importance: PruneImportance = PruneImportance.l1
    round_to: int = 8                       # kept channels rounded down to a multiple of this
    ignored: Optional[list[str]] = None     # modules whose widths are kept; null = the model's
    recover_steps: int = 450                # fine-tune steps on freshly generated lines
    recover_lr: float = 5e-4                # peak of the one-cycle schedule
    recover_batch_size: int = 32
    eval_samples: int = 500                 # held-out lines scored before and after recovery
    seed: int = 0                           # recovery data stream and initialisation

    def __post_init__(self):
        if not 0 <= self.ratio < 1:
            raise ConfigError(f"prune.ratio={self.ratio}: must be in [0, 1) (the share of each "
                              "layer's channels removed)")
        positive(self, "prune", "round_to", "recover_batch_size", "eval_samples")
        if self.recover_steps < 0:
            raise ConfigError(f"prune.recover_steps={self.recover_steps}: must be >= 0")
        if self.recover_lr <= 0:
            raise ConfigError(f"prune.recover_lr={self.recover_lr}: must be > 0")
