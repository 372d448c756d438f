"""What a quantize (or float_nodes) stage made of each node, typed.

In: a ``quantize`` or ``float_nodes`` artifact (``pipeline.stages``; their ``meta`` stays the
JSON they write). Out: ``Quantized``: each node's precision (``int8-static``,
``int8-dynamic``, ``float``), the names asked to stay float, and those onnxruntime kept INT8
anyway (a weightless node between INT8 neighbours); read once where a recipe reads the stage.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quantized:
    precision: dict[str, str]          # node -> int8-static | int8-dynamic | float
    excluded: tuple[str, ...]
    exclusion_ignored: tuple[str, ...]

    @classmethod
    def of(cls, art) -> Quantized:
        meta = art.meta
        return cls(meta["precision"], tuple(meta["excluded"]), tuple(meta["exclusion_ignored"]))

    def floated(self, names) -> list[str]:
        """Those of ``names`` (in their order) that are float in this model."""
        return [n for n in names if self.precision.get(n) == "float"]

    def int8(self) -> list[str]:
        """The nodes quantized, static or dynamic."""
        return [n for n, p in self.precision.items() if p.startswith("int8")]
