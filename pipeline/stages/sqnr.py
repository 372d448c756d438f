"""sqnr: how much error each quantized node adds, measured on its own output.

In: a ``quantize`` artifact and the FP32 model it came from (``fp32``), and the ranking subset.
Out: per quantized node, the signal-to-quantization-noise ratio of its output tensor, in dB:
10·log10(Σx² / Σ(x − x̂)²) with x from the float model and x̂ from the INT8 model, both run with
graph optimizations off so every node output exists as a tensor (the QDQ arithmetic is the same
the fused kernels compute, up to rounding). Low SQNR marks a node whose ranges or weights
quantize badly; its effect on the task metric is measured separately by the mixed search.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.engine.runner import CHECKS_ONLY


def _with_outputs(model_path: Path, names: list[str], out: Path) -> Path:
    import onnx

    model = onnx.load(str(model_path))
    existing = {o.name for o in model.graph.output}
    for name in names:
        if name not in existing:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    onnx.save(model, str(out))
    return out


@dataclass(frozen=True)
class Sqnr:
    data: object           # DataSplit: the evaluation samples (the subset indexes them)
    subset: tuple
    hardware: object = field(metadata=CHECKS_ONLY)  # runs its checks: not in the key
    batches: int = 4
    name = "sqnr"
    version = 5
    hardware_dependent = False

    def run(self, parent, out_dir: Path, fp32) -> dict:
        import onnx
        import onnxruntime as ort

        from pipeline.models import task

        t = task(self.data.task)
        ds = t.dataset(self.data)
        ds = ds.select(list(self.subset))
        graph = onnx.load(str(parent.model), load_external_data=False).graph
        precision = parent.meta["precision"]
        # node name -> its first output, which both models share (the quantizer keeps names).
        # What the next layer sees of a quantized node's output: the DequantizeLinear after the
        # QuantizeLinear of that tensor (which also clamps, e.g. a ReLU folded into the range).
        consumers: dict[str, list] = {}
        for n in graph.node:
            for i in n.input:
                consumers.setdefault(i, []).append(n)

        def seen_downstream(tensor: str) -> str:
            for q in consumers.get(tensor, []):
                if q.op_type == "QuantizeLinear":
                    for dq in consumers.get(q.output[0], []):
                        if dq.op_type == "DequantizeLinear":
                            return dq.output[0]
            return tensor

        produced = {o for n in graph.node for o in n.output}
        tensors, reference = {}, {}
        for n in graph.node:
            name = n.name[:-len("_quant")] if n.name.endswith("_quant") else n.name
            if precision.get(name, "float").startswith("int8"):
                # The quantizers rename some outputs: <t>_QuantizeLinear_Input (a graph output's
                # producer), <t>_output_quantized (an integer MatMul whose float result keeps
                # the name <t>). The float model still calls the tensor <t>.
                ref = n.output[0].removesuffix("_QuantizeLinear_Input").removesuffix("_output_quantized")
                reference[name] = ref
                tensors[name] = ref if ref in produced and ref != n.output[0] and \
                    n.output[0].endswith("_output_quantized") else seen_downstream(n.output[0])
        float_graph = onnx.load(str(fp32.model), load_external_data=False).graph
        known = {o for n in float_graph.node for o in n.output}
        tensors = {k: v for k, v in tensors.items() if reference[k] in known}
        reference = {k: reference[k] for k in tensors}
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        ref_names, q_names = sorted(set(reference.values())), sorted(set(tensors.values()))
        sessions = [ort.InferenceSession(str(_with_outputs(p, names, out_dir / f"{tag}.onnx")), so,
                                         providers=[self.hardware.provider])
                    for tag, p, names in (("float", fp32.model, ref_names),
                                          ("int8", parent.model, q_names))]
        signal = dict.fromkeys(tensors, 0.0)
        noise = dict.fromkeys(tensors, 0.0)
        for k, (_, feeds, _) in enumerate(t.batches(ds, 32)):
            if k == self.batches:
                break
            outs = []
            for sess in sessions:
                wanted = [o.name for o in sess.get_outputs()]
                outs.append(dict(zip(wanted, sess.run(None, feeds))))
            for node in tensors:
                a, b = reference[node], tensors[node]
                if a in outs[0] and b in outs[1] and outs[0][a].shape == outs[1][b].shape:
                    x = outs[0][a].astype(np.float64)
                    signal[node] += float(np.sum(x * x))
                    noise[node] += float(np.sum((x - outs[1][b]) ** 2))
        for tag in ("float", "int8"):
            (out_dir / f"{tag}.onnx").unlink()
        result = {}
        for node in tensors:
            s, n = signal[node], noise[node]
            # None: no measurable error (or no signal); JSON has no infinity.
            result[node] = 10 * math.log10(s / n) if n > 0 and s > 0 else None
        return {"sqnr_db": result}
