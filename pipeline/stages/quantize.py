"""quantize: INT8 from the prepared float model: static QDQ where it pays, dynamic where asked.

In: a ``prepare`` artifact, the ``calibrate`` artifact (activation ranges), the resolved settings
(types, ``reduce_range``, per-channel), which op types go static and which dynamic, and which nodes
stay float. Out: ``model.onnx`` and, per node, the precision it ended in. onnxruntime.quantization
does the work: ``quantize_static`` with the cached ranges (``calibration_cache_path``: nothing is
re-calibrated here), then ``quantize_dynamic`` for the dynamic op types (LSTM, MatMul, Gemm: their
activations are quantized per call, so they need no calibration). Typed settings map to
onnxruntime's options in exactly one function, ``_static_options``.
Deliberately not handled here: which nodes to keep float (the recipe decides, from profiling and
sensitivity) and accuracy checks (the evaluate stage).
"""
from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import StageError
from pipeline.quant.defaults import Int8Settings
from pipeline.runtimes.ops import DYNAMIC_INT8_OPS, NAMED_OPS, NO_INT8_KERNEL
from pipeline.stages._parity import node_counts

RECURRENT = ("LSTM", "GRU")  # dynamic op types whose weights stay per tensor



def _static_options(s: dict, per_channel: bool, method: str) -> dict:
    from onnxruntime.quantization import QuantFormat, QuantType

    from pipeline.quant.calibration import ort_method

    types = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    return {"quant_format": QuantFormat.QDQ, "per_channel": per_channel,
            "reduce_range": s["reduce_range"], "weight_type": types[s["weight_type"]],
            "activation_type": types[s["activation_type"]], "calibrate_method": ort_method(method),
            "extra_options": {"WeightSymmetric": True, "ActivationSymmetric": False}}


def precisions(model_path: Path) -> dict[str, str]:
    """Per compute node: 'int8-static' (fed only by DequantizeLinear), 'int8-dynamic', or 'float'."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    from_dq = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    to_q = {i for n in graph.node if n.op_type == "QuantizeLinear" for i in n.input}
    out = {}
    for n in graph.node:
        if n.op_type in DYNAMIC_INT8_OPS:
            # The dynamic quantizer renames the node <name>_quant; report (and exclude) it by
            # the name it has in the float model.
            out[n.name[:-len("_quant")] if n.name.endswith("_quant") else n.name] = "int8-dynamic"
        elif n.op_type in NAMED_OPS:
            # Static INT8 = every input dequantized *and* a quantized output: the pattern the
            # CPU provider fuses into one QLinear kernel. Anything else computes in float, e.g.
            # a Mul kept float between a DequantizeLinear and a float HardSigmoid.
            inputs = [i for i in n.input if i]
            quantized = (n.op_type not in NO_INT8_KERNEL and bool(inputs)
                         and all(i in from_dq for i in inputs) and any(o in to_q for o in n.output))
            out[n.name] = "int8-static" if quantized else "float"
    return out


def _keep_float_regions(model: Path) -> list[str]:
    """Tell ONNX Runtime, in the model's own metadata, to leave its QDQ propagation off.

    With nodes kept float, the quantizer puts the Q after a float Conv -> Relu -> MaxPool run;
    ONNX Runtime's QDQPropagationTransformer then hoists that Q above the MaxPool, which leaves a
    uint8 MaxPool in NCHW layout on a generic kernel. Measured on the OCR model at batch 8, with
    the first conv float: that MaxPool alone took 2.15 ms (0.09 ms as a float NCHWc pool) and made
    the model slower than all-INT8 (12.0 vs 8.7 ms, 1 thread); with propagation off it ran 7.9 ms.
    On the all-INT8 model the setting made no difference (8.73 vs 8.74 ms)."""
    import onnx

    from pipeline.runtimes.onnxruntime import DISABLED_OPTIMIZERS

    names = ["QDQPropagationTransformer"]
    m = onnx.load(str(model))
    onnx.helper.set_model_props(m, {**{p.key: p.value for p in m.metadata_props},
                                    DISABLED_OPTIMIZERS: ",".join(names)})
    onnx.save(m, str(model))
    return names


def _finite_scales(model: Path) -> None:
    """Every scale the quantized model uses is finite and positive: a calibration range that is
    not (a tensor that reached inf) would make its Q/DQ produce NaN for every input."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model), load_external_data=False)
    # scales are small and stored inline; a tensor kept in an external file is a weight
    inits = {i.name: i for i in m.graph.initializer
             if i.data_location != onnx.TensorProto.EXTERNAL}
    for node in m.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 1 \
                and node.input[1] in inits:
            scale = numpy_helper.to_array(inits[node.input[1]])
            if not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
                raise StageError(f"{node.name or node.input[0]}: its scale is "
                                 f"{scale.ravel()[:4]}, not finite and positive: the "
                                 f"calibration range of {node.input[0]} is unusable; "
                                 "exclude the node (quant.exclude)")


