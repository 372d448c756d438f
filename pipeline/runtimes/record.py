"""The runtime choice as a record: what ``pipeline.runtimes.plan`` measured and decided, as
report.json, report.md and the manifest carry it (``report.json: runtimes``).

In: the plan's rows, cells and pick (``Plan.decide``), or a report's JSON (``RuntimePlan.of``).
Out: frozen records read by field. Two kinds of keys are not fields, because they are named by
the run, not by this schema: the primary metric's value in a row (``sequence_accuracy``,
``detection_f1``, ...) and every metric of an evaluation in a cell; each record keeps them in
``metrics`` and writes them back beside its fields, as the report always had them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from pipeline.core.json_record import from_json, omitted, rest
from pipeline.runtimes import Target


@dataclass(frozen=True)
class TargetRow:
    """The shipped model on one target at one batch size: its accuracy measured there, its
    timings from the benchmark, and whether it passes the accuracy gate against FP16."""
    target: str                      # "<runtime> <precision>"
    runtime: str
    precision: str
    label: str                       # the report's name for it: "candidate" or "candidate @ ..."
    accuracy_drop: float
    agreement_with_fp16: float
    p50: float
    p99: float
    passes_accuracy: bool
    speedup_vs_fastest_float: dict | None = None  # the benchmark's ratio: median and its CI
    metrics: dict = rest()           # the primary metric, under its own name

    def accuracy(self, metric: str) -> float:
        return self.metrics[metric]

    def target_of(self) -> Target:
        return Target(self.runtime, self.precision)


@dataclass(frozen=True)
class Choice(TargetRow):
    """One batch size's pick (its row) and every target it was picked from."""
    considered: tuple[TargetRow, ...] = ()

    @classmethod
    def of(cls, pick: TargetRow, considered: list[TargetRow]) -> Choice:
        return cls(**_row_fields(pick), considered=tuple(considered))

    def picked(self) -> TargetRow:
        """The pick's row alone (the manifest carries it without the others)."""
        return TargetRow(**_row_fields(self))


def _row_fields(row: TargetRow) -> dict:
    return {f.name: getattr(row, f.name) for f in fields(TargetRow)}


@dataclass(frozen=True)
class Cell:
    """One artifact on one target: its evaluation's metrics there, its latency per batch size,
    or the error that kept it from running."""
    output_sha256: str | None = omitted()
    executed: dict | None = omitted()        # the kernels it ran (precision per op type)
    latency_ms: dict | None = omitted()      # batch size -> {"p50": ms, "p99": ms}
    error: str | None = omitted()
    metrics: dict = rest()                   # the evaluation's metrics, by name


@dataclass(frozen=True)
class Deployed:
    """The runtime the candidate was gated on and ships with."""
    runtime: str
    precision: str
    performance_hint: str | None = None
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    version: str | None = None
    settings: dict | None = None      # what the runtime was given (OpenVINO's properties, ...)
    compiled: dict | None = None      # what it compiled the model to
    executed: dict | None = None      # the kernels it ran: the proof INT8 ran as INT8

    @classmethod
    def read(cls, recorded: dict | None, hardware: dict | None = None) -> Deployed:
        """What a published version's manifest (``runtime.deployed``) or a run's report
        (``runtimes.deployed``) recorded. Evidence from before runtimes were recorded (or a
        decoder's, which records none) ran ONNX Runtime in fp32 with its run's own ``hardware``
        settings (the config's ``hardware`` group), which fill what the record lacks."""
        hw = hardware or {}
        given = {k: v for k, v in (recorded or {}).items() if v is not None}
        return from_json(cls, {"runtime": "onnxruntime", "precision": "fp32",
                               "performance_hint": hw.get("performance_hint") or "latency",
                               "intra_op_threads": hw.get("intra_op_threads"),
                               "inter_op_threads": hw.get("inter_op_threads"), **given},
                         known_only=True)

    @property
    def disabled_optimizers(self) -> list[str]:
        """ONNX Runtime's graph optimizers the gate ran with off (named in the model)."""
        return list((self.settings or {}).get("disabled_optimizers") or [])


@dataclass(frozen=True)
class RuntimePlan:
    """Every target the run weighed, each artifact's cell on each, the pick per batch size and
    what was deployed."""
    mode: str                                         # "fixed" or "auto" (runtime=auto)
    deployed: Deployed
    targets: tuple[str, ...] = ()
    unavailable: dict[str, str] = field(default_factory=dict)  # target -> why not here
    failures: dict[str, str] = field(default_factory=dict)     # "<role> @ <target>" -> error
    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)  # role -> target -> cell
    choice: dict[str, Choice] = field(default_factory=dict)    # batch size -> its pick

    @classmethod
    def of(cls, data: dict) -> RuntimePlan:
        """A report's ``runtimes`` object (strict: a key no field names is a bug)."""
        return from_json(cls, data)
