"""What a transformer's fuse stage recorded (``stages/fuse.py``), typed for the report.

In: the fuse stage's ``meta``. Out: a frozen ``FuseRecord`` read once with
``pipeline.core.json_record``: the model type, heads and hidden size onnxruntime.transformers was
given, each fusion's count, the node counts before and after, and the parity with the export.
The keys the report does not show stay in its ``REST`` field.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.json_record import from_json, rest


@dataclass(frozen=True)
class Parity:
    max_abs_diff: float
    decoded_agreement: float
    rest: dict = rest()


@dataclass(frozen=True)
class FuseRecord:
    model_type: str
    num_heads: int
    hidden_size: int
    fusions: dict[str, int]
    nodes_before: dict[str, int]     # op type -> count
    nodes: dict[str, int]
    parity_vs_export: Parity
    rest: dict = rest()

    @classmethod
    def of(cls, fuse) -> FuseRecord:
        return from_json(cls, fuse.meta)

    @property
    def attention_blocks(self) -> int | None:
        return attention_blocks(self.nodes_before)

    @property
    def attention_fused(self) -> int:
        return attention_fused(self.fusions)


def attention_blocks(nodes: dict[str, int]) -> int | None:
    """A graph's attention blocks: its Softmax nodes, one each (None: no Softmax counted)."""
    return nodes.get("Softmax")


def attention_fused(fusions: dict[str, int]) -> int:
    """Blocks fused: onnxruntime's Attention, or the pipeline's MultiHeadAttention."""
    return fusions.get("Attention", 0) + fusions.get("MultiHeadAttention", 0)
