"""A model its authors already quantized: what each quant mode does with it, decided before any
stage runs.

In: the run's config and its task (``quantized_ops``: the quantized op types of the user's ONNX
graph, ``pipeline.models.onnx_file``). Out: the config to run. ``quant=int8`` / ``dynamic`` /
``mixed`` quantize a float model; on a graph that already holds ``ConvInteger``,
``DynamicQuantizeLSTM``, QDQ pairs and the like, onnxruntime's quantizer fails deep inside with a
line that does not name the cause, so they are refused in one line (exit 2). ``quant=auto``
would build only such candidates: it runs as ``quant=none`` (the model as given, optimized, is the
candidate, its accuracy gated against its FP16 copy and its speed against the file as given, which
it must not be slower than; published as is) and says so in one line.
``none``, ``fp16`` and ``bf16`` are unchanged.
"""
from __future__ import annotations

import dataclasses

from pipeline.config import QuantMode
from pipeline.core.errors import ConfigError

REQUANTIZE = (QuantMode.int8, QuantMode.dynamic, QuantMode.mixed)


def already_quantized(cfg, task) -> tuple[object, str | None]:
    """``(cfg, warning)``: the config to run, and one line to print when it was changed."""
    ops = list(getattr(task, "quantized_ops", ()) or ())
    if not ops:
        return cfg, None
    mode = cfg.quant.mode
    shown = ", ".join(ops[:4]) + (", ..." if len(ops) > 4 else "")
    what = f"model.path={cfg.model.path} is already quantized ({shown})"
    if mode in REQUANTIZE:
        raise ConfigError(f"{what}: quant={mode.value} re-quantizes float models; use quant=none "
                          "to gate and publish it as is")
    if mode == QuantMode.auto:
        return (dataclasses.replace(cfg, quant=dataclasses.replace(cfg.quant, mode=QuantMode.none)),
                f"{what}: quant=auto has no float model to quantize; running as quant=none (the "
                "model as given is the candidate, its accuracy gated against its FP16 copy and "
                "its speed against the file as given, published as is)")
    return cfg, None
