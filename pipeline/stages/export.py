"""export: torch network -> ONNX, with the dynamic axes the task declares, checked against torch.

In: a ``load`` artifact and the task's inputs (names, and which axes are dynamic: batch, width,
...). Out: ``model.onnx`` (opset >= 17) and parity numbers on real samples of ``data``. torch's dynamo
exporter (with onnxscript) does the work, unless the task exports itself
(``export_onnx``: model=hf uses the TorchScript exporter, whose graph ORT's fusions know); its own graph optimizer is switched off so that the
``optimize`` stage's effect stays visible on its own line of the report. A max logit difference
above ``tolerance`` or any changed decoded string fails the stage with the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.engine.runner import CHECKS_ONLY
from pipeline.stages.load import network_from
from pipeline.stages._parity import compare, node_counts, require

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
        import torch

        from pipeline.runtimes import onnxruntime as ort
        from pipeline.models import task

        t = task(self.task)
        net = network_from(parent, t)
        example = t.example(2)
        target = out_dir / "model.onnx"
        if hasattr(t, "export_onnx"):  # a task that exports itself (model=hf)
            t.export_onnx(net, example, target, self.opset)
        else:
            self._dynamo(net, t, example, target)
        ds = t.dataset(self.data)
        sess = ort.session(target, self.hardware)
        with torch.inference_mode():
            parity = compare(lambda feeds: torch_forward(net, t, feeds),
                             lambda feeds: ort.run(sess, feeds), t, ds)
        require(parity, self.tolerance, "ONNX export differs from torch")
        return {"opset": _opset(target), "parity_vs_torch": parity,
                "parity_set": self.data.digest, "nodes": node_counts(target)}

    def _dynamo(self, net, t, example: dict, target: Path) -> None:
        import logging
        import warnings

        import torch

        args = tuple(torch.from_numpy(example[i.name]) for i in t.inputs)
        dims: dict[str, object] = {}  # one Dim per meaning: inputs sharing an axis share its size
        for i in t.inputs:
            for meaning in i.dynamic.values():
                if meaning not in dims:
                    dims[meaning] = torch.export.Dim(meaning, min=1 if meaning == "batch"
                                                     else DYNAMIC_MIN)
        dynamic = tuple({axis: dims[m] for axis, m in i.dynamic.items()} for i in t.inputs)
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                net, args, dynamo=True, opset_version=self.opset, optimize=False,
                input_names=[i.name for i in t.inputs], output_names=[o.name for o in t.outputs],
                dynamic_shapes=dynamic, verbose=False)
        for node in program.model.graph.all_nodes():
            # torch records the Python stack behind each node, with this checkout's absolute
            # paths: the same network would export to other bytes (another digest) elsewhere
            node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)
        program.save(str(target))


def _opset(path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def torch_forward(net, t, feeds: dict):
    """The network's first output for a batch of feeds, as numpy (inputs in declared order)."""
    import torch

    out = net(*(torch.from_numpy(feeds[i.name]) for i in t.inputs))
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.numpy()
