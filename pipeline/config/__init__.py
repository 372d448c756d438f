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
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from pipeline.config.data import DataConfig
from pipeline.core.errors import ConfigError
from pipeline.config.metrics import MetricConfig


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


class ModelKind(str, Enum):
    task = "task"    # a network the pipeline compiles: a module in pipeline.models.TASKS
    llm = "llm"      # a decoder-only LLM described by its shape, for the bill only


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


class Precision(str, Enum):
    """Storage precision of weights or KV cache in the bill (bytes per value: 4, 2, 1, 0.5)."""
    fp32 = "fp32"
    fp16 = "fp16"
    int8 = "int8"
    int4 = "int4"


@dataclass
class LlmConfig:
    """The shape of a decoder-only transformer: all the bill needs, no weights."""
    params_b: float = 7.0                   # parameters, in billions (the model card's count)
    layers: int = 32                        # transformer blocks
    attention_heads: int = 32               # query heads
    kv_heads: int = 32                      # key/value heads: < attention_heads is grouped-query
    head_dim: int = 128                     # per head; hidden size = attention_heads * head_dim
    vocab: int = 32000
    max_context: int = 4096                 # tokens the model was trained to attend over

    def __post_init__(self):
        if self.params_b <= 0:
            raise ConfigError(f"model.llm.params_b={self.params_b}: must be > 0")
        _positive(self, "model.llm", "layers", "attention_heads", "kv_heads", "head_dim", "vocab",
                  "max_context")
        if self.attention_heads % self.kv_heads:
            raise ConfigError(f"model.llm.kv_heads={self.kv_heads}: must divide "
                              f"attention_heads={self.attention_heads}")


SOURCES = ("onnx", "torch", "hf")  # model.source values that bring the user's own model


@dataclass
class ModelConfig:
    # What the model is called in the registry and the report; empty: the ONNX file's stem, the
    # Hugging Face folder's name, the torch checkpoint's stem (else the factory function's name),
    # the built-in task's name; lower-cased into the registry's grammar.
    name: str = "ocr"
    # Which loader builds it (the model= option sets it): a built-in task
    # (pipeline.models.TASKS: ocr, ocr_mobile), or the user's own model: onnx (an ONNX file,
    # model.path), torch (model.factory builds it, model.checkpoint holds its weights) or hf (a
    # Hugging Face folder). null: model.name, as configs written before model.source said it.
    source: Optional[str] = None
    kind: ModelKind = ModelKind.task        # llm: a shape for `python -m pipeline.bill` only
    llm: Optional[LlmConfig] = None         # the LLM's shape; required when kind=llm
    checkpoint: Optional[str] = None        # safetensors file; null = seeded random init (smoke tests)
    # The network's own settings: a built-in task's architecture (ocr: widths, hidden), or the
    # keyword arguments model=torch passes to its factory.
    params: Dict[str, Any] = field(default_factory=dict)
    path: Optional[str] = None              # model=onnx: the ONNX file; model=hf: the folder
    factory: Optional[str] = None           # model=torch: package.module:function -> nn.Module
    # model=torch: input name -> shape, fixed sizes as ints and dynamic axes by their meaning
    # (batch, width, height, sequence), e.g. {image: [batch, 3, 32, width]}; exported so.
    inputs: Dict[str, List[Any]] = field(default_factory=dict)
    input_dtypes: Dict[str, str] = field(default_factory=dict)  # default float32
    outputs: List[str] = field(default_factory=lambda: ["output"])  # model=torch: output names
    eval_samples: int = 2000                # held-out lines the accuracy gate is judged on
    calibration_samples: int = 512          # lines quantization calibrates on (a different seed)
    eval_batch_size: int = 64               # batch used for evaluation only, not for timing
    parity_samples: int = 32                # lines compared torch vs ONNX after export/optimize

    def __post_init__(self):
        _positive(self, "model", "eval_samples", "calibration_samples", "eval_batch_size",
                  "parity_samples")
        if self.source is None:  # before model.source, model.name chose the loader
            self.source, self.name = self.name, "" if self.name in SOURCES else self.name
        if not self.name:
            self.name = self.default_name()
        if (self.kind == ModelKind.llm) != (self.llm is not None):
            raise ConfigError(f"model.kind={self.kind.value}: model.llm must be "
                              f"{'set' if self.kind == ModelKind.llm else 'null'}")
        if self.kind == ModelKind.llm:
            return
        if self.source == "hf" and not self.path:
            raise ConfigError("model.path is empty: model=hf needs a local Hugging Face model "
                              "folder (config.json, weights, tokenizer files)")
        if self.source == "hf" and "max_length" in self.params:
            n = self.params["max_length"]  # a bool is an int to Python, not a token count
            if isinstance(n, bool) or not isinstance(n, int) or n < 2:
                raise ConfigError(f"model.params.max_length={n!r}: must be a whole number of "
                                  "tokens, 2 or more (at most the model's context)")
        if self.source == "hf" and self.checkpoint is not None:
            raise ConfigError("model.checkpoint: model=hf takes its weights from the folder in "
                              "model.path")
        if self.source == "onnx" and not self.path:
            raise ConfigError("model.path is empty: model=onnx needs the ONNX file to compile")
        if self.source == "torch":
            if not self.factory or ":" not in self.factory:
                raise ConfigError(f"model.factory={self.factory!r}: model=torch needs "
                                  "package.module:function, a function that returns the nn.Module")
            if not self.inputs:
                raise ConfigError("model.inputs is empty: model=torch needs each input's name "
                                  "and shape, e.g. {image: [batch, 3, 32, 32]}")
        if self.checkpoint is not None and self.source == "onnx":
            raise ConfigError("model.checkpoint: model=onnx takes its weights from model.path")

    def default_name(self) -> str:
        """The registry name when model.name is empty: what the user already calls the model,
        in the registry's grammar (lower-case letters and digits joined by '.', '_' or '-')."""
        import re
        from pathlib import PurePath

        if self.source in ("onnx", "hf") and self.path:
            given = PurePath(str(self.path).rstrip("/\\"))
            given = (given.stem if self.source == "onnx" or given.suffix.lower() == ".gguf"
                     else given.name)  # a GGUF file: named like an ONNX file, by its stem
        elif self.source == "torch":
            given = (PurePath(self.checkpoint).stem if self.checkpoint
                     else str(self.factory or "").rpartition(":")[2])
        else:
            given = str(self.source or "")
        name = re.sub(r"[^a-z0-9._-]+", "-", given.lower())
        name = re.sub(r"[._-]*([._-])[._-]*", r"\1", name).strip("._-")
        return name or "model"


