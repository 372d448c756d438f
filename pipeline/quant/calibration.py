"""Calibration, as onnxruntime takes it: the method names the config uses, and a data reader.

In: a method name from ``quant.calibration`` (``minmax``, ``entropy``, ``percentile``) or an
iterable of input feeds (``{input name: batch}``). Out: onnxruntime's ``CalibrationMethod``, and
an object with ``get_next`` (onnxruntime's ``CalibrationDataReader`` protocol, which it checks by
that method alone) that hands the feeds over once, lazily, so a large set is never held at once.
The one home of both, for the calibrate and quantize stages and for ``make bench``'s peers.
"""
from __future__ import annotations

from typing import Iterable

# Cheapest and simplest first: quant.calibration=auto breaks a tie in this order.
METHODS = ("minmax", "entropy", "percentile")
DYNAMIC = "none"  # the calibration of dynamic INT8: activations are quantized per call


def ort_method(name: str):
    """onnxruntime's ``CalibrationMethod`` for a method name of the config."""
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}[name]


class Feeds:
    """onnxruntime's CalibrationDataReader protocol over input feeds, consumed once."""

    def __init__(self, feeds: Iterable[dict]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)
