"""What ``quant=auto`` found: every candidate on every runtime, the winner and why.

In: the judged table (``pipeline.recipes.auto_table``), the notes on candidates not built, the
plan's targets and failures, and the INT8 candidate's float-node and float-region trials. Out:
``AutoResult``, the frozen record the recipe returns in ``Outcome.auto`` and the report renders
by field (``pipeline.report.auto``); its JSON (``pipeline.core.json_record.to_json``) is
report.json's ``auto`` section as every earlier run wrote it, ``of`` reads that JSON back.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.json_record import from_json, omitted
from pipeline.measure.results import Speedup
from pipeline.recipes.auto_table import Row
from pipeline.recipes.regions_record import FloatRegions


@dataclass(frozen=True)
class LatencyTrial:
    """The INT8 candidate's per-node trial: the nodes that profiled slower in INT8, kept float."""
    float_nodes: list[str]
    stayed_int8: list[str]           # named float, but the quantizer kept them INT8
    speedup_over_all_int8: Speedup | None  # None: not timed (nothing went float)


@dataclass(frozen=True)
class Int8Trials:
    """What the INT8 candidate tried for speed, and what it kept float."""
    latency_trial: LatencyTrial | None
    regions: FloatRegions | None
    latency_exclusions: list[str]
    float_outputs: list[str]

    @classmethod
    def of(cls, info) -> Int8Trials:
        """From the INT8 sub-recipe's ``QuantInfo`` (its records as JSON or typed)."""
        return cls(from_json(LatencyTrial, info.latency_trial)
                   if info.latency_trial is not None else None,
                   FloatRegions.of(info.regions), list(info.latency_exclusions),
                   list(info.float_outputs))


@dataclass(frozen=True)
class Notes:
    """Why a candidate was not built or a search not tried (None: it was)."""
    regions: str | None = omitted()
    dynamic: str | None = omitted()
    mixed: str | None = omitted()


@dataclass(frozen=True)
class AutoResult:
    winner: Row                      # the row that ships (or, with none passing, goes to the gate)
    table: list[Row]                 # each (candidate, target), judged as if it shipped
    why: list[str]                   # why the winner won, in a few sentences
    notes: Notes = Notes()
    targets: list[str] = field(default_factory=list)     # every runtime and precision here
    unavailable: dict[str, str] = field(default_factory=dict)  # target -> why it cannot run
    failures: dict[str, str] = field(default_factory=dict)     # label -> what failed there
    gate_batch: int | None = None    # the batch the speed gate judges at
    int8: Int8Trials | None = None
    # a fused transformer's dynamic candidate: which graph it quantized, both timings
    dynamic_source: dict | None = None

    @classmethod
    def of(cls, data) -> AutoResult:
        """The record from report.json's ``auto`` section, or the record itself."""
        return data if isinstance(data, cls) else from_json(cls, data)