# -- decoder LLMs (weight-only quantization, docs/llm.md) ---------------------------------------
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
        _positive(self, "quant.decoder", "prompts", "prompt_tokens", "streams",
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


def decoder_path(path: Optional[str]) -> bool:
    """model.path names a decoder LLM, by the command line's own rule
    (``pipeline.config.decoder_files.is_decoder``: a GGUF file, a folder whose config.json names a
    causal LM or, without architectures, a decoder's model type). One rule: with two, a folder
    without architectures was an encoder here ("needs a metric") and a decoder there ("leave
    metric= unset")."""
    from pipeline.config.decoder_files import is_decoder

    return is_decoder(path)
# -- end of decoder LLMs --------------------------------------------------------------------------


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
        _positive(self, "quant", "calibration_batch_size", "ranking_samples", "profile_runs")
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


class PruneMethod(str, Enum):
    none = "none"            # no pruning: the recipe is exactly the unpruned one
    channels = "channels"    # structured channel pruning, then a recovery fine-tune


class PruneImportance(str, Enum):
    l1 = "l1"                # sum of |weight| over everything a channel group touches
    l2 = "l2"                # the same with squares
    bn_scale = "bn_scale"    # |gamma| of the BatchNorm after a conv


@dataclass
class PruneConfig:
    method: PruneMethod = PruneMethod.none
    ratio: float = 0.3                      # share of each layer's channels removed, in [0, 1)
    importance: PruneImportance = PruneImportance.l1
    round_to: int = 8                       # kept channels rounded down to a multiple of this
    ignored: Optional[list[str]] = None     # modules whose widths are kept; null = the model's
    recover_steps: int = 450                # fine-tune steps on freshly generated lines
    recover_lr: float = 5e-4                # peak of the one-cycle schedule
    recover_batch_size: int = 32
    eval_samples: int = 500                 # held-out lines scored before and after recovery
    seed: int = 0                           # recovery data stream and initialisation

    def __post_init__(self):
        if not 0 <= self.ratio < 1:
            raise ConfigError(f"prune.ratio={self.ratio}: must be in [0, 1) (the share of each "
                              "layer's channels removed)")
        _positive(self, "prune", "round_to", "recover_batch_size", "eval_samples")
        if self.recover_steps < 0:
            raise ConfigError(f"prune.recover_steps={self.recover_steps}: must be >= 0")
        if self.recover_lr <= 0:
            raise ConfigError(f"prune.recover_lr={self.recover_lr}: must be > 0")


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
        _positive(self, "hardware", "intra_op_threads", "inter_op_threads")
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


class SloMode(str, Enum):
    model = "model"  # the gate judges the model's own p99 (the benchmark, arrays in memory)
    serve = "serve"  # also the candidate behind the real server, from raw bytes (pipeline.serve)


@dataclass
class SloConfig:
    """The service targets that decide the hardware."""
    p99_ms: float = 200.0                   # a request's latency target, 99th percentile
    peak_qps: float = 50.0                  # requests per second at the busiest time
    max_input: int = 512                    # largest input a request may carry (OCR: line width
                                            # in pixels; LLM: prompt tokens)
    requests_per_day: int = 1_000_000       # daily volume: turns instance-hours into cost
    utilization: float = 0.7                # share of measured throughput planned for: an
                                            # instance run at 100 % queues without bound
    # The batch a request is answered in, where the gate judges p99 against p99_ms: 1 = each
    # request alone (an online service: a request is one input, not the speed gate's batch of 8).
    batch_size: int = 1
    # serve: at the end of the run the candidate is served (python -m pipeline.serve) and loaded
    # open-loop from the evaluation samples' raw bytes; that p99 is judged against p99_ms too.
    mode: SloMode = SloMode.model
    serve_qps: float = 10.0                 # serve: the rate offered to one server (requests/s)
    serve_seconds: float = 10.0             # serve: how long that rate is offered

    def __post_init__(self):
        for key in ("p99_ms", "peak_qps", "serve_qps", "serve_seconds"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"slo.{key}={getattr(self, key)}: must be > 0")
        _positive(self, "slo", "max_input", "requests_per_day", "batch_size")
        if not 0 < self.utilization <= 1:
            raise ConfigError(f"slo.utilization={self.utilization}: must be in (0, 1]")
        if self.requests_per_day / 86400 > self.peak_qps:
            raise ConfigError(f"slo.requests_per_day={self.requests_per_day}: averages "
                              f"{self.requests_per_day / 86400:.1f} requests/s, above "
                              f"slo.peak_qps={self.peak_qps}")


class BenchMode(str, Enum):
    latency = "latency"  # interleaved A/B timing of every artifact (always done)
    load = "load"        # plus open-loop Poisson load through a dynamic batcher
    soak = "soak"        # plus minutes at a fixed rate, watching memory and p99


@dataclass
class LoadConfig:
    max_batch: int = 8                      # dynamic batcher: largest batch it forms ...
    # ... and the longest the oldest request waits for company. 0: take what is queued now (the
    # queue fills while the model is busy, so batches grow with load and idle requests never wait).
    max_wait_ms: float = 0.0
    steps: int = 8                          # QPS steps, geometric, from each model's capacity
    refine_steps: int = 3                   # bisection steps between the last pass and first miss
    # Requests batch only with others whose input shape, each dimension rounded up to a multiple
    # of this, is the same (0: any shapes, padded to the largest). Padding costs more than batching saves.
    shape_bucket: int = 32
    step_seconds: float = 5.0               # duration of each QPS step
    soak_seconds: float = 120.0             # soak duration (the article: 30-60 min in production)
    soak_qps: Optional[float] = None        # soak rate; null = half the batch-1 capacity
    leak_mb_per_min: float = 2.0            # RSS growth above this, sustained, is a leak

    def __post_init__(self):
        _positive(self, "bench.load", "max_batch", "steps")
        for name in ("step_seconds", "soak_seconds", "leak_mb_per_min"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"bench.load.{name}={getattr(self, name)}: must be > 0")
        for name in ("max_wait_ms", "refine_steps", "shape_bucket"):
            if getattr(self, name) < 0:
                raise ConfigError(f"bench.load.{name}={getattr(self, name)}: must be >= 0")


@dataclass
class TimingConfig:
    """What shapes the benchmark's numbers, and nothing else: the benchmark stage's key."""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8])
    min_rounds: int = 200                   # interleaved rounds per batch size before stopping
    min_seconds: float = 10.0               # per batch size: spread the rounds over at least this
    max_seconds: float = 60.0               # per batch size: keep measuring while CIs are wide
    rel_ci: float = 0.03                    # target half-width of each ratio's 95 % CI
    block: int = 1                          # runs per model per round (>1 across runtimes)
    size_buckets: int = 4                   # input shape classes by the dynamic axis's size
    batches_per_bucket: int = 2             # distinct real batches per shape class
    warmup_window: int = 10                 # warm-up ends when two windows' medians agree ...
    warmup_tolerance: float = 0.05          # ... within this fraction
    warmup_max_runs: int = 300
    aa_tolerance: float = 0.03              # the A/A ratio must read 1.00 +- this
    cold_start_repeats: int = 3             # fresh processes per model; 0 skips cold start
    nonce: str = ""                         # any new value forces a fresh measurement (make bench)

    def __post_init__(self):
        _positive(self, "bench", "min_rounds", "block", "size_buckets", "batches_per_bucket",
                  "warmup_window", "warmup_max_runs")
        if not self.batch_sizes or any(b <= 0 for b in self.batch_sizes):
            raise ConfigError(f"bench.batch_sizes={self.batch_sizes}: expected positive sizes")
        if self.max_seconds <= 0:
            raise ConfigError(f"bench.max_seconds={self.max_seconds}: must be > 0")
        for name in ("rel_ci", "warmup_tolerance", "aa_tolerance"):  # fractions of a ratio
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"bench.{name}={getattr(self, name)}: must be in (0, 1)")
        if self.min_seconds < 0:
            raise ConfigError(f"bench.min_seconds={self.min_seconds}: must be >= 0")
        if self.cold_start_repeats < 0:
            raise ConfigError(f"bench.cold_start_repeats={self.cold_start_repeats}: must be >= 0")


