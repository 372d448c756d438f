"""The bill of a decoder-only LLM: memory, compute and speed limits from its shape alone.

In: an ``LlmConfig`` (parameters, layers, heads, KV heads, head dim), a ``BillConfig`` (batch,
sequence length, weight and KV precision, margin) and a ``HardwareConfig``. Out: an ``LlmBill``
(``pipeline.bill.record``): weights, KV cache, margin and total in GB; whether it fits the
device and by how much; the largest batch that fits; FLOPs per token; the decode ceiling from
memory bandwidth and the prefill time bound from compute. Plain arithmetic, the usual estimator:
``weights = params * bits / 8`` (plus one scale per ``bill.weight_block`` weights for weight-only
INT8/INT4, as the kernels read them: ``pipeline.bill.token_bytes`` counts them from a graph),
``kv = batch * seq * layers * kv_heads * head_dim * 2 * bytes``,
``total = weights + kv + margin``. GB are decimal (1e9 B), as datasheets print them; GiB are shown too.
Deliberately not handled: tensor parallelism across cards, paged-KV fragmentation, speculative
decoding, mixture-of-experts (active parameters differ from stored ones) and prefix caching.
"""
from __future__ import annotations

import math

from pipeline.bill.record import (CompilePeaks, Decode, Fit, Gqa, LlmBill, LlmCompute,
                                  LlmMemory, LlmSetting, LlmShape, Prefill)
from pipeline.config import Precision

GB, GIB = 1e9, 2 ** 30
BYTES = {Precision.fp32: 4.0, Precision.fp16: 2.0, Precision.int8: 1.0, Precision.int4: 0.5}
# The throughput peak a precision computes at. INT4 here means weight-only quantization (AWQ,
# GPTQ): weights are widened to FP16 before the matrix multiply, so FP16 tensor cores do the
# work. INT8 means W8A8 (SmoothQuant-style), which runs on the INT8 path where the device has one.
COMPUTE = {Precision.fp32: "fp32", Precision.fp16: "fp16", Precision.int8: "int8",
           Precision.int4: "fp16"}


def weight_bytes(params_b: float, precision: Precision, block: int = 0,
                 scale_bytes: float = 4.0) -> float:
    """Codes, plus for INT8/INT4 one scale per ``block`` weights: at block 32 with FP32 scales
    INT4 is 0.625 byte per weight, not 0.5 (the scales are read every token like the codes)."""
    scales = params_b * 1e9 / block * scale_bytes if block and precision in (
        Precision.int8, Precision.int4) else 0.0
    return params_b * 1e9 * BYTES[precision] + scales


def bill_weight_bytes(llm, bill, precision: Precision) -> float:
    return weight_bytes(llm.params_b, precision, bill.weight_block, bill.scale_bytes)


def kv_bytes(llm, batch: int, seq: int, precision: Precision) -> float:
    """K and V for every layer, KV head and position: why GQA (fewer KV heads) saves memory."""
    return batch * seq * llm.layers * llm.kv_heads * llm.head_dim * 2 * BYTES[precision]


def flops_per_token(params_b: float) -> float:
    """About 2 FLOPs (one multiply-add) per parameter per generated token."""
    return 2 * params_b * 1e9


def prefill_flops(llm, batch: int, seq: int) -> float:
    """Dense layers (2 * params per token) plus causal attention: QK^T and AV each cost
    seq^2/2 * head_dim multiply-adds per query head and layer."""
    dense = flops_per_token(llm.params_b) * batch * seq
    attention = 2 * llm.layers * batch * seq * seq * llm.attention_heads * llm.head_dim
    return dense + attention


def usable_bytes(hardware, bill) -> float:
    return hardware.memory_gb * GB * (1 - bill.keep_free)


def max_batch(llm, bill, hardware, weights_precision: Precision | None = None) -> int:
    """The most sequences of ``bill.seq`` tokens whose KV cache fits beside weights and margin."""
    p = weights_precision or bill.precision
    free = usable_bytes(hardware, bill) - bill_weight_bytes(llm, bill, p) - bill.margin_gb * GB
    per_seq = kv_bytes(llm, 1, bill.seq, bill.kv_precision)
    return max(0, math.floor(free / per_seq + 1e-9))


