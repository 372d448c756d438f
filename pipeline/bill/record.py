"""Bills as records: an ONNX artifact's and a run's (what ``pipeline.bill.artifact`` computes and
report.json's ``bill`` carries) and a decoder-only LLM's (``pipeline.bill.llm``), as
``pipeline.bill.render`` prints them and ``python -m pipeline.bill --json`` writes them, read by
field.

In: ``onnx_cost.analyse``'s cost, ``roofline.estimate``'s floor, the run's measurements, an LLM's
shape and setting. Out: frozen records whose JSON is the keys the bill has always had (the
capacity plan's records are ``pipeline.bill.capacity``'s). A few fields stay plain payloads
because their keys are the model's own (input and output names, op types, data types).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.bill.capacity import CapacityPlan
from pipeline.core.json_record import from_json, omitted


@dataclass(frozen=True)
class Roofline:
    """The least time one inference can take on a hardware profile: compute at the dense peak
    of each op's precision, the compulsory bytes at full memory bandwidth; the larger bounds."""
    hardware: str
    compute_ms: float
    memory_ms: float | None           # None: the profile has no memory bandwidth
    intensity_flop_per_byte: float | None
    unfused_ms: float | None          # each op's own max(compute, memory), summed
    peaks_used: tuple[str, ...]       # the precisions whose peaks priced the compute
    bound_ms: float
    bound_by: str                     # "compute" or "memory"
    peaks_missing: tuple[str, ...] | None = omitted()  # precisions the profile has no peak for
    ridge_flop_per_byte: float | None = omitted()      # above it FP32 is compute-bound


@dataclass(frozen=True)
class Activations:
    """The tensors one inference produces: all of them, those alive at once at the peak, the
    graph's inputs and outputs, and the largest."""
    total_bytes: float
    peak_bytes: float
    io_bytes: float
    largest_tensor: str
    largest_bytes: float


@dataclass(frozen=True)
class ArtifactBill:
    """One inference of one ONNX file at one batch size on one hardware profile."""
    model: str                         # the file
    file_bytes: int
    batch: int
    hardware: str                      # the profile's name
    inputs: dict[str, list]            # input -> the shape it was priced at
    outputs: dict                      # output -> its inferred shape (None: unknown)
    parameters: int
    parameter_bytes: float
    parameters_by_dtype: dict[str, int]
    parameter_bytes_by_dtype: dict[str, float]
    other_constant_bytes: float
    excluded_constants: dict[str, int]  # why -> count (batchnorm statistics, scales)
    flops: float
    macs: float
    by_op: dict                        # op type -> its flops, macs, bytes and count
    activations: Activations
    compulsory_bytes: float            # weights, inputs and outputs, each moved once
    uncounted: dict                    # op type -> nodes whose work is not modelled
    unknown_shapes: tuple[str, ...]    # the first 20 tensors shape inference left unknown
    unknown_shape_count: int
    roofline: Roofline
    memory_bytes: float                # resident: constants plus the activation peak
    fits: bool | None = omitted()      # in the profile's memory (None: no memory given)
    measured_p50_ms: float | None = None      # on the machine the bill is priced for
    measured_over_bound: float | None = None  # how far from the floor the runtime runs


@dataclass(frozen=True)
class HardwareProfile:
    """The hardware profile a run's bill is priced on (``hardware.*``)."""
    name: str
    kind: str                          # cpu or gpu
    memory_gb: float | None
    memory_bandwidth_gbs: float | None
    peak_tflops: dict[str, float]      # precision -> dense peak, only those the profile gives
    price_per_hour: float | None
    source: str | None                 # where the figures come from (a datasheet, a probe)


@dataclass(frozen=True)
class SizeAxis:
    """The dynamic axis a run's bill was priced at the size the benchmark fed there."""
    input: str
    axis: int
    size: int


@dataclass(frozen=True)
class RunBill:
    """A run report's bill: every report row's model at the gate's batch size, the hardware
    profile, the source network's parameter count and the capacity plan."""
    batch: int
    input_shape: list | None
    size_from: str                     # where the dynamic axis' size came from
    size_axis: SizeAxis | None
    hardware: HardwareProfile
    source_parameters: int | None
    models: dict[str, ArtifactBill]    # role -> its bill
    capacity: CapacityPlan

    @classmethod
    def of(cls, bill) -> RunBill:
        """A bill, or one read back from report.json (a view: an older report's keys)."""
        return bill if isinstance(bill, cls) else from_json(cls, bill, known_only=True)


@dataclass(frozen=True)
class BillError:
    """A run's bill that could not be computed (the bill is informational: the run goes on)."""
    error: str


# --- a decoder-only LLM, from its shape alone (pipeline.bill.llm) ----------------------------


@dataclass(frozen=True)
class LlmShape:
    params_b: float
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    max_context: int


@dataclass(frozen=True)
class LlmSetting:
    """What the bill is for: sequences, tokens each, the weights' and the KV cache's precision."""
    batch: int
    seq: int
    precision: str
    kv_precision: str
    margin_gb: float
    keep_free: float


@dataclass(frozen=True)
class LlmMemory:
    """Decimal GB (as datasheets print them), and GiB beside them."""
    weights_gb: float
    kv_cache_gb: float
    kv_cache_gib: float
    kv_bytes_per_token: float
    margin_gb: float
    total_gb: float
    weights_gib: float
    total_gib: float


@dataclass(frozen=True)
class Gqa:
    """What grouped-query attention saves against a cache with a KV head per query head."""
    kv_heads: int
    attention_heads: int
    kv_cache_if_mha_gb: float
    kv_saving_gb: float
    kv_saving_factor: float


@dataclass(frozen=True)
class LlmCompute:
    flops_per_token: float
    target_tokens_per_s: float
    tflops_for_target: float


@dataclass(frozen=True)
class CompilePeaks:
    """The host memory this pipeline's compile of the model peaks at, both ways."""
    fp32_path_peak_gb: float
    streaming_peak_gb: float
    checkpoint_bytes_per_param: float
    candidate_bits: int


@dataclass(frozen=True)
class Fit:
    """The device's memory against the bill's total."""
    device_gb: float
    usable_gb: float
    fits: bool
    headroom_gb: float                # negative: short by that much
    max_batch: int                    # sequences of ``seq`` tokens that fit
    devices_needed: int               # split across devices, at least
    max_seq_at_batch: int             # the longest context at ``batch``


@dataclass(frozen=True)
class Decode:
    """Generation ceilings: bandwidth (every step streams the weights and the KV cache) and
    compute; ``bound_by`` names the nearer."""
    bound_by: str
    tokens_per_s_single_stream: float | None = omitted()
    tokens_per_s_at_batch: float | None = omitted()
    compute_tokens_per_s: float | None = omitted()


@dataclass(frozen=True)
class Prefill:
    """The prompt's floor: its FLOPs at the peak, or the weights read once if that is longer."""
    tokens: int
    flops: float
    seconds_bound: float
    peak_tflops: float
    peak_precision: str


@dataclass(frozen=True)
class LlmBill:
    model: LlmShape
    setting: LlmSetting
    memory: LlmMemory
    gqa: Gqa
    compute: LlmCompute
    hardware: str                     # the profile's name
    compile: CompilePeaks
    fit: Fit | None = omitted()       # None: the profile gives no memory
    decode: Decode | None = omitted()  # None: neither bandwidth nor a peak
    prefill: Prefill | None = omitted()  # None: no peak for its precision