@dataclass
class BenchConfig(TimingConfig):
    """The ``bench`` group: the timing, plus what the load test and soak run with."""
    mode: BenchMode = BenchMode.latency
    load: LoadConfig = field(default_factory=LoadConfig)    # used by mode=load and mode=soak

    def timing(self) -> TimingConfig:
        """The timing fields alone, for the benchmark stage: load-test knobs stay out of its key."""
        return TimingConfig(**{f.name: getattr(self, f.name)
                               for f in dataclasses.fields(TimingConfig)})


@dataclass
class GateConfig:
    # The largest drop below the FP16 baseline, in each metric's own scale (pipeline.metrics.
    # limits): null = each metric's default (0.3 points of an accuracy, 0.01 of a mean cosine and
    # 0.03 of its 1st percentile, ...); a number = the primary metric's limit; a mapping
    # {metric: limit} = those metrics judged too, e.g. {cosine_mean: 0.005, cer: 0.5}.
    max_accuracy_drop: Any = None
    min_output_agreement: float = 0.95      # share of outputs that agree with the FP16 baseline's
    output_rtol: float = 0.25               # continuous outputs: a row agrees within this relative
                                            # L2 error (0.25 ~ cosine 0.969 for unit vectors)
    min_speedup: float = 1.0                # lower 95 % bound vs the fastest float: never slower
    speedup_batch_size: int = 8             # the batch size the speed gate is judged at
    require_aa_check: bool = True           # refuse timings whose A/A self-check was off
    check_slo_p99: bool = True              # candidate p99 at the gate's batch <= slo.p99_ms
    max_model_mb: Optional[float] = None    # size limit of the shipped file; null = none

    def __post_init__(self):
        drop = self.max_accuracy_drop
        if isinstance(drop, dict):  # metric names are checked by compose (pipeline.metrics)
            drop = self.max_accuracy_drop = {str(k): v for k, v in drop.items()}
        for key, value in (drop.items() if isinstance(drop, dict) else [("", drop)]):
            where = f"gate.max_accuracy_drop{'.' + key if key else ''}={value!r}"
            if value is None and not key:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}: expected a number, null, or a mapping metric -> "
                                  "limit such as {cosine_mean: 0.01}")
            if not 0 <= value <= 100:
                raise ConfigError(f"{where}: must be in [0, 100] (a drop in the metric's own "
                                  "scale: points of an accuracy, a cosine, ...)")
        if not 0 < self.output_rtol < 10:
            raise ConfigError(f"gate.output_rtol={self.output_rtol}: must be in (0, 10)")
        if self.min_speedup < 0:
            raise ConfigError(f"gate.min_speedup={self.min_speedup}: must be >= 0")
        if not 0 <= self.min_output_agreement <= 1:
            raise ConfigError(f"gate.min_output_agreement={self.min_output_agreement}: must be "
                              "in [0, 1]")
        if self.max_model_mb is not None and self.max_model_mb <= 0:
            raise ConfigError(f"gate.max_model_mb={self.max_model_mb}: must be > 0 or null")
        _positive(self, "gate", "speedup_batch_size")