def compile_peaks(llm, precision: Precision,
                  checkpoint_bytes_per_param: float = 2.0) -> CompilePeaks:
    """This pipeline's compile of the model, on the host, at its peak (``bill.compile_memory``):
    the FP32 path and the streaming one (whose peak does not depend on the checkpoint's dtype:
    it reads one layer at a time), from a bf16 checkpoint by default. Weight-only widths
    only: FP16 and FP32 are not built by the streaming path (its candidate is then INT8)."""
    from pipeline.bill.compile_memory import fp32_path_peak, streaming_peak

    params = llm.params_b * 1e9
    bits = 4 if precision == Precision.int4 else 8
    dtype = "fp32" if checkpoint_bytes_per_param >= 4 else "bf16"
    return CompilePeaks(fp32_path_peak(params, dtype) / GB, streaming_peak(params, bits, 32) / GB,
                        checkpoint_bytes_per_param, bits)


def llm_bill(llm, bill, hardware, precision: Precision | None = None) -> LlmBill:
    from pipeline.bill.roofline import peak_flops

    p = precision or bill.precision
    kvp = bill.kv_precision
    w = bill_weight_bytes(llm, bill, p)
    kv = kv_bytes(llm, bill.batch, bill.seq, kvp)
    mha_kv = kv * llm.attention_heads / llm.kv_heads
    total = w + kv + bill.margin_gb * GB
    fit = None
    if hardware.memory_gb is not None:
        usable = usable_bytes(hardware, bill)
        fit = Fit(device_gb=hardware.memory_gb, usable_gb=usable / GB, fits=total <= usable,
                  headroom_gb=(usable - total) / GB, max_batch=max_batch(llm, bill, hardware, p),
                  # Split across devices (tensor parallel) it needs at least this many; the
                  # traffic between them is not billed (see hardware.interconnect).
                  devices_needed=math.ceil(total / usable - 1e-9),
                  max_seq_at_batch=min(llm.max_context, max(0, math.floor(
                      (usable - w - bill.margin_gb * GB) / kv_bytes(llm, bill.batch, 1, kvp)
                      + 1e-9))))
    bw = hardware.memory_bandwidth_gbs
    peak, peak_dtype = peak_flops(hardware, COMPUTE[p])
    prefill = None
    if peak is not None:
        fl = prefill_flops(llm, bill.batch, bill.seq)
        seconds = fl / peak
        if bw is not None:
            seconds = max(seconds, w / (bw * GB))
        prefill = Prefill(bill.batch * bill.seq, fl, seconds, peak / 1e12, peak_dtype)
    return LlmBill(
        model=LlmShape(llm.params_b, llm.layers, llm.attention_heads, llm.kv_heads,
                       llm.head_dim, llm.attention_heads * llm.head_dim, llm.vocab,
                       llm.max_context),
        setting=LlmSetting(bill.batch, bill.seq, p.value, kvp.value, bill.margin_gb,
                           bill.keep_free),
        memory=LlmMemory(weights_gb=w / GB, kv_cache_gb=kv / GB, kv_cache_gib=kv / GIB,
                         kv_bytes_per_token=kv / (bill.batch * bill.seq),
                         margin_gb=bill.margin_gb, total_gb=total / GB, weights_gib=w / GIB,
                         total_gib=total / GIB),
        gqa=Gqa(llm.kv_heads, llm.attention_heads, mha_kv / GB, (mha_kv - kv) / GB,
                llm.attention_heads / llm.kv_heads),
        compute=LlmCompute(flops_per_token(llm.params_b), bill.tokens_per_s,
                           flops_per_token(llm.params_b) * bill.tokens_per_s / 1e12),
        hardware=hardware.name, compile=compile_peaks(llm, p), fit=fit,
        decode=_decode(llm, bill, w, kv, bw, peak), prefill=prefill)


def _decode(llm, bill, w: float, kv: float, bw, peak) -> Decode | None:
    """Every decode step streams all weights once (shared by the batch) and each sequence's KV
    cache; the single-stream ceiling is the bandwidth over the weight bytes."""
    if bw is None and peak is None:
        return None
    single = bw * GB / w if bw is not None else None
    at_batch = bill.batch * bw * GB / (w + kv) if bw is not None else None
    compute = peak / flops_per_token(llm.params_b) if peak is not None else None
    if at_batch is not None and compute is not None:
        at_batch = min(at_batch, compute)
    bound = ("memory bandwidth" if peak is None or bw is None or
             bill.batch * flops_per_token(llm.params_b) / peak < (w + kv) / (bw * GB)
             else "compute")
    return Decode(bound, single, at_batch, compute)
