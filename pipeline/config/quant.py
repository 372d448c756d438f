"""The ``quant=`` group's schema (``conf/quant/``): how the model is quantized.

In: nothing (typed config). Out: ``QuantConfig`` (the mode, INT8's types and calibration, the mixed
search's budget, SmoothQuant strengths, FP16's float ops) with ``DecoderQuant`` (``quant.decoder``:
a decoder LLM's weight-only widths, decode timing and memory budget), and their enums. Values are
checked when the config is made (exit 2); what the CPU turns the nulls into is
``pipeline.quant.defaults``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from pipeline.config.checks import positive
from pipeline.core.errors import ConfigError


class QuantMode(str, Enum):
    none = "none"    # ship the optimized FP32 model
    fp16 = "fp16"    # weights and most ops in FP16, I/O stays FP32
    int8 = "int8"    # static INT8, QDQ format, calibrated
    dynamic = "dynamic"  # dynamic INT8 for MatMul/Gemm/LSTM, everything else float
    mixed = "mixed"  # INT8 with the most harmful nodes kept float, under an accuracy budget
    bf16 = "bf16"    # the FP32 model run at BF16 inference precision (a runtime that has it)
    auto = "auto"    # every precision this CPU can run, timed side by side; the fastest that passes


class CalibrationMethod(str, Enum):
    minmax = "minmax"
    entropy = "entropy"
    percentile = "percentile"
    auto = "auto"    # calibrate with each, keep the best on the ranking subset


class DynamicSource(str, Enum):
    auto = "auto"      # quantize both graphs below, time them, keep the faster (ties: fused)
    fused = "fused"    # the graph onnxruntime.transformers' fusions made (the FP32 baseline)
    export = "export"  # the unfused export: INT8 kernels may beat unfused-INT8-free fusions


class IntType(str, Enum):
    int8 = "int8"
    uint8 = "uint8"


@dataclass
class DecoderQuant:
    """quant.decoder: how a decoder LLM's weights are quantized and its generation timed."""
    # quant=int8 (or dynamic) on a decoder: every MatMul at this width; 4 = INT4 everywhere.
    # mixed and auto search widths per layer themselves.
    bits: int = 8
    # Weights per scale: smaller blocks follow the weights closer and cost a scale per block;
    # 32 is onnxruntime-genai's default and what its fast CPU kernels are tuned for.
    block_size: int = 32
    symmetric: bool = True                  # no zero point per block: the builder's default
    # The 4-bit nodes' algorithm: rtn (round to nearest), hqq, k_quant (llama.cpp-style),
    # gptq (second-order, reads calibration text). 8-bit nodes are always round to nearest.
    algorithm: str = "rtn"
    # MatMulNBits' compute: 4 = int8 activations (the fast path of onnxruntime's x86 and Arm
    # kernels, which can flip greedy tokens at near-ties), 0 = float; null = from the CPU's flags.
    accuracy_level: Optional[int] = None
    # Decode timing, candidate against FP32, interleaved: prompts cut from the evaluation text.
    prompts: int = 4
    prompt_tokens: int = 64
    new_tokens: int = 32
    streams: int = 1                        # sequences decoded together (one batch)
    # mixed: the calibration sequences the sensitivity proxy reads (one FP32 pass each for the
    # MatMuls' input energy): a ranking, not a gate, so a few suffice.
    ranking_sequences: int = 4
    # The share of the machine's memory a decoder run may use at its peak. A model whose FP32
    # path would need more is exported and quantized on the streaming path (docs/llm.md,
    # "Models larger than memory"); 0.6 leaves the rest to the OS and whatever else runs.
    memory_budget: float = 0.6
    # How search candidates are scored: sequential stops each once its interval (99 %) lies
    # wholly inside or outside the gate's limits, full scores every sequence. The candidate the
    # gate judges is scored in full either way.
    score: str = "sequential"
    # sequential: sequences scored before a candidate may stop (fewer give no interval to trust).
    score_min_sequences: int = 32

    def __post_init__(self):
        positive(self, "quant.decoder", "prompts", "prompt_tokens", "streams",
                  "ranking_sequences")
        if self.score not in ("full", "sequential"):
            raise ConfigError(f"quant.decoder.score={self.score}: full or sequential")
        if self.score_min_sequences < 8:
            raise ConfigError(f"quant.decoder.score_min_sequences={self.score_min_sequences}: "
                              "at least 8 (an interval from fewer sequences is not trusted)")
        if self.bits not in (4, 8):
            raise ConfigError(f"quant.decoder.bits={self.bits}: 4 or 8 (MatMulNBits' widths)")
        if self.block_size not in (16, 32, 64, 128, 256):
            raise ConfigError(f"quant.decoder.block_size={self.block_size}: one of 16, 32, 64, "
                              "128, 256")
        if self.algorithm not in ("rtn", "hqq", "k_quant", "gptq"):
            raise ConfigError(f"quant.decoder.algorithm={self.algorithm}: rtn, hqq, k_quant or "
                              "gptq")
        if self.accuracy_level not in (None, 0, 1, 2, 3, 4):
            raise ConfigError(f"quant.decoder.accuracy_level={self.accuracy_level}: 0 to 4, or "
                              "null (from the CPU's flags)")
        if not (isinstance(self.memory_budget, (int, float)) and 0 < self.memory_budget <= 1):
            raise ConfigError(f"quant.decoder.memory_budget={self.memory_budget}: a share of "
                              "the machine's memory, above 0 and at most 1")
        if self.new_tokens < 2:
            raise ConfigError(f"quant.decoder.new_tokens={self.new_tokens}: at least 2 (a first "
                              "token and one decode step)")


