"""The ``slo=`` group's schema (``conf/slo/``): the service targets that decide the hardware.

In: nothing (typed config). Out: ``SloConfig`` (p99 target, peak and daily volume, the share of
measured throughput planned for, the batch a request is answered in). Values are checked when the
config is made (exit 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pipeline.config.checks import positive
from pipeline.core.errors import ConfigError


class SloMode(str, Enum):
    model = "model"  # the gate judges the model's own p99 (the benchmark, arrays in memory)
    serve = "serve"  # also the candidate behind the real server, from raw bytes (pipeline.serve)


@dataclass
class SloConfig:
    """The service targets that decide the hardware."""
    p99_ms: float = 200.0                   # a request's latency target, 99th percentile
    peak_qps: float = 50.0                  # requests per second at the busiest time
    max_input: int = 512                    # largest input a request may carry (OCR: line width
                                            # in pixels; LLM: prompt tokens)
    requests_per_day: int = 1_000_000       # daily volume: turns instance-hours into cost
    utilization: float = 0.7                # share of measured throughput planned for: an
                                            # instance run at 100 % queues without bound
    # The batch a request is answered in, where the gate judges p99 against p99_ms: 1 = each
    # request alone (an online service: a request is one input, not the speed gate's batch of 8).
    batch_size: int = 1
    # serve: at the end of the run the candidate is served (python -m pipeline.serve) and loaded
    # open-loop from the evaluation samples' raw bytes; that p99 is judged against p99_ms too.
    mode: SloMode = SloMode.model
    serve_qps: float = 10.0                 # serve: the rate offered to one server (requests/s)
    serve_seconds: float = 10.0             # serve: how long that rate is offered

    def __post_init__(self):
        for key in ("p99_ms", "peak_qps", "serve_qps", "serve_seconds"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"slo.{key}={getattr(self, key)}: must be > 0")
        positive(self, "slo", "max_input", "requests_per_day", "batch_size")
        if not 0 < self.utilization <= 1:
            raise ConfigError(f"slo.utilization={self.utilization}: must be in (0, 1]")
        if self.requests_per_day / 86400 > self.peak_qps:
            raise ConfigError(f"slo.requests_per_day={self.requests_per_day}: averages "
                              f"{self.requests_per_day / 86400:.1f} requests/s, above "
                              f"slo.peak_qps={self.peak_qps}")
