"""Typed configuration: one dataclass per Hydra config group, validated at compose time.

In: the YAML files under ``conf/`` plus command-line overrides. Out: a plain ``Config`` object
(``OmegaConf.to_object``) that code below ``__main__`` uses; nothing else sees a ``DictConfig``.
Hydra and OmegaConf do the merging and type checks; ``__post_init__`` adds the range checks they
cannot express. Closed choices are enums so a typo names the valid values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from pipeline.errors import ConfigError


class QuantMode(str, Enum):
    none = "none"    # ship the optimized FP32 model
    fp16 = "fp16"    # weights and most ops in FP16, I/O stays FP32
    int8 = "int8"    # static INT8, QDQ format, calibrated


class CalibrationMethod(str, Enum):
    minmax = "minmax"
    entropy = "entropy"
    percentile = "percentile"


class IntType(str, Enum):
    int8 = "int8"
    uint8 = "uint8"


@dataclass
class ModelConfig:
    name: str = "ocr"                       # key into pipeline.models.TASKS
    checkpoint: Optional[str] = None        # safetensors file; null = seeded random init (smoke tests)
    widths: list[int] = field(default_factory=lambda: [32, 64, 128, 256, 256])  # conv channels
    hidden: int = 128                       # LSTM hidden size per direction
    eval_samples: int = 2000                # held-out lines the accuracy gate is judged on
    calibration_samples: int = 512          # lines quantization calibrates on (a different seed)
    eval_batch_size: int = 64               # batch used for evaluation only, not for timing
    parity_samples: int = 32                # lines compared torch vs ONNX after export/optimize

    def __post_init__(self):
        _positive(self, "model", "eval_samples", "calibration_samples", "eval_batch_size",
                  "parity_samples", "hidden")
        if len(self.widths) != 5 or any(w <= 0 for w in self.widths):
            raise ConfigError(f"model.widths={self.widths}: expected 5 positive channel counts")


@dataclass
class QuantConfig:
    mode: QuantMode = QuantMode.int8
    per_channel: bool = True                # per-output-channel weight scales (needs opset >= 13)
    weight_type: IntType = IntType.int8     # signed weights: what the x86 int8 GEMM kernels expect
    activation_type: IntType = IntType.uint8  # u8 activations x s8 weights hit VNNI's fast path
    reduce_range: bool = False              # 7-bit weights: only for CPUs without VNNI
    calibration: CalibrationMethod = CalibrationMethod.minmax
    calibration_batch_size: int = 32        # batches are streamed; memory follows this, not the set
    fp16_keep_float32: list[str] = field(default_factory=lambda: ["LSTM"])  # ops left in FP32 by fp16

    def __post_init__(self):
        _positive(self, "quant", "calibration_batch_size")


@dataclass
class HardwareConfig:
    name: str = "cpu"
    provider: str = "CPUExecutionProvider"  # ONNX Runtime execution provider
    intra_op_threads: int = 2               # the process-global pool every session shares
    inter_op_threads: int = 1

    def __post_init__(self):
        _positive(self, "hardware", "intra_op_threads", "inter_op_threads")
        if self.provider != "CPUExecutionProvider":
            raise ConfigError(f"hardware.provider={self.provider!r}: only CPUExecutionProvider is "
                              "supported so far")


@dataclass
class BenchConfig:
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])
    warmup_runs: int = 10                   # per model and batch size, before timing
    runs: int = 200                         # timed runs per model and batch size, interleaved

    def __post_init__(self):
        _positive(self, "bench", "runs")
        if not self.batch_sizes or any(b <= 0 for b in self.batch_sizes):
            raise ConfigError(f"bench.batch_sizes={self.batch_sizes}: expected positive sizes")


@dataclass
class GateConfig:
    max_accuracy_drop: float = 0.3          # points of sequence accuracy below the FP16 baseline
    min_speedup: float = 1.0                # vs the fastest float baseline: never promote slower
    speedup_batch_size: int = 8             # the batch size the speed gate is judged at

    def __post_init__(self):
        if self.max_accuracy_drop < 0:
            raise ConfigError(f"gate.max_accuracy_drop={self.max_accuracy_drop}: must be >= 0")
        if self.min_speedup < 0:
            raise ConfigError(f"gate.min_speedup={self.min_speedup}: must be >= 0")
        _positive(self, "gate", "speedup_batch_size")


@dataclass
class RegistryConfig:
    backend: str = "local"
    root: str = "artifacts/registry"        # relative to the project's working directory


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    registry: Optional[RegistryConfig] = field(default_factory=RegistryConfig)  # null: no publish
    bench: BenchConfig = field(default_factory=BenchConfig)
    workdir: str = "artifacts"              # cache/, runs/ live here
    data_dir: str = "calibration"           # calibration and evaluation sets

    def __post_init__(self):
        if self.gate.speedup_batch_size not in self.bench.batch_sizes:
            raise ConfigError(f"gate.speedup_batch_size={self.gate.speedup_batch_size} is not "
                              f"benchmarked; bench.batch_sizes={self.bench.batch_sizes}")


GROUPS = {"model": ModelConfig, "quant": QuantConfig, "hardware": HardwareConfig,
          "gate": GateConfig, "registry": RegistryConfig}


def _positive(obj, group: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ConfigError(f"{group}.{name}={value}: must be a positive integer")


def register() -> None:
    """Register the schemas so every YAML option is validated against its dataclass."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
    for group, node in GROUPS.items():
        cs.store(group=group, name=f"schema_{group}", node=node)
