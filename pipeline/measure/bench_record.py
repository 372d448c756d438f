"""What a benchmark and a load test recorded, typed for the report that shows it.

In: a benchmark stage's ``meta`` (``stages/benchmark.py``, ``measure/latency.py``) and a
loadtest stage's (``stages/loadtest.py``). Out: frozen records read once with
``pipeline.core.json_record`` and passed on by field: per batch the rounds, noise, core states,
per-size medians, slow shapes and the A/A check; cold starts; the measured input contract; each
model's load curve and soak. Each record names the fields the report reads; the keys it does not
read stay in its ``REST`` field, so the report's JSON still carries them as the stage wrote them.
The gate's view of the same meta is ``pipeline.measure.results`` (speedups, verdict inputs).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.json_record import from_json, omitted, rest


@dataclass(frozen=True)
class Ratio:
    """A speed ratio and its 95 % interval (``timing.ratio_ci``; the A/A check adds its
    tolerance and whether it held)."""
    median: float
    ci95: tuple[float, float]
    rest: dict = rest()


@dataclass(frozen=True)
class CoreStateRow:
    """The rounds timed in one state of the cores (``latency.core_states``)."""
    round_trip_ns: float
    share: float
    speedup_vs_fastest_float: Ratio
    rest: dict = rest()


@dataclass(frozen=True)
class CoreState:
    changed: bool                    # the candidate's speedup differed between the states
    states: tuple[CoreStateRow, ...] = ()
    rest: dict = rest()


@dataclass(frozen=True)
class SizeP50:
    """One input timed: its size along the task's size axis and its median latency."""
    size: int
    p50: float
    rest: dict = rest()


@dataclass(frozen=True)
class ShapeOutlier:
    """An input much slower than its shape predicts (``latency.shape_outliers``)."""
    model: str
    size: int
    p50: float
    expected_p50: float


@dataclass(frozen=True)
class SizeAxis:
    meaning: str                     # what a size counts: "width", "token" ...
    rest: dict = rest()


@dataclass(frozen=True)
class BatchRecord:
    """One batch size of a benchmark."""
    rounds: int
    seconds: float
    noisy: bool
    per_size: dict[str, tuple[SizeP50, ...]]  # label -> its inputs' medians
    shape_outliers: tuple[ShapeOutlier, ...]
    aa_check: Ratio                  # FP32 against a second copy of itself
    core_state: CoreState | None = None
    # runtime=auto / quant=auto: each label's own core states (the shipped one's is reported)
    core_state_by_label: dict[str, CoreState] | None = omitted()
    rest: dict = rest()


@dataclass(frozen=True)
class ColdStart:
    """What a fresh process paid before its first result (``measure.coldstart``), or why it
    could not be measured."""
    error: str | None = omitted()
    total_ms: float | None = omitted()
    import_ms: float | None = omitted()
    session_ms: float | None = omitted()
    first_inference_ms: float | None = omitted()
    rest: dict = rest()


@dataclass(frozen=True)
class Dim:
    min: int
    max: int


@dataclass(frozen=True)
class InputContract:
    """The dimension ranges the benchmark measured (the first input's at the top level)."""
    shape: tuple[Dim, ...]
    input: str | None = None         # that input's name
    rest: dict = rest()

    def constant_axes(self) -> list[tuple[str, int, int]]:
        """(input, axis, size) for every axis after the batch that all timed samples had at
        one size."""
        return [(self.input, j, d.min) for j, d in enumerate(self.shape)
                if j > 0 and d.min == d.max] if self.input else []


@dataclass(frozen=True)
class BenchRecord:
    batches: dict[str, BatchRecord]  # batch size as the JSON writes it ("8") -> its record
    size_axis: SizeAxis | None = None
    cold_start_ms: dict[str, ColdStart] | None = None
    input_contract: InputContract | None = None
    rest: dict = rest()

    @classmethod
    def of(cls, bench) -> BenchRecord:
        return from_json(cls, bench.meta)


@dataclass(frozen=True)
class LoadStep:
    achieved_qps: float
    p99_ms: float
    rest: dict = rest()


@dataclass(frozen=True)
class LoadCurve:
    """One model under one batching policy: the highest rate within the p99 target."""
    max_qps_within_slo: float | None
    throughput_at_max: float | None
    steps: tuple[LoadStep, ...] = ()
    rest: dict = rest()


@dataclass(frozen=True)
class Memory:
    slope_mb_per_min: float | None = omitted()
    leak: bool | None = omitted()
    rest: dict = rest()


@dataclass(frozen=True)
class Soak:
    qps: float
    seconds: float
    memory: Memory
    rest: dict = rest()


@dataclass(frozen=True)
class LoadModel:
    dynamic: LoadCurve | None = omitted()
    batch1: LoadCurve | None = omitted()
    soak: Soak | None = omitted()
    rest: dict = rest()

    def curves(self) -> tuple[tuple[str, LoadCurve], ...]:
        """(policy, curve) for the policies that ran, dynamic batching first."""
        return tuple((p, c) for p, c in (("dynamic", self.dynamic), ("batch1", self.batch1))
                     if c is not None)


@dataclass(frozen=True)
class LoadRecord:
    slo_p99_ms: float
    models: dict[str, LoadModel]
    rest: dict = rest()

    @classmethod
    def of(cls, loadtest) -> LoadRecord:
        return from_json(cls, loadtest.meta)
