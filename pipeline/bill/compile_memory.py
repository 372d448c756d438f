"""What compiling a decoder costs in memory at its peak, before anything runs: today's FP32
path against the streaming one (docs/llm.md, "Models larger than memory").

Plain arithmetic on the parameter count, with factors measured on a 160 M-parameter random Llama
with bf16 weights (resident high-water marks of each step above its imports; the measurements
and the steps are in ``pipeline.recipes.decoder_memory``, which decides the path with these
numbers): the FP32 path's worst step holds 1.4x the FP32 weights of a 16-bit checkpoint, 1.85x
of an FP32 one, plus what the run holds whatever the model (``RUN_BYTES``). The streaming path
holds one model's session at a time (scoring reads the reference's kept log-probabilities, not its
session; decode timing loads the reference and each candidate alone, in turn), so its peak is
the largest of them, the INT8 reference, times ``ONE_SESSION_FACTOR``; its export and
quantization hold one layer at a time (measured: a 24-layer model's compile peaked 3 MiB above
its 2-layer twin's; a 7 B one's at 1.7 GB, imports included), nothing the size of the model.
"""
from __future__ import annotations

FP32_FACTOR = 1.4        # the FP32 path's peak over its weights' bytes (``weight_only``: 1.37)
# From an FP32 checkpoint (a GGUF file converts to one) the export is the worst step instead:
# transformers' model and the builder's copy are both FP32, then the parity check's session. The
# whole run's peak (its process tree, summed) of two real decoders fed from GGUF files
# (benchmarks.real_decoder; Xeon with AMX, 24 GB): Qwen2.5-Coder-0.5B, 2.52 GB of FP32 weights,
# 7.41 GB; Qwen2.5-Coder-1.5B, 7.11 GB, 15.88 GB. A line through both: 1.85 per FP32 byte and
# 2.76 GB besides. (1.4 alone estimated the second at 9.95 GB: 63 % of the machine where the
# plan said 39 %.)
FP32_CHECKPOINT_FACTOR = 1.85
# What a run holds whatever the model: the pipeline's own process and the stage's imports
# (torch, transformers, onnxruntime and its GenAI), which the 160 M measurement was taken above.
RUN_BYTES = 2.76e9
REFERENCE_BITS = 8       # the streaming path's reference: INT8 ...
REFERENCE_BLOCK = 32     # ... at onnxruntime-genai's own block
SCALE_BYTES = 4          # an FP32 scale per block, as MatMulNBits stores it in an FP32 graph
# the run's peak (its process tree, summed) over the reference's weight bytes as estimated here
# (parameters x 1.125), measured on a 7 B-shaped Llama at INT4 (benchmarks.big_decoder, decode
# timed one model at a time): 10.57 GB against 6.74 B x 1.125 = 7.58 GB, 1.39, rounded up; the
# rest is the embedding kept FP32, the runtime's buffers and the pipeline's own process (1.7 GB)
# beside the stage's child. (Both sessions side by side, as decode timing held them before, came
# to 16.2 GB: this estimate's 15.1 GB then.)
ONE_SESSION_FACTOR = 1.4


def nbits_bytes_per_param(bits: int, block: int) -> float:
    return bits / 8 + SCALE_BYTES / block


def fp32_path_peak(params: float, checkpoint_dtype: str = "bf16") -> float:
    """The FP32 path's whole-run peak for a checkpoint of ``checkpoint_dtype`` ("fp32", "bf16",
    "fp16")."""
    factor = FP32_CHECKPOINT_FACTOR if checkpoint_dtype == "fp32" else FP32_FACTOR
    return factor * 4 * params + RUN_BYTES


def streaming_peak(params: float, bits: int, block: int) -> float:
    """One session at a time: the larger of the reference and the candidate (the reference,
    unless a candidate is wider than INT8 at block 32)."""
    return ONE_SESSION_FACTOR * params * max(
        nbits_bytes_per_param(REFERENCE_BITS, REFERENCE_BLOCK), nbits_bytes_per_param(bits, block))