@dataclass(frozen=True)
class Quantize:
    settings: Int8Settings   # resolved from the CPU's flags (pipeline.quant.defaults)
    per_channel: bool
    method: str              # must equal the calibration's; "none" for dynamic INT8
    static_op_types: tuple | None   # None: every op type the static quantizer supports
    dynamic_op_types: tuple
    exclude: tuple = ()      # node names kept float
    name = "quantize"
    version = 15  # 15: ... and so does every node between it and the output (NMS-free heads);
    #             14: an output Concat of very different ranges stays float (joined_outputs);
    #             13: no quantize_dynamic pass for op types the graph lacks;
    #             12: the residual sums and norms of pipeline.stages.norms stay float;
    #             11: nodes on a masking sentinel stay float (pipeline.quant.mask_nodes);
    #             10: index computations stay float (pipeline.quant.index_nodes);
    #              9: dynamic weights per channel (but recurrent ones); 8: QDQ propagation is
    #              switched off only for a node really kept float
    hardware_dependent = False

    def run(self, parent, out_dir: Path, calibration=None) -> dict:
        import logging

        from onnx import TensorProto
        from onnxruntime.quantization import QuantType, quantize_dynamic, quantize_static

        # quantize_dynamic warns "already quantized" on our QDQ model: that is the plan here.
        logging.getLogger().setLevel(logging.ERROR)
        s = dataclasses.asdict(self.settings)
        target = out_dir / "model.onnx"
        staged = out_dir / "static.onnx"
        import onnx

        from pipeline.quant.index_nodes import index_nodes
        from pipeline.quant.joined_outputs import joined_outputs
        from pipeline.quant.mask_nodes import calibrated_ranges, mask_nodes
        from pipeline.stages.norms import residual_nodes

        graph = onnx.load(str(parent.model), load_external_data=False)
        # float ops that compute integer positions (MPNet's relative buckets): never Q/DQ'd
        indices = index_nodes(graph)
        # nodes on an attention-mask sentinel (-3.4e38 + scores): one scale would zero the scores
        ranges = (calibrated_ranges(calibration.path / "calibration.json")
                  if calibration is not None else {})
        masks = [n for n in mask_nodes(graph, ranges) if n not in indices]
        # an output joined from tensors of very different ranges (a detector's boxes and scores)
        joined = [n for n in joined_outputs(graph, ranges) if n not in indices and n not in masks]
        # the residual stream the norms stage made flat: float, as inside SkipLayerNormalization
        residual = [n for n in residual_nodes(graph) if n not in {*indices, *masks, *joined}]
        try:
            if self.static_op_types is None or self.static_op_types:
                if calibration is None:
                    raise StageError("static quantization needs a calibration artifact")
                # The cache holds ranges of tensors left float too: MPNet's relative-position
                # buckets take a log of 0 (-inf), and onnxruntime computes a zero point for them
                # all the same, warning on stderr. Those are never used; the scales that are
                # used are checked below (_finite_scales).
                with np.errstate(invalid="ignore", divide="ignore"):
                    quantize_static(str(parent.model), str(staged), None,
                                    op_types_to_quantize=list(self.static_op_types) if self.static_op_types else None,
                                    nodes_to_exclude=list(dict.fromkeys([*self.exclude, *indices, *masks, *joined, *residual])),
                                    calibration_cache_path=str(calibration.path / "calibration.json"),
                                    **_static_options(s, self.per_channel, self.method))
            else:
                shutil.copyfile(parent.model, staged)
            # Weights per output channel as in static INT8 (``per_channel``): with one scale per
            # tensor, a pretrained encoder's MatMuls read mean cosine 0.68 against FP32, per
            # channel 0.87 (all-mpnet-base-v2). Recurrent weights stay per tensor, as measured
            # for the OCR models' LSTM; each group is its own quantize_dynamic call.
            # Only groups whose op types the graph holds: quantize_dynamic rewrites every Gemm as
            # MatMul + Add (renamed <gemm>_MatMul / _Add) even when it quantizes nothing, and the
            # float-node edits then find no float weight under those names.
            present = [o for o in self.dynamic_op_types if o in {n.op_type for n in graph.graph.node}]
            groups = [g for g in ([o for o in present if o not in RECURRENT],
                                  [o for o in present if o in RECURRENT]) if g]
            for k, ops in enumerate(groups):
                src, dst = staged, target if k == len(groups) - 1 else out_dir / f"dynamic{k}.onnx"
                quantize_dynamic(str(src), str(dst), op_types_to_quantize=ops,
                                 nodes_to_exclude=list(self.exclude), weight_type=QuantType.QInt8,
                                 per_channel=self.per_channel and ops[0] not in RECURRENT,
                                 reduce_range=s["reduce_range"],
                                 extra_options={"DefaultTensorType": TensorProto.FLOAT})
                src.unlink()
                staged = dst
            if not groups:
                staged.rename(target)
        except Exception as e:  # noqa: BLE001 - re-raised with what was being done
            raise StageError(f"onnxruntime quantization failed ({self.method} ranges, static "
                             f"{self.static_op_types or 'all'}, dynamic {list(self.dynamic_op_types)}): "
                             f"{type(e).__name__}: {e}") from None
        _finite_scales(target)
        for leftover in out_dir.glob("*.data"):
            leftover.unlink()
        nodes = node_counts(target)
        precision = precisions(target)
        # Propagation off only when a node was really kept float: an excluded name that is not a
        # node, or a node that stayed INT8 anyway, must not cost the all-INT8 model its fast pools.
        floated = [n for n in self.exclude if precision.get(n) == "float"]
        disabled = _keep_float_regions(target) if floated else []
        # onnxruntime honours an exclusion only for nodes it would quantize themselves: a
        # weightless node (MaxPool) between INT8 neighbours keeps their Q/DQ pair around it and
        # still runs in INT8. Say so, so that nobody reports such a node as float.
        ignored = sorted(n for n in self.exclude if precision.get(n, "float").startswith("int8"))
        return {"nodes": nodes,
                "calibration_set": calibration.meta["calibration_set"] if calibration else None,
                "calibration": self.method, "settings": s, "excluded": list(self.exclude),
                "index_nodes": indices, "mask_nodes": masks, "joined_outputs": joined,
                "residual_nodes": residual,
                "exclusion_ignored": ignored, "precision": precision,
                "onnxruntime_disabled_optimizers": disabled, "qdq_pairs": nodes.get("QuantizeLinear", 0)}
