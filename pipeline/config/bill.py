"""The ``bill`` settings (``conf/bill.yaml``'s ``bill:``): the situation ``python -m pipeline.bill``
prices.

In: nothing (typed config). Out: ``BillConfig`` (sequences, their length, weight and KV-cache
storage, margins, a decode rate, weight-only scales) and ``Precision``. Values are checked when
the config is made (exit 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from pipeline.config.checks import positive
from pipeline.core.errors import ConfigError


class Precision(str, Enum):
    """Storage precision of weights or KV cache in the bill (bytes per value: 4, 2, 1, 0.5)."""
    fp32 = "fp32"
    fp16 = "fp16"
    int8 = "int8"
    int4 = "int4"


@dataclass
class BillConfig:
    """The situation the bill prices: how many sequences, how long, stored how."""
    batch: int = 8                          # concurrent sequences (LLM) or batch size (artifact)
    seq: int = 2048                         # tokens per sequence held in the KV cache
    precision: Precision = Precision.fp16   # weight storage
    kv_precision: Precision = Precision.fp16  # KV-cache storage
    margin_gb: float = 1.5                  # activations, workspace, I/O buffers (the article's)
    keep_free: float = 0.0                  # share of device memory never planned for (allocator
                                            # fragmentation, runtime context); 0 = the article's sum
    tokens_per_s: float = 100.0             # a decode rate to size compute for
    input_shape: Optional[list[int]] = None  # artifact: one sample's input shape, without the
                                            # batch; null = the task's representative sample;
                                            # LLM: [tokens], which sets seq
    # Weight-only INT8/INT4 store a scale per block of weights beside the codes (issue 25):
    weight_block: int = 32                  # weights per scale (onnxruntime MatMulNBits' default);
                                            # 0 = no scales, the article's params x bits / 8
    scale_bytes: int = 4                    # bytes per scale: 4 in an FP32 model (the genai
                                            # builder's CPU output), 2 in FP16 (GPTQ, AWQ)

    def __post_init__(self):
        positive(self, "bill", "batch", "seq")
        if self.margin_gb < 0:
            raise ConfigError(f"bill.margin_gb={self.margin_gb}: must be >= 0")
        if not 0 <= self.keep_free < 1:
            raise ConfigError(f"bill.keep_free={self.keep_free}: must be in [0, 1)")
        if self.tokens_per_s <= 0:
            raise ConfigError(f"bill.tokens_per_s={self.tokens_per_s}: must be > 0")
        if self.weight_block < 0 or self.scale_bytes < 0:
            raise ConfigError(f"bill.weight_block={self.weight_block}, bill.scale_bytes="
                              f"{self.scale_bytes}: must be >= 0")
        if self.input_shape is not None and any(d <= 0 for d in self.input_shape):
            raise ConfigError(f"bill.input_shape={self.input_shape}: expected positive sizes")
