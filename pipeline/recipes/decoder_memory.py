"""The decoder's memory plan, decided before any stage: today's FP32 path, or the streaming path
for a model whose FP32 copies would not fit ``quant.decoder.memory_budget`` (docs/llm.md,
"Models larger than memory").

The FP32 path's peak is estimated as the FP32 weights' bytes (parameters x 4, counted from the
safetensors headers: nothing is loaded) times ``FP32_FACTOR`` (``FP32_CHECKPOINT_FACTOR`` for an
FP32 checkpoint, as a GGUF file converts to), plus ``RUN_BYTES`` (``pipeline.bill.compile_memory``
has the measurements). Measured on a 160 M-parameter
random Llama (bf16 checkpoint, 640 MB in FP32; Xeon with AMX, 2 cores), each step's resident
high-water mark above its own imports: ``weight_only`` 1.37x (``onnx.load`` plus the
quantizer's copies), the export's parity check about 1.2x (transformers' FP32 model and the
graph's session, whose external data onnxruntime maps), the builder's own FP32 export 0.59x of
the *checkpoint's* bytes (it keeps them in their dtype and casts each as it writes it); its
``-p int4`` 1.27x of FP32's (``to_nbits`` serializes the whole FP32 graph before quantizing).
So 1.4: the worst step, rounded up; each step above its imports, which ``RUN_BYTES`` adds.

Past the budget, the streaming path (``pipeline.stages.decoder_stream``): the builder's graph
with every MatMul weight left in the checkpoint (the model built on the meta device, no parity
check, no FP32 session, no FP32 file), each MatMul weight read from the safetensors and quantized
to MatMulNBits as it is read, and as the reference every candidate is scored and timed against,
INT8 (block ``REFERENCE_BLOCK``, round to nearest) of the checkpoint's own weights instead of
FP32: for a bf16 checkpoint that is the checkpoint's values to 8 bits, a quarter of FP32's
bytes, while FP32 itself, or even a bf16 graph, is larger than the budget once a candidate's
session sits beside it. The report says so in one line. Its architectures: ``STREAMED``, the
builder classes that load their weights through the builder's common code (which the streaming
export wraps) and were checked against the in-memory path.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

# the arithmetic, shared with the bill
from pipeline.bill.compile_memory import (REFERENCE_BITS, REFERENCE_BLOCK, fp32_path_peak,
                                          streaming_peak)
from pipeline.core.errors import ConfigError
from pipeline.models.checkpoint_tensors import CheckpointTensors

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
DTYPE_NAMES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}
GB = 1e9
STREAMED = ("LlamaForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class MemoryPlan:
    params: int                 # counted from the safetensors headers
    checkpoint_dtype: str       # the dtype holding most of the checkpoint's bytes
    checkpoint_bytes: int
    fp32_bytes: int             # params x 4
    fp32_peak_estimate: int     # fp32_path_peak: fp32_bytes x its factor, plus the run's own
    stream_peak_estimate: int   # the streaming path's largest step (see ``plan``)
    stream_fits: bool           # that estimate within the budget (else the run is tried anyway)
    machine_bytes: int          # physical memory, or the cgroup's limit when lower
    budget: float               # quant.decoder.memory_budget
    budget_bytes: int
    streaming: bool
    reference: str              # what candidates are scored and timed against, in words
    architecture: str = ""      # config.json's architectures[0]: the streaming path's are STREAMED

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def reference_name(self) -> str:
        """The reference in a few words, as a verdict's details name it."""
        return (f"the INT8 reference ({self.checkpoint_dtype} checkpoint)" if self.streaming
                else "FP32")


def machine_bytes() -> int:
    """Physical memory, or a container's cgroup limit when that is lower: what the OOM killer
    counts against. Total, not available: the path a run takes must not depend on what else
    happens to run beside it."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(limit).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and 0 < int(value) < total:
            total = int(value)
    return total


def checkpoint_size(folder: Path) -> tuple[int, dict[str, int]]:
    """Parameters and bytes by safetensors dtype, from the files' headers only."""
    params, by_dtype = 0, {}
    for t in CheckpointTensors(folder).entries.values():
        count = math.prod(t.shape)
        params += count
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + count * DTYPE_BYTES.get(t.dtype, 4)
    return params, by_dtype


def plan(decoder, q, total: int | None = None) -> MemoryPlan:
    """The path for ``decoder`` under ``q.memory_budget`` (a share of ``total`` bytes, the
    machine's by default)."""
    params, by_dtype = checkpoint_size(Path(decoder.folder))
    total = machine_bytes() if total is None else total
    dtype = max(by_dtype, key=by_dtype.get) if by_dtype else "F32"
    ck = sum(by_dtype.values())
    fp32 = 4 * params
    budget = int(q.memory_budget * total)
    # the streaming path's largest step: one model's session at a time (the reference's scoring
    # and decode timing, each model alone), the INT8 reference the largest; the export and the
    # quantization hold one layer at a time
    stream = int(streaming_peak(params, q.bits, q.block_size))
    name = DTYPE_NAMES.get(dtype, dtype.lower())
    fp32_peak = int(fp32_path_peak(params, name))
    streaming = fp32_peak > budget
    reference = (f"INT8 (block {REFERENCE_BLOCK}, round to nearest) of the {name} checkpoint: "
                 f"FP32 (about {fp32_peak / GB:.3g} GB at its peak) is past "
                 f"quant.decoder.memory_budget={q.memory_budget} ({budget / GB:.3g} GB)"
                 if streaming else "FP32")
    return MemoryPlan(params, name, ck, fp32, fp32_peak, stream, stream <= budget,
                      total, q.memory_budget, budget, streaming, reference,
                      decoder.architecture)


def check_streaming(cfg, memory: MemoryPlan) -> None:
    """What the streaming path offers, refused in one line before any stage: one width
    everywhere, round to nearest (the mixed search's proxy, GPTQ, HQQ and k-quants all read the
    FP32 model whole, and quant=none would ship FP32 itself)."""
    if not memory.streaming:
        return
    mode, q = cfg.quant.mode.value, cfg.quant.decoder
    past = (f"the decoder ({memory.fp32_bytes / GB:.3g} GB in FP32) is past "
            f"quant.decoder.memory_budget={q.memory_budget} ({memory.budget_bytes / GB:.3g} GB)")
    if memory.architecture not in STREAMED:
        raise ConfigError(f"{memory.architecture}: {past}; its streaming path builds "
                          f"{', '.join(STREAMED)}")
    if mode not in ("int8", "dynamic"):
        raise ConfigError(f"quant={mode}: {past}; its streaming path builds one width "
                          "everywhere: quant=int8 with quant.decoder.bits=4 or 8 (or a larger "
                          "quant.decoder.memory_budget, where the machine has the room)")
    if q.algorithm != "rtn":
        raise ConfigError(f"quant.decoder.algorithm={q.algorithm}: {past}; its streaming path "
                          "quantizes one weight at a time, round to nearest (rtn)")


def reference_plan(names: list[str]) -> dict[str, int]:
    return {n: REFERENCE_BITS for n in names}
