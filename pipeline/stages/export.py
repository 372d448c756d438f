"""export: torch network -> ONNX, with the dynamic axes the task declares, checked against torch.

In: a ``load`` artifact and the task's inputs (names, and which axes are dynamic: batch, width,
...). Out: ``model.onnx`` (opset >= 17) and parity numbers on real samples of ``data``. torch's dynamo
exporter (with onnxscript) does the work; its own graph optimizer is switched off so that the
``optimize`` stage's effect stays visible on its own line of the report. A max logit difference
above ``tolerance`` or any changed decoded string fails the stage with the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.runner import CHECKS_ONLY
from pipeline.stages.load import network_from
from pipeline.stages.parity import compare, node_counts, require

DYNAMIC_MIN = 8  # smallest size torch.export may assume for a dynamic axis other than the batch


@dataclass(frozen=True)
class Export:
    task: object           # the task's key (pipeline.models.task)
    opset: int
    data: object           # DataSplit: the samples parity is checked on
    hardware: object = field(metadata=CHECKS_ONLY)  # runs its checks: not in the key
    tolerance: float = 1e-3
    name = "export"
    version = 2
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        import logging
        import warnings

        import torch

        from pipeline.runtimes import onnxruntime as ort
        from pipeline.models import task

        t = task(self.task)
        net = network_from(parent, t)
        example = t.example(2)
        args = tuple(torch.from_numpy(example[i.name]) for i in t.inputs)
        dims: dict[str, object] = {}  # one Dim per meaning: inputs sharing an axis share its size
        for i in t.inputs:
            for meaning in i.dynamic.values():
                if meaning not in dims:
                    dims[meaning] = torch.export.Dim(meaning, min=1 if meaning == "batch"
                                                     else DYNAMIC_MIN)
        dynamic = tuple({axis: dims[m] for axis, m in i.dynamic.items()} for i in t.inputs)
        target = out_dir / "model.onnx"
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                net, args, dynamo=True, opset_version=self.opset, optimize=False,
                input_names=[i.name for i in t.inputs], output_names=[o.name for o in t.outputs],
                dynamic_shapes=dynamic, verbose=False)
        program.save(str(target))
        ds = t.dataset(self.data)
        sess = ort.session(target, self.hardware)
        with torch.inference_mode():
            parity = compare(lambda feeds: torch_forward(net, t, feeds),
                             lambda feeds: ort.run(sess, feeds), t, ds)
        require(parity, self.tolerance, "ONNX export differs from torch")
        return {"opset": self.opset, "parity_vs_torch": parity, "parity_set": self.data.digest,
                "nodes": node_counts(target)}


def torch_forward(net, t, feeds: dict):
    """The network's first output for a batch of feeds, as numpy (inputs in declared order)."""
    import torch

    out = net(*(torch.from_numpy(feeds[i.name]) for i in t.inputs))
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.numpy()
