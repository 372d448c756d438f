"""The ``hardware=`` group's schema (``conf/hardware/``): where the model runs, and the datasheet
numbers the bill prices with.

In: nothing (typed config). Out: ``HardwareConfig`` (provider, threads, affinity, runtime and its
precision and hint; memory, bandwidth, peak throughput, power, price), ``PeakThroughput``, and
``HardwareRuntime``, the stages' view of it (how to run, not what it is: editing the datasheet
never changes a stage key). ``hardware.affinity`` is checked against the CPUs this process may run
on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from pipeline.config.checks import positive
from pipeline.core.errors import ConfigError


class HardwareKind(str, Enum):
    cpu = "cpu"
    gpu = "gpu"


class RuntimeName(str, Enum):
    """The inference engine that runs (and is gated on) the model: ``pipeline.runtimes``."""
    onnxruntime = "onnxruntime"  # ONNX Runtime, the provider in ``hardware.provider``
    openvino = "openvino"        # OpenVINO's CPU plugin, compiling the same ONNX files
    auto = "auto"                # time every runtime and precision, keep the fastest that passes


class InferencePrecision(str, Enum):
    """Precision a runtime computes float ops in (checked against the CPU flags at run time)."""
    fp32 = "fp32"
    bf16 = "bf16"    # AVX512-BF16 or AMX-BF16
    fp16 = "fp16"    # AVX512-FP16 or AMX-FP16


class PerformanceHint(str, Enum):
    latency = "latency"        # one stream: each request uses every thread
    throughput = "throughput"  # several streams, for many concurrent requests


@dataclass
class PeakThroughput:
    """Dense peak per precision (no 2:4 sparsity): TFLOP/s for floats, TOPS for integers.
    null = not known for this device; the roofline then falls back to a wider precision."""
    fp32: Optional[float] = None
    fp16: Optional[float] = None
    bf16: Optional[float] = None
    int8: Optional[float] = None
    int4: Optional[float] = None


@dataclass(frozen=True)
class HardwareRuntime:
    """What the compile pipeline's stages see of a hardware profile: how to run, not what it is.
    Stage cache keys are built from this, so editing a profile's datasheet numbers (the bill's
    data) never invalidates a cached evaluation or benchmark."""
    name: str
    provider: str
    intra_op_threads: int
    inter_op_threads: int
    affinity: Optional[tuple[int, ...]] = None  # CPU ids measurements are pinned to
    # The runtime settings; at their defaults they stay out of cache keys (keys made before
    # runtimes existed remain valid), otherwise they enter them (pipeline.engine.runner.plain).
    runtime: str = field(default="onnxruntime", metadata={"key_omit_default": True})
    precision: str = field(default="fp32", metadata={"key_omit_default": True})
    performance_hint: str = field(default="latency", metadata={"key_omit_default": True})


@dataclass
class HardwareConfig:
    name: str = "cpu"
    kind: HardwareKind = HardwareKind.cpu
    provider: str = "CPUExecutionProvider"  # ONNX Runtime execution provider (checked at run time)
    intra_op_threads: int = 2               # the process-global pool every session shares
    inter_op_threads: int = 1
    affinity: Optional[list[int]] = None    # CPU ids benchmarks are pinned to; null = all
    runtime: RuntimeName = RuntimeName.onnxruntime  # what runs, and is gated on, the model
    precision: InferencePrecision = InferencePrecision.fp32  # float ops of the candidate
    performance_hint: PerformanceHint = PerformanceHint.latency  # OpenVINO's PERFORMANCE_HINT
    memory_gb: Optional[float] = None       # device memory (host RAM for a CPU), decimal GB
    memory_bandwidth_gbs: Optional[float] = None  # GB/s; bounds decode speed, small batches
    peak_tflops: PeakThroughput = field(default_factory=PeakThroughput)
    interconnect: str = ""                  # links to other devices or the host, in words
    interconnect_gbs: Optional[float] = None  # the fastest of those links, GB/s
    power_w: Optional[float] = None         # board power limit (TDP)
    price_per_hour: Optional[float] = None  # USD per instance-hour; enables cost per request
    source: str = ""                        # where the numbers come from (datasheet or probe)
    probe: bool = False  # true: numbers of the machine the run is on, probed once per CPU and
                         # cached (pipeline.measure.machine); values set explicitly are kept

    def __post_init__(self):
        positive(self, "hardware", "intra_op_threads", "inter_op_threads")
        for key in ("memory_gb", "memory_bandwidth_gbs", "interconnect_gbs", "power_w"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ConfigError(f"hardware.{key}={value}: must be > 0 (or null if unknown)")
        for key, value in vars(self.peak_tflops).items():
            if value is not None and value <= 0:
                raise ConfigError(f"hardware.peak_tflops.{key}={value}: must be > 0 (or null)")
        if self.price_per_hour is not None and self.price_per_hour < 0:
            raise ConfigError(f"hardware.price_per_hour={self.price_per_hour}: must be >= 0")
        if self.affinity is not None:
            allowed = sorted(os.sched_getaffinity(0))
            wrong = sorted(set(self.affinity) - set(allowed))
            if not self.affinity or wrong or len(set(self.affinity)) != len(self.affinity):
                raise ConfigError(f"hardware.affinity={self.affinity}: "
                                  + (f"CPU {wrong[0]} is not available to this process"
                                     if wrong else "expected distinct CPU ids")
                                  + f"; available: {_ranges(allowed)} (null = all)")

    def target(self) -> HardwareRuntime:
        """The stages' view: hardware plus runtime plus runtime settings (named ``target``
        because ``runtime`` is the field that picks the engine)."""
        return HardwareRuntime(self.name, self.provider, self.intra_op_threads,
                               self.inter_op_threads,
                               tuple(self.affinity) if self.affinity is not None else None,
                               self.runtime.value, self.precision.value,
                               self.performance_hint.value)


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, c in enumerate(cpus):
        start = c if start is None else start
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}-{c}" if c != start else f"{c}")
            start = None
    return ", ".join(out)