class RegistryBackend(str, Enum):
    local = "local"      # content-addressed OCI image layout under `root`
    oci = "oci"          # an OCI registry (CNCF Distribution, Harbor, GHCR ...) through oras
    mlflow = "mlflow"    # an MLflow tracking server and its model registry


@dataclass
class RegistryConfig:
    backend: RegistryBackend = RegistryBackend.local
    root: str = "artifacts/registry"        # local store, relative to the working directory
    url: Optional[str] = None               # oci: http(s)://host:port; mlflow: tracking server
    repository: str = "pipeline"            # oci: <repository>/<model>; mlflow: the experiment
    timeout_s: float = 60.0                 # per request to a remote registry

    def __post_init__(self):
        from urllib.parse import urlsplit

        # registry.repository's grammar is the registry's (pipeline.registry.names): compose
        # checks it after reading the config, and the backends when opened.
        if self.timeout_s <= 0:
            raise ConfigError(f"registry.timeout_s={self.timeout_s}: must be > 0")
        if self.backend != RegistryBackend.local and not self.url:
            raise ConfigError(f"registry.url is required for registry.backend="
                              f"{self.backend.value}, e.g. http://127.0.0.1:5000")
        if self.url:
            parts = urlsplit(self.url)
            if "@" in parts.netloc:  # never echo it: the part before '@' is a secret
                raise ConfigError("registry.url: credentials in the URL are refused (config and "
                                  "manifests are published); set PIPELINE_REGISTRY_USERNAME and "
                                  "PIPELINE_REGISTRY_PASSWORD or a netrc entry")
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
                raise ConfigError(f"registry.url={self.url!r}: expected http(s)://host[:port]"
                                  "[/path]")


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
        _finite(self)
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
        _positive(self, "bill", "batch", "seq")
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


