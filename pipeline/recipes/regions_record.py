"""The float-region search's record: each region, each trial and what it cost or saved end to end.

In: the regions of the prepared model, the trials the search built and the ``regions`` stage's
timing of them (read once here: ``RegionsTimed``). Out: ``FloatRegions``, a frozen record that
the INT8 sub-recipe keeps (``QuantInfo.regions``), ``quant=auto`` carries and the report renders
by field; its JSON (``pipeline.core.json_record.to_json``) is the JSON every earlier run wrote, and
``of`` reads that JSON back (a report re-rendered from ``report.json``).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.json_record import from_json, omitted
from pipeline.measure.results import Speedup


@dataclass(frozen=True)
class TrialTiming:
    """One trial in the regions stage's meta (``pipeline.stages.regions``)."""
    p50_ms: float
    speedup_over_all_int8: Speedup   # > 1: keeping its regions float paid
    speedup_over_fp32: Speedup       # > 1: this mix beats the float model
    ms_saved_vs_all_int8: float


@dataclass(frozen=True)
class RegionsTimed:
    """The regions stage's meta: every trial timed in one interleaved run."""
    batch_size: int
    rounds: int
    p50_ms: dict[str, float]         # model (all-int8, fp32, each trial) -> p50
    all_int8_over_fp32: Speedup
    trials: dict[str, TrialTiming]

    @classmethod
    def of(cls, meta: dict) -> RegionsTimed:
        """A view: the meta's other keys (each model's warm-up runs) are not read here."""
        return from_json(cls, meta, known_only=True)


@dataclass(frozen=True)
class RegionGain:
    """A region of the model and what the per-node profile said INT8 gained in it."""
    name: str
    nodes: int
    profile_gain_ms: float


@dataclass(frozen=True)
class Trial:
    """A trial: the regions it floats, the nodes that went float, its end-to-end timing."""
    name: str
    regions: list[str]
    float_nodes: list[str]
    p50_ms: float
    speedup_over_all_int8: Speedup
    speedup_over_fp32: Speedup
    ms_saved_vs_all_int8: float


@dataclass(frozen=True)
class FloatRegions:
    regions: list[RegionGain]
    trials: list[Trial]
    kept: str | None                 # the trial kept, if one paid
    limit: int                       # quant.region_trials
    node_trial: Speedup | None       # the per-node trial's speedup over all-INT8, timed here
    # the timing of the trials; absent when no region could be made float
    batch_size: int | None = omitted()
    rounds: int | None = omitted()
    all_int8_over_fp32: Speedup | None = omitted()
    p50_ms: dict[str, float] | None = omitted()  # all-int8, fp32
    faster_than_fp32: list[str] | None = omitted()
    summary: str = ""

    @classmethod
    def of(cls, data) -> FloatRegions | None:
        """The record from its JSON (a report read back), or the record itself; None stays
        None."""
        if data is None or isinstance(data, cls):
            return data
        return from_json(cls, data)
