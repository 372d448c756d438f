"""What the decoder's own stages record, read by field: the exported or quantized folder
(decoder_export, weight_only and their streaming twins) and the reference's scoring
(text_reference). The stages write plain JSON (``artifact.json``); this module reads it back once
(``pipeline.core.json_record``), a key a stage did not write reading as None.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.json_record import from_json


@dataclass(frozen=True)
class DecoderFolder:
    nodes: dict | None = None            # op type -> count
    parity_vs_transformers: dict | None = None  # the export's logits against transformers'
    matmul_bits: dict[int, int] | None = None   # bits -> MatMuls at that width (quantized only)
    matmul_float: int | None = None      # MatMuls left float

    @classmethod
    def of(cls, art) -> DecoderFolder:
        return from_json(cls, art.meta, known_only=True)


@dataclass(frozen=True)
class ReferenceText:
    """text_reference: how the reference's distribution was summarised for scoring."""
    top_k: int | None = None             # tokens kept per position
    tail_mass_mean: float | None = None  # its mean probability outside them

    @classmethod
    def of(cls, art) -> ReferenceText:
        return from_json(cls, art.meta, known_only=True)
