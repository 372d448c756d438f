"""quantize: static INT8 in QDQ format, calibrated on the task's calibration set.

In: an ``optimize`` artifact and the quant config. Out: ``model.onnx`` with QuantizeLinear /
DequantizeLinear pairs around the quantized ops (per-channel weights), the calibration set's digest
and node counts. onnxruntime.quantization does the work: ``quant_pre_process`` (shape inference and
its own optimizations; retried without symbolic shape inference, which fails on some graphs), then
``quantize_static``. Calibration batches are streamed from the ``datasets`` set one at a time.
Typed config fields map to onnxruntime's options in exactly one function, ``_ort_options``.
Deliberately not handled here: per-layer precision choices and accuracy-driven search.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StageError
from pipeline.stages.parity import node_counts


def _ort_options(quant) -> dict:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    return {"quant_format": QuantFormat.QDQ, "per_channel": quant.per_channel,
            "reduce_range": quant.reduce_range,
            "weight_type": types[quant.weight_type.value],
            "activation_type": types[quant.activation_type.value],
            "calibrate_method": methods[quant.calibration.value],
            "extra_options": {"WeightSymmetric": True, "ActivationSymmetric": False}}


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over a streamed data set."""

    def __init__(self, task, ds, batch_size: int):
        self._batches = task.batches(ds, batch_size, sort_by_width=False)
        self._input = task.INPUT_NAME

    def get_next(self):
        batch = next(self._batches, None)
        return None if batch is None else {self._input: batch[1]}

    def rewind(self):  # not needed: each calibrator pass builds a new reader
        raise NotImplementedError


@dataclass(frozen=True)
class Quantize:
    task: str
    quant: object
    calibration_samples: int
    data_dir: str
    name = "quantize"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        from onnxruntime.quantization import quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process

        from pipeline.models import task

        t = task(self.task)
        ds, digest = t.dataset("calibration", self.calibration_samples, self.data_dir)
        prepared = out_dir / "prepared.onnx"
        try:
            quant_pre_process(str(parent.model), str(prepared))
        except Exception:  # noqa: BLE001 - "Incomplete symbolic shape inference" on some graphs
            quant_pre_process(str(parent.model), str(prepared), skip_symbolic_shape=True)
        target = out_dir / "model.onnx"
        try:
            quantize_static(str(prepared), str(target), _Reader(t, ds, self.quant.calibration_batch_size),
                            **_ort_options(self.quant))
        except Exception as e:  # noqa: BLE001 - re-raised with the model and method named
            raise StageError(f"onnxruntime quantize_static failed ({self.quant.calibration.value} "
                             f"calibration): {type(e).__name__}: {e}") from None
        finally:
            prepared.unlink(missing_ok=True)
        for leftover in out_dir.glob("*.onnx.data"):
            leftover.unlink()
        nodes = node_counts(target)
        return {"nodes": nodes, "calibration_set": digest,
                "calibration_samples": len(ds), "qdq_pairs": nodes.get("QuantizeLinear", 0)}
