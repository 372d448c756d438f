"""The explain stage's record, typed: why the INT8 model is as fast as it is.

In: an ``explain`` artifact (``pipeline.stages.explain``, whose ``meta`` stays the JSON it
writes). Out: ``Explanation``: the profiled batch, both models' totals, the Q/DQ pairs
onnxruntime left unfused, its INT8 kernels and float compute, and one ``NodeProfile`` per node
(FP32 and INT8 time, gain, whether INT8 lost), read once where the recipe reads the stage and
passed on by field (the mixed search, the report's per-layer table). Written back
(``core.json_record.to_json``) it is the stage's meta, key for key.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.json_record import from_json, omitted


@dataclass(frozen=True)
class FusionGroup:
    """What FP32 ran as one kernel (a Conv and its HardSwish) timed as a group in both models."""
    host: str
    fp32_ms: float
    int8_ms: float


@dataclass(frozen=True)
class NodeProfile:
    node: str
    module: str | None       # the source module's path, where the graph names one
    fp32_op: str
    int8_op: str             # the kernel the INT8 model runs for it
    precision: str           # int8 | int8-dynamic | float (the quantize stage's word)
    fp32_ms: float
    int8_ms: float
    gain_ms: float           # FP32 minus INT8: negative where INT8 is slower
    slower_in_int8: bool
    fusion_group: FusionGroup | None = omitted()


@dataclass(frozen=True)
class Explanation:
    batch_size: int
    runs: int
    fp32_total_ms: float
    int8_total_ms: float
    qdq_overhead_ms: float
    nodes: tuple[NodeProfile, ...]   # slowest in FP32 first
    slower_in_int8: tuple[str, ...]
    unfused_quantize: int
    unfused_dequantize: int
    int8_kernels: tuple[str, ...]
    float_compute: tuple[str, ...]
    ran_alone: dict | None = omitted()  # the runner's lock record

    @classmethod
    def of(cls, art) -> Explanation:
        return from_json(cls, art.meta)

    def gains(self) -> dict[str, float]:
        """Node -> the INT8 time it gives back when float."""
        return {r.node: r.gain_ms for r in self.nodes}