@dataclass
class QuantConfig:
    mode: QuantMode = QuantMode.int8
    per_channel: bool = True                # per-output-channel weight scales (needs opset >= 13)
    weight_type: IntType = IntType.int8     # signed weights: what the x86 int8 GEMM kernels expect
    activation_type: IntType = IntType.uint8  # u8 activations x s8 weights hit VNNI's fast path
    reduce_range: Optional[bool] = None     # 7-bit weights; null = from the CPU (true without VNNI)
    calibration: CalibrationMethod = CalibrationMethod.minmax
    calibration_batch_size: int = 32        # batches are streamed; memory follows this, not the set
    static_op_types: Optional[list[str]] = None  # null = every op type the quantizer supports
    dynamic_op_types: Optional[list[str]] = None  # no calibration needed; null = the model's
    exclude: list[str] = field(default_factory=list)  # node (module) names kept float
    latency_aware: bool = True              # keep float the nodes profiled slower in INT8
    ranking_samples: int = 200              # hardest evaluation lines, for cheap comparisons
    # mixed: the budget vs the FP16 baseline in the primary metric's scale; null = a third of
    # the gate's limit for it (0.1 points of an accuracy, 0.0033 of a mean cosine)
    max_accuracy_drop: Optional[float] = None
    profile_runs: int = 20                  # profiled runs per model when explaining INT8
    fp16_keep_float32: list[str] = field(default_factory=lambda: ["LSTM"])  # ops left in FP32 by fp16
    region_trials: int = 0                  # float regions (whole blocks) timed end to end; 0 = off
    # SmoothQuant-style migration strengths tried before INT8 (the best on the ranking subset,
    # or none); null = the model's own (transformer encoders: [0.5, 0.65, 0.8]), [] = off
    smooth_alphas: Optional[list[float]] = None
    # dynamic INT8 of a fused transformer: quantize the fused graph, the export, or both, timed
    # head to head (all-mpnet-base-v2: the export's INT8 ran 1.19x the fused graph's at batch 8)
    dynamic_source: DynamicSource = DynamicSource.auto
    search_budget_s: float = 1800.0         # mixed: wall time the search may take; then its best so far
    search_groups: str = "blocks"           # mixed ranks module blocks; "nodes": one trial per node
    decoder: DecoderQuant = field(default_factory=DecoderQuant)  # decoder LLMs (docs/llm.md)

    def __post_init__(self):
        positive(self, "quant", "calibration_batch_size", "ranking_samples", "profile_runs")
        if self.max_accuracy_drop is not None and not 0 <= self.max_accuracy_drop <= 100:
            raise ConfigError(f"quant.max_accuracy_drop={self.max_accuracy_drop}: must be in "
                              "[0, 100] (the primary metric's scale) or null")
        if len(set(self.exclude)) != len(self.exclude) or any(not n for n in self.exclude):
            raise ConfigError(f"quant.exclude={self.exclude}: node names, each once")
        if not 0 < self.search_budget_s < math.inf:
            raise ConfigError(f"quant.search_budget_s={self.search_budget_s}: must be a finite "
                              "number of seconds > 0")
        if self.search_groups not in ("blocks", "nodes"):
            raise ConfigError(f"quant.search_groups={self.search_groups}: blocks or nodes")
        if self.region_trials < 0:
            raise ConfigError(f"quant.region_trials={self.region_trials}: must be >= 0")
        if self.smooth_alphas is not None and not all(0 < a <= 1 for a in self.smooth_alphas):
            raise ConfigError(f"quant.smooth_alphas={self.smooth_alphas}: each in (0, 1] (the "
                              "share of an activation's outliers moved into the weights)")
