"""The mixed-precision search's record, typed (``pipeline.recipes.mixed``).

In: what the search measured. Out: ``SearchRecord`` (its verdict, the trace of full
evaluations, the order the units were ranked in, each unit's signals, the costly nodes handed
back to INT8) and the per-node ``NodeSensitivity`` rows, which the report reads by field and
``report.json`` stores key for key (``core.json_record.to_json``: the field names are the keys).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceRow:
    """One model evaluated on the full set: which nodes it kept float and what that gave."""
    float_nodes: tuple[str, ...]
    accuracy: float
    drop: float                # against the FP16 reference, in the metric's points
    within_budget: bool
    estimated_ms: float        # the INT8 profile plus the gains the float nodes give back
    step: str                  # why it was evaluated ("all INT8", "top 2 of 9 blocks float" ...)


@dataclass
class TrialCounts:
    """What the search spent: counted as it goes, a copy frozen into the verdict."""
    ranking_trials: int = 0    # one unit floated, scored on the ranking subset
    hand_back_trials: int = 0  # one costly node back to INT8, on the ranking subset
    edited: int = 0            # models made by editing the INT8 graph (no re-quantization)
    requantized: int = 0
    full_evaluations: int = 0


@dataclass(frozen=True)
class SearchVerdict:
    budget_points: float
    met: bool
    chosen_float_nodes: tuple[str, ...]
    drop: float
    full_evaluations: int
    evaluation_limit: int
    within_limit: bool
    quantizable_nodes: int
    units: int
    ranked_by: str             # blocks | nodes
    trials: TrialCounts
    seconds: float
    time_budget_s: float
    stopped_by_budget: str | None   # the phase the time budget stopped, if it did
    summary: str


@dataclass(frozen=True)
class UnitRow:
    """A unit as the search saw it: its size, cheap signals and measured effect."""
    name: str
    nodes: int
    gain_ms: float
    sqnr_db: float | None
    signal: str                # clean | cheap | trial
    effect: float | None
    can_float: bool


@dataclass(frozen=True)
class HandBack:
    node: str
    gain_ms: float
    harm: float                # accuracy lost on the ranking subset when handed back
    handed_back: bool


@dataclass(frozen=True)
class SearchRecord:
    verdict: SearchVerdict
    trace: tuple[TraceRow, ...]
    order: tuple[str, ...]
    groups: tuple[UnitRow, ...]
    hand_back: tuple[HandBack, ...]


@dataclass(frozen=True)
class NodeSensitivity:
    """One node of the search: its unit, its signals, and what floating its unit did."""
    node: str
    op: str
    group: str
    sqnr_db: float | None
    latency_gain_ms: float
    metric_effect: float | None
    score: float | None        # metric effect per ms given up
    signal: str
    can_float: bool
