"""optimize: constant folding and operator fusion, saved as a portable ONNX model.

In: an ``export`` artifact. Out: ``model.onnx`` with BatchNormalization folded into the
convolutions, shape arithmetic and weight re-packing folded into constants, and dead nodes removed,
plus node counts by op type before and after and parity against the exported model.

Why two passes, in this order: onnxscript's optimizer folds the exporter's decomposed helper ops
(CastLike, Expand, Mul chains) and BatchNorm into Conv; ONNX Runtime's *basic* level then folds
what only its shape inference sees. Only the basic level is saved: the extended level writes
ONNX Runtime-only ops (FusedConv), which other runtimes cannot load and the quantizer cannot read.
ONNX Runtime still fuses Conv+ReLU when it loads the saved model on the target.
Compute nodes are renamed after the PyTorch modules they came from (``_names.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.engine.runner import CHECKS_ONLY
from pipeline.stages._names import rename_like_export
from pipeline.stages._parity import compare, node_counts, require


@dataclass(frozen=True)
class Optimize:
    data: object           # DataSplit: the samples parity is checked on
    hardware: object = field(metadata=CHECKS_ONLY)  # runs its checks: not in the key
    tolerance: float = 1e-3
    name = "optimize"
    version = 4
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        import onnx
        import onnxruntime
        import onnxscript.optimizer

        from pipeline.runtimes import onnxruntime as ort
        from pipeline.runtimes.onnxruntime import disabled_optimizers
        from pipeline.models import task

        folded = out_dir / "folded.onnx"
        onnx.save(onnxscript.optimizer.optimize(onnx.load(str(parent.model))), str(folded))
        so = onnxruntime.SessionOptions()
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(out_dir / "model.onnx")
        # A model quantized before (a user's QDQ file) may name optimizers to leave off in its
        # metadata (QDQ propagation, which hoists a Q above a MaxPool onto a slow uint8 kernel):
        # every session honours that, and so must the one that writes this file, or the
        # propagation is baked in (the pipeline's own INT8 OCR model: 2.8 ms at batch 8 as
        # given, 4.8 ms after optimize)
        onnxruntime.InferenceSession(str(folded), so, providers=["CPUExecutionProvider"],
                                     disabled_optimizers=disabled_optimizers(parent.model) or None)
        folded.unlink()
        model = onnx.load(str(out_dir / "model.onnx"))
        modules = rename_like_export(onnx.load(str(parent.model)), model)
        onnx.save(model, str(out_dir / "model.onnx"))
        onnx.checker.check_model(str(out_dir / "model.onnx"))

        t = task(self.data.task)
        ds = t.dataset(self.data)
        before = ort.session(parent.model, self.hardware)
        after = ort.session(out_dir / "model.onnx", self.hardware)
        parity = compare(lambda x: ort.run(before, x), lambda x: ort.run(after, x), t, ds)
        require(parity, self.tolerance, "optimized model differs from the export")
        return {"nodes_before": node_counts(parent.model), "nodes": node_counts(out_dir / "model.onnx"),
                "parity_vs_export": parity, "modules": modules}
