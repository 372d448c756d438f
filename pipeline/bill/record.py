"""An ONNX artifact's bill and a run's, as records: what ``pipeline.bill.artifact`` computes,
``pipeline.bill.render`` prints and report.json's ``bill`` (and ``pipeline.bill --json``)
carries, read by field.

In: ``onnx_cost.analyse``'s cost, ``roofline.estimate``'s floor, the run's measurements. Out:
frozen records whose JSON is the keys the bill has always had. A few fields stay plain payloads
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
class RunBill:
    """A run report's bill: every report row's model at the gate's batch size, the hardware
    profile, the source network's parameter count and the capacity plan."""
    batch: int
    input_shape: list | None
    size_from: str                     # where the dynamic axis' size came from
    size_axis: dict | None             # input, axis and size the benchmark fed there
    hardware: dict                     # the profile: bandwidth, peaks, price, source
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
