"""The roofline: the least time a piece of work can take on a device, from its FLOPs and bytes.

In: per-operation costs (FLOPs, bytes moved, the precision each computes in) from
``pipeline.bill.onnx_cost`` and a ``HardwareConfig`` (dense peak per precision, memory
bandwidth). Out: the compute time at peak, the memory time at full bandwidth, their maximum (the
bound), the unfused estimate (each operation alone, at its own bound, one after another),
the arithmetic intensity and the device's ridge point. Plain arithmetic (Williams, Waterman and
Patterson, "Roofline", CACM 2009). A bound is a floor, never a prediction: a measured latency
far above it says how much the runtime leaves on the table (kernel launch, small shapes, threads).
Deliberately not handled: caches (every byte is charged at DRAM bandwidth), overlap of
operations, and multi-device splits.
"""
from __future__ import annotations

from pipeline.bill.record import Roofline

GB = 1e9
# When a device lists no peak for a precision, the next one that can do the work: INT4 and INT8
# widened to FP16, FP16 and BF16 converted to FP32 (what a CPU without half-precision arithmetic
# does). FP16 never falls back to BF16: they are different formats and units.
FALLBACK = {"int4": ("int4", "int8", "fp16", "fp32"), "int8": ("int8", "fp16", "fp32"),
            "fp16": ("fp16", "fp32"), "bf16": ("bf16", "fp32"), "fp32": ("fp32",),
            "fp64": ("fp32",)}


def peak_flops(hardware, precision: str) -> tuple[float | None, str | None]:
    """(FLOP/s, the precision whose peak was used); (None, None) if the profile lists none."""
    for p in FALLBACK.get(precision, ("fp32",)):
        value = getattr(hardware.peak_tflops, p, None)
        if value is not None:
            return value * 1e12, p
    return None, None


def estimate(ops: list[dict], compulsory_bytes: float, hardware) -> Roofline:
    """Roofline of a whole graph: ``ops`` carry flops, bytes and precision; the compulsory bytes
    (weights, inputs and outputs, each moved once) are the least any execution must move."""
    bw = hardware.memory_bandwidth_gbs
    compute_s, unfused_s, used, missing = 0.0, 0.0, set(), set()
    for op in ops:
        peak, p = peak_flops(hardware, op["precision"])
        t_c = 0.0
        if op["flops"]:
            if peak is None:
                missing.add(op["precision"])
            else:
                t_c = op["flops"] / peak
                used.add(p)
        t_m = op["bytes"] / (bw * GB) if bw else 0.0
        compute_s += t_c
        unfused_s += max(t_c, t_m)
    flops = sum(op["flops"] for op in ops)
    compute_ms = 1e3 * compute_s
    memory_ms = 1e3 * (compulsory_bytes / (bw * GB)) if bw else None
    fp32, _ = peak_flops(hardware, "fp32")
    return Roofline(
        hardware=hardware.name, compute_ms=compute_ms, memory_ms=memory_ms,
        intensity_flop_per_byte=flops / compulsory_bytes if compulsory_bytes else None,
        unfused_ms=1e3 * unfused_s if bw else None, peaks_used=tuple(sorted(used)),
        peaks_missing=tuple(sorted(missing)) or None,
        bound_ms=max(compute_ms, memory_ms or 0.0),
        bound_by="compute" if compute_ms >= (memory_ms or 0.0) else "memory",
        # the intensity above which FP32 is compute-bound
        ridge_flop_per_byte=fp32 / (bw * GB) if fp32 and bw else None)
