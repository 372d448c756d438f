"""Hardware-aware INT8 settings: what the CPU's integer instructions want.

In: the CPU flags (``pipeline.core.env.effective_flags``: this CPU's, less an instruction-set cap)
and the user's quant config. Out: the resolved activation/weight types, ``reduce_range`` and
format, with the reason, recorded in the manifest.

Why: ONNX Runtime's x86 INT8 kernels multiply unsigned 8-bit activations by signed 8-bit weights.
With VNNI (AVX512-VNNI, AVX-VNNI) or AMX the products accumulate exactly in 32 bits; on AVX2 or
AVX512 without VNNI the instruction sequence (vpmaddubsw) saturates 16-bit intermediate sums, so
weights must use 7 bits (``reduce_range``) or results are silently wrong. QDQ is the format the CPU
provider fuses into QLinear kernels; the older QOperator format is not used.
"""
from __future__ import annotations

from dataclasses import dataclass

VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@dataclass(frozen=True)
class Int8Settings:
    """The resolved INT8 settings: part of the quantize stage's key, and of the manifest."""
    activation_type: str     # uint8 | int8
    weight_type: str         # int8 | uint8
    reduce_range: bool       # 7-bit weights (no VNNI: 16-bit intermediate sums saturate)
    format: str              # QDQ: what the CPU provider fuses into QLinear kernels
    vnni: bool               # the CPU multiplies u8 x s8 exactly (VNNI or AMX)
    reason: str              # why reduce_range is what it is


def resolve(quant, flags: list[str]) -> Int8Settings:
    has_vnni = any(f in flags for f in VNNI_FLAGS)
    if has_vnni:
        reason = f"{'/'.join(f for f in VNNI_FLAGS if f in flags)}: exact u8 x s8 products"
        auto_reduce = False
    elif "avx2" in flags or "avx512f" in flags:
        reason = "AVX2/AVX512 without VNNI: 7-bit weights avoid 16-bit saturation"
        auto_reduce = True
    else:
        reason = "no AVX2: generic kernels, 7-bit weights for safety"
        auto_reduce = True
    reduce_range = auto_reduce if quant.reduce_range is None else quant.reduce_range
    return Int8Settings(
        activation_type=quant.activation_type.value, weight_type=quant.weight_type.value,
        reduce_range=reduce_range, format="QDQ", vnni=has_vnni,
        reason=reason if quant.reduce_range is None else f"reduce_range set by config ({reason})")
