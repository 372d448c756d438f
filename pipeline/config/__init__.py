"""Typed configuration: one dataclass per Hydra config group, validated at compose time.

In: the YAML files under ``conf/`` plus command-line overrides. Out: a plain ``Config`` object
(``OmegaConf.to_object``) that code below the command line (``pipeline.cli``) uses; nothing else
sees a ``DictConfig``.
Hydra and OmegaConf do the merging and type checks; ``__post_init__`` adds the range checks they
cannot express; NaN and infinity are refused everywhere (every comparison with NaN is false, so
a range check alone lets it through), and ``hardware.affinity`` is checked against the CPUs this
process may run on. Closed choices are enums so a typo names the valid values. Two applications
share the groups: ``Config`` (``conf/config.yaml``, the compile pipeline) and ``BillApp``
(``conf/bill.yaml``, ``python -m pipeline.bill``, which uses only model, hardware and slo).

A module per config group, as ``conf/`` has a folder per group: ``model``, ``data``, ``metrics``
(``metric=``), ``quant``, ``prune``, ``hardware``, ``slo``, ``gate``, ``registry``, plus ``bench``
and ``bill`` (settings of ``config.yaml`` and ``bill.yaml``) and ``checks`` (what they share).
Here: the composition, i.e. the two applications' schemas and the rules across groups, and their
registration with Hydra; every group's names are importable from here too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pipeline.core.errors import ConfigError
from pipeline.config.bench import BenchConfig, BenchMode, LoadConfig, TimingConfig
from pipeline.config.bill import BillConfig, Precision
from pipeline.config.checks import finite
from pipeline.config.data import DataConfig
from pipeline.config.gate import GateConfig
from pipeline.config.hardware import (HardwareConfig, HardwareKind, HardwareRuntime,
                                      InferencePrecision, PeakThroughput, PerformanceHint,
                                      RuntimeName)
from pipeline.config.metrics import MetricConfig
from pipeline.config.model import SOURCES, LlmConfig, ModelConfig, ModelKind, decoder_path
from pipeline.config.prune import PruneConfig, PruneImportance, PruneMethod
from pipeline.config.quant import (CalibrationMethod, DecoderQuant, DynamicSource, IntType,
                                   QuantConfig, QuantMode)
from pipeline.config.registry import RegistryBackend, RegistryConfig
from pipeline.config.slo import SloConfig, SloMode

# The public names: each group's schema and enums, and the composition below.
__all__ = ["APPS", "BenchConfig", "BenchMode", "BillApp", "BillConfig", "CalibrationMethod",
           "Config", "DataConfig", "DecoderQuant", "DynamicSource", "GROUPS", "GateConfig",
           "HardwareConfig", "HardwareKind", "HardwareRuntime", "InferencePrecision", "IntType",
           "LlmConfig", "LoadConfig", "MetricConfig", "ModelConfig", "ModelKind", "PeakThroughput",
           "PerformanceHint", "Precision", "PruneConfig", "PruneImportance", "PruneMethod",
           "QuantConfig", "QuantMode", "RegistryBackend", "RegistryConfig", "RuntimeName",
           "SOURCES", "SloConfig", "SloMode", "TimingConfig", "decoder_path", "register"]


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    prune: PruneConfig = field(default_factory=PruneConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    registry: Optional[RegistryConfig] = field(default_factory=RegistryConfig)  # null: no publish
    bench: BenchConfig = field(default_factory=BenchConfig)
    data: Optional[DataConfig] = None       # model=onnx/torch/hf: the user's data set (data=...)
    metric: Optional[MetricConfig] = None   # model=onnx/torch/hf: how outputs are scored (metric=...)
    workdir: str = "artifacts"              # cache/, runs/ live here
    data_dir: str = "calibration"           # calibration and evaluation sets

    def __post_init__(self):
        finite(self)
        if self.model.source in SOURCES:
            if self.data is None:
                raise ConfigError(f"model={self.model.source} needs a data set: data=imagefolder "
                                  "(or labels_file, saved, csv, jsonl, parquet) data.path=...")
            if self.metric is None and not (self.model.source == "hf"  # a decoder: perplexity
                                             and decoder_path(self.model.path)):
                raise ConfigError(f"model={self.model.source} needs a metric: metric="
                                  "classification, ctc or agreement (no labels)")
        elif self.data is not None or self.metric is not None:
            raise ConfigError(f"model={self.model.source} brings its own data and metric; data= "
                              "and metric= are for model=onnx, model=torch and model=hf")
        if self.gate.speedup_batch_size not in self.bench.batch_sizes:
            raise ConfigError(f"gate.speedup_batch_size={self.gate.speedup_batch_size} is not "
                              f"benchmarked; bench.batch_sizes={self.bench.batch_sizes}")
        # The SLO is judged at the batch a request is answered in: refuse before any stage runs
        # rather than time everything and fail the gate on a batch that was never timed.
        if self.gate.check_slo_p99 and self.slo.batch_size not in self.bench.batch_sizes:
            raise ConfigError(f"slo.batch_size={self.slo.batch_size} is not benchmarked; "
                              f"bench.batch_sizes={self.bench.batch_sizes} (add it, or set "
                              "gate.check_slo_p99=false)")


@dataclass
class BillApp:
    """``python -m pipeline.bill``: shares the model, hardware and slo groups with the pipeline."""
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    bill: BillConfig = field(default_factory=BillConfig)
    workdir: str = "artifacts"              # where the pipeline's runs/latest report is read

    def __post_init__(self):
        finite(self)
        llm = self.model.llm
        if llm is not None and self.bill.seq > llm.max_context:
            raise ConfigError(f"bill.seq={self.bill.seq}: longer than model.llm.max_context="
                              f"{llm.max_context}")


GROUPS = {"model": ModelConfig, "quant": QuantConfig, "prune": PruneConfig,
          "hardware": HardwareConfig, "slo": SloConfig, "gate": GateConfig,
          "registry": RegistryConfig, "data": DataConfig, "metric": MetricConfig}
APPS = {"config": Config, "bill": BillApp}  # config name -> its schema (stored as schema[_name])


_registered = False


def register() -> None:
    """Register the schemas so every YAML option is validated against its dataclass. Once a
    process: the schemas do not change, and storing them again converts every dataclass anew
    (40 ms a compose; the test suite composes hundreds of times)."""
    from hydra.core.config_store import ConfigStore

    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    for name, node in APPS.items():
        cs.store(name="schema" if name == "config" else f"schema_{name}", node=node)
    for group, node in GROUPS.items():
        cs.store(group=group, name=f"schema_{group}", node=node)
    _registered = True
