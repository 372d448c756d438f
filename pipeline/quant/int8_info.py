"""The INT8 sub-recipe's record for the report, typed: what was quantized how, and why.

In: what the INT8 sub-recipe (``pipeline.recipes.int8``) decided and measured, step by step.
Out: ``QuantInfo`` and its sub-records: the settings from the CPU's flags, the calibration and
how each method ranked, the outlier smoothing tried, the explanation of the final model
(``quant.explanation``), the latency-aware node trial, the float regions, the outputs left
float, the per-node sensitivity, the mixed search (``quant.search_record``), the check against
FP32 and, for a fused transformer, which graph dynamic INT8 quantized. The report reads them by
field; ``report.json``'s ``quantization`` section is ``to_json(info)`` and reads back with
``QuantInfo.from_json`` (``core.json_record``: the field names are the keys). The float-region
record is the region search's own (``pipeline.recipes.regions``), kept as it gives it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.json_record import from_json, key, omitted, to_json
from pipeline.measure.results import Speedup
from pipeline.quant.defaults import Int8Settings
from pipeline.quant.explanation import Explanation
from pipeline.quant.search_record import NodeSensitivity, SearchRecord


@dataclass(frozen=True)
class Smoothing:
    """SmoothQuant-style migration: each strength's all-INT8 score on the hardest samples."""
    scores: dict[str, float]   # "off" or the alpha (as text) -> score
    chosen: object             # "off", or the alpha kept (a number)
    metric: str
    activations: int           # MatMul inputs whose channel ranges were measured
    largest_outlier_ratio: float | None


@dataclass(frozen=True)
class NodeTrial:
    """The latency-aware trial: the nodes profiled slower in INT8, float, timed end to end."""
    float_nodes: tuple[str, ...]
    stayed_int8: tuple[str, ...]   # excluded, yet INT8 between INT8 neighbours (onnxruntime)
    speedup_over_all_int8: Speedup | None


@dataclass(frozen=True)
class SourceTimes:
    export: float
    fused: float


@dataclass(frozen=True)
class DynamicSourceChoice:
    """Dynamic INT8 of a fused transformer: which graph it quantized. One graph: why that one;
    both: their timings head to head at the gate's batch size."""
    chosen: str                                  # fused | export
    forced: str | None                           # quant.dynamic_source when not auto
    why: str | None = omitted()
    batch_size: int | None = omitted()
    ms: SourceTimes | None = omitted()
    export_over_fused_speedup: Speedup | None = omitted()
    noisy: bool | None = omitted()
    candidates: dict[str, str] | None = omitted()  # source -> digest


@dataclass(frozen=True)
class VersusFp32:
    """The final INT8 model against FP32 at every benchmarked batch size."""
    speedup: dict[str, Speedup]     # batch size (as text) -> INT8 over FP32
    slower_at_batch: tuple[str, ...]
    candidate: str                  # int8, or fp32 where INT8 was slower somewhere


@dataclass(frozen=True)
class NodeSqnr:
    """A node's output SQNR against FP32 on the ranking subset (no mixed search ran)."""
    node: str
    sqnr_db: float | None

    @property
    def metric_effect(self) -> None:
        """Measured only by the mixed search (``NodeSensitivity``)."""
        return None


@dataclass
class QuantInfo:
    settings: Int8Settings
    calibration: str
    calibration_ranking: dict[str, float] = field(default_factory=dict)  # method -> ranking score
    smoothing: Smoothing | None = None
    explain: Explanation | None = None
    latency_exclusions: list[str] = field(default_factory=list)
    node_trial: NodeTrial | None = key("latency_trial", default=None)
    regions: object = None               # float regions tried end to end (quant.region_trials)
    float_outputs: list[str] = field(default_factory=list)  # outputs left float: no 8-bit logits
    sensitivity: list[NodeSensitivity | NodeSqnr] = field(default_factory=list)
    search: SearchRecord | None = None
    versus: VersusFp32 | None = key("versus_fp32", default=None)
    #                                      when slower somewhere, the candidate is the FP32 model
    source: DynamicSourceChoice | None = key("dynamic_source", default=None)

    @classmethod
    def from_json(cls, data: dict) -> QuantInfo:
        """``report.json``'s ``quantization`` section as the record it was written from."""
        return from_json(cls, data)

    # The JSON forms under the old attribute names, for the readers that embed or read them as
    # JSON (quant=auto's record, the manifest's version name) until they read the fields.
    @property
    def latency_trial(self) -> dict | None:
        return to_json(self.node_trial)

    @property
    def versus_fp32(self) -> dict | None:
        return to_json(self.versus)

    @property
    def dynamic_source(self) -> dict | None:
        return to_json(self.source)
