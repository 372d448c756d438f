"""Nodes that read or write a masking sentinel: kept float by static INT8.

Why: attention masks are added to the scores as a huge negative constant (``finfo(float32).min``
= -3.4e38 in transformers' current models, -1e9 or -1e4 in older ones, or ``-inf``) right before
the Softmax. Calibration then records that constant as the tensor's minimum, and one INT8 scale
spans it: on all-mpnet-base-v2 the ``scores + mask`` Add got scale 1.3e36, so every real score
rounded to 0 and each head attended uniformly (mean cosine 0.04 against FP16). No scale can
hold both the sentinel and values near 1, so those tensors must stay float; an Add and a Softmax
per layer cost little in float.

In: an ONNX model (graph only) and the calibrated ranges ``{tensor: (lowest, highest)}``. Out: the
names of the nodes that produce or consume a tensor whose range reaches ``SENTINEL`` in magnitude
(or is not finite): onnxruntime puts a Q/DQ pair on a tensor when either side is quantized, so
both sides must be excluded.
"""
from __future__ import annotations

import math

# Magnitude from which a calibrated range is a mask, not an activation: the smallest mask in use
# (-1e4, BERT's original) is an order of magnitude above the largest real activations seen here
# (outlier channels of pretrained encoders reach ~1.3e3).
SENTINEL = 1e4


def sentinel_tensors(ranges: dict[str, tuple[float, float]]) -> list[str]:
    """Tensors whose calibrated range reaches a masking sentinel (or infinity, or NaN)."""
    return sorted(t for t, (lo, hi) in ranges.items()
                  if not (math.isfinite(lo) and math.isfinite(hi))
                  or max(abs(lo), abs(hi)) >= SENTINEL)


def mask_nodes(model, ranges: dict[str, tuple[float, float]]) -> list[str]:
    """Names of the nodes that produce or consume a sentinel-ranged tensor, in graph order."""
    masks = set(sentinel_tensors(ranges))
    return [n.name for n in model.graph.node
            if n.name and any(t in masks for t in [*n.input, *n.output])]


def calibrated_ranges(path) -> dict[str, tuple[float, float]]:
    """``{tensor: (lowest, highest)}`` from a calibration cache written by the calibrate stage."""
    import numpy as np
    from onnxruntime.quantization.calibrate import load_tensors_data

    data = load_tensors_data(path)
    return {name: (float(np.min(td.range_value[0])), float(np.max(td.range_value[1])))
            for name, td in data.data.items()}
