"""prepare: the float model as the quantizer wants it (shape inference and its optimizations).

In: an ``optimize`` artifact. Out: ``model.onnx`` from onnxruntime's ``quant_pre_process``: shapes
inferred for every tensor, which the calibrator and quantizer need. Symbolic shape inference fails
on some graphs ("Incomplete symbolic shape inference"); the stage then retries without it and
records that it did. Its own stage so that calibration (expensive) and quantization (cheap, many
variants) can both start from the same cached file.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import StageError


@dataclass(frozen=True)
class Prepare:
    name = "prepare"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        target = out_dir / "model.onnx"
        try:
            quant_pre_process(str(parent.model), str(target))
            return {"symbolic_shape_inference": True}
        except Exception as first:  # noqa: BLE001 - retried below, reported if that fails too
            try:
                quant_pre_process(str(parent.model), str(target), skip_symbolic_shape=True)
            except Exception as e:  # noqa: BLE001
                raise StageError(f"quant_pre_process failed ({first}); without symbolic shape "
                                 f"inference too: {e}") from None
            print(f"  prepare: symbolic shape inference failed ({str(first).splitlines()[0][:120]}"
                  "); continued without it", flush=True)
            return {"symbolic_shape_inference": False, "symbolic_failure": str(first)[:300]}
