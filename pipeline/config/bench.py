"""The ``bench`` settings (``conf/config.yaml``'s ``bench:``): how candidates are timed, loaded and
soaked.

In: nothing (typed config). Out: ``BenchConfig``: ``TimingConfig`` (what shapes the benchmark's
numbers, and nothing else: the benchmark stage's key), ``LoadConfig`` (the load test and soak) and
the mode. Values are checked when the config is made (exit 2).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from pipeline.config.checks import positive
from pipeline.core.errors import ConfigError


class BenchMode(str, Enum):
    latency = "latency"  # interleaved A/B timing of every artifact (always done)
    load = "load"        # plus open-loop Poisson load through a dynamic batcher
    soak = "soak"        # plus minutes at a fixed rate, watching memory and p99


@dataclass
class LoadConfig:
    max_batch: int = 8                      # dynamic batcher: largest batch it forms ...
    # ... and the longest the oldest request waits for company. 0: take what is queued now (the
    # queue fills while the model is busy, so batches grow with load and idle requests never wait).
    max_wait_ms: float = 0.0
    steps: int = 8                          # QPS steps, geometric, from each model's capacity
    refine_steps: int = 3                   # bisection steps between the last pass and first miss
    # Requests batch only with others whose input shape, each dimension rounded up to a multiple
    # of this, is the same (0: any shapes, padded to the largest). Padding costs more than batching saves.
    shape_bucket: int = 32
    step_seconds: float = 5.0               # duration of each QPS step
    soak_seconds: float = 120.0             # soak duration (the article: 30-60 min in production)
    soak_qps: Optional[float] = None        # soak rate; null = half the batch-1 capacity
    leak_mb_per_min: float = 2.0            # RSS growth above this, sustained, is a leak

    def __post_init__(self):
        positive(self, "bench.load", "max_batch", "steps")
        for name in ("step_seconds", "soak_seconds", "leak_mb_per_min"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"bench.load.{name}={getattr(self, name)}: must be > 0")
        for name in ("max_wait_ms", "refine_steps", "shape_bucket"):
            if getattr(self, name) < 0:
                raise ConfigError(f"bench.load.{name}={getattr(self, name)}: must be >= 0")


@dataclass
class TimingConfig:
    """What shapes the benchmark's numbers, and nothing else: the benchmark stage's key."""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])
    min_rounds: int = 200                   # interleaved rounds per batch size before stopping
    min_seconds: float = 10.0               # per batch size: spread the rounds over at least this
    max_seconds: float = 60.0               # per batch size: keep measuring while CIs are wide
    rel_ci: float = 0.03                    # target half-width of each ratio's 95 % CI
    block: int = 1                          # runs per model per round (1: 20 across runtimes)
    size_buckets: int = 4                   # input shape classes by the dynamic axis's size
    batches_per_bucket: int = 2             # distinct real batches per shape class
    warmup_window: int = 10                 # warm-up ends when two windows' medians agree ...
    warmup_tolerance: float = 0.05          # ... within this fraction
    warmup_max_runs: int = 300
    aa_tolerance: float = 0.03              # the A/A ratio must read 1.00 +- this
    cold_start_repeats: int = 3             # fresh processes per model; 0 skips cold start
    nonce: str = ""                         # any new value forces a fresh measurement (make bench)

    def __post_init__(self):
        positive(self, "bench", "min_rounds", "block", "size_buckets", "batches_per_bucket",
                  "warmup_window", "warmup_max_runs")
        if not self.batch_sizes or any(b <= 0 for b in self.batch_sizes):
            raise ConfigError(f"bench.batch_sizes={self.batch_sizes}: expected positive sizes")
        if self.max_seconds <= 0:
            raise ConfigError(f"bench.max_seconds={self.max_seconds}: must be > 0")
        for name in ("rel_ci", "warmup_tolerance", "aa_tolerance"):  # fractions of a ratio
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"bench.{name}={getattr(self, name)}: must be in (0, 1)")
        if self.min_seconds < 0:
            raise ConfigError(f"bench.min_seconds={self.min_seconds}: must be >= 0")
        if self.cold_start_repeats < 0:
            raise ConfigError(f"bench.cold_start_repeats={self.cold_start_repeats}: must be >= 0")


@dataclass
class BenchConfig(TimingConfig):
    """The ``bench`` group: the timing, plus what the load test and soak run with."""
    mode: BenchMode = BenchMode.latency
    load: LoadConfig = field(default_factory=LoadConfig)    # used by mode=load and mode=soak

    def timing(self) -> TimingConfig:
        """The timing fields alone, for the benchmark stage: load-test knobs stay out of its key."""
        return TimingConfig(**{f.name: getattr(self, f.name)
                               for f in dataclasses.fields(TimingConfig)})
