"""export: torch network -> ONNX, with dynamic batch and width, checked against torch.

In: a ``load`` artifact. Out: ``model.onnx`` (opset >= 17) and parity numbers. torch's dynamo
exporter (with onnxscript) does the work; its own graph optimizer is switched off so that the
``optimize`` stage's effect stays visible on its own line of the report. A max logit difference
above ``tolerance`` or any changed decoded string fails the stage with the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.stages.load import network_from
from pipeline.stages.parity import compare, node_counts, require


@dataclass(frozen=True)
class Export:
    task: str
    opset: int
    parity_samples: int
    data_dir: str
    hardware: object
    tolerance: float = 1e-3
    name = "export"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        import logging
        import warnings

        import torch

        from pipeline.runtimes import onnxruntime as ort
        from pipeline.models import task

        t = task(self.task)
        net = network_from(parent, t)
        example = torch.from_numpy(t.example_input())
        batch, width = torch.export.Dim("batch", min=1), torch.export.Dim("width", min=8)
        target = out_dir / "model.onnx"
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                net, (example,), dynamo=True, opset_version=self.opset, optimize=False,
                input_names=[t.INPUT_NAME], output_names=[t.OUTPUT_NAME],
                dynamic_shapes={"x": {0: batch, 3: width}}, verbose=False)
        program.save(str(target))
        ds, digest = t.dataset("evaluation", self.parity_samples, self.data_dir)
        sess = ort.session(target, self.hardware)
        with torch.inference_mode():
            parity = compare(lambda x: net(torch.from_numpy(x)).numpy(),
                             lambda x: ort.run(sess, x), t, ds)
        require(parity, self.tolerance, "ONNX export differs from torch")
        return {"opset": self.opset, "parity_vs_torch": parity, "parity_set": digest,
                "nodes": node_counts(target)}
