"""What compiling a decoder costs in memory at its peak, before anything runs: today's FP32
path against the streaming one (docs/llm.md, "Models larger than memory").

Plain arithmetic on the parameter count, with factors measured on a 160 M-parameter random Llama
with bf16 weights (resident high-water marks of each step above its imports; the measurements
and the steps are in ``pipeline.recipes.decoder_memory``, which decides the path with these
numbers): the FP32 path's worst step holds 1.4x the FP32 weights; the streaming path's, the
larger of the checkpoint (the builder keeps it in its own dtype) and the INT8 reference's and
the candidate's weights side by side (scoring holds both sessions).
"""
from __future__ import annotations

FP32_FACTOR = 1.4        # the FP32 path's peak over its weights' bytes (``weight_only``: 1.37)
CHECKPOINT_FACTOR = 1.0  # the builder over the checkpoint's bytes: 0.59 measured with its
# safetensors memory-mapped; 1.0 where the pages are copied instead
REFERENCE_BITS = 8       # the streaming path's reference: INT8 ...
REFERENCE_BLOCK = 32     # ... at onnxruntime-genai's own block
SCALE_BYTES = 4          # an FP32 scale per block, as MatMulNBits stores it in an FP32 graph


def nbits_bytes_per_param(bits: int, block: int) -> float:
    return bits / 8 + SCALE_BYTES / block


def fp32_path_peak(params: float) -> float:
    return FP32_FACTOR * 4 * params


def streaming_peak(params: float, checkpoint_bytes: float, bits: int, block: int) -> float:
    return max(CHECKPOINT_FACTOR * checkpoint_bytes,
               params * (nbits_bytes_per_param(REFERENCE_BITS, REFERENCE_BLOCK)
                         + nbits_bytes_per_param(bits, block)))