@dataclass
class BillApp:
    """``python -m pipeline.bill``: shares the model, hardware and slo groups with the pipeline."""
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    bill: BillConfig = field(default_factory=BillConfig)
    workdir: str = "artifacts"              # where the pipeline's runs/latest report is read

    def __post_init__(self):
        _finite(self)
        llm = self.model.llm
        if llm is not None and self.bill.seq > llm.max_context:
            raise ConfigError(f"bill.seq={self.bill.seq}: longer than model.llm.max_context="
                              f"{llm.max_context}")


GROUPS = {"model": ModelConfig, "quant": QuantConfig, "prune": PruneConfig,
          "hardware": HardwareConfig, "slo": SloConfig, "gate": GateConfig,
          "registry": RegistryConfig, "data": DataConfig, "metric": MetricConfig}
APPS = {"config": Config, "bill": BillApp}  # config name -> its schema (stored as schema[_name])


def _finite(obj, path: str = "") -> None:
    """Refuse NaN and infinity in any float of a config tree (lists included)."""
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{path}{f.name}"
        if dataclasses.is_dataclass(value):
            _finite(value, f"{key}.")
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{key}={value}: must be a finite number")


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for i, c in enumerate(cpus):
        start = c if start is None else start
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}-{c}" if c != start else f"{c}")
            start = None
    return ", ".join(out)


def _positive(obj, group: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ConfigError(f"{group}.{name}={value}: must be a positive integer")


def register() -> None:
    """Register the schemas so every YAML option is validated against its dataclass."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, node in APPS.items():
        cs.store(name="schema" if name == "config" else f"schema_{name}", node=node)
    for group, node in GROUPS.items():
        cs.store(group=group, name=f"schema_{group}", node=node)
