"""norms: residual LayerNorms as ``Add`` + ``LayerNormalization`` on 2-D rows, where that is faster
on the target than ONNX Runtime's fused ``SkipLayerNormalization``.

Why: a transformer's residual sums (``LayerNorm(x + sublayer(x))``) are fused by
onnxruntime.transformers offline, and by ONNX Runtime itself when it loads the graph, into one
``SkipLayerNormalization``. That kernel is not fast everywhere: with onnxruntime 1.32 on an AMD
EPYC (Zen 5, AVX512, 2 threads) it took 7x as long as ``Add`` + ``LayerNormalization`` on the same
``[8, 40, 768]`` rows (537 vs 76 us), and on all-mpnet-base-v2's dynamic INT8 its 25 nodes were
a fifth of the run. Left as ``Add`` + ``LayerNormalization`` on 3-D tensors, the runtime fuses them
again at load; on ``[rows, hidden]`` it does not (its fusion takes 3-D sums only), so the rewrite
holds in any session, not only the pipeline's.

The rewrite, per residual LayerNorm over the last axis: ``SkipLayerNormalization(x, skip, gamma,
beta, bias)``, or a ``LayerNormalization`` whose input is an ``Add`` of two tensors read by nothing
else, becomes ``Reshape(x, [-1, H])`` and ``Reshape(skip, [-1, H])``, their ``Add`` (and the bias),
``LayerNormalization`` with the same epsilon, and a ``Reshape`` back to ``x``'s shape (a Reshape
moves no data). The decision is measured, not assumed: both forms timed on the target on a
synthetic ``[8, 64, H]`` batch (``faster``); the flat form only when its whole 95 % interval is
above ``MIN_GAIN``. The rewritten graph must reproduce the parent's outputs, or the parent is kept
and the record says why.

In (stage ``Norms``): an ONNX artifact. Out: ``model.onnx`` (rewritten or the parent's), the count,
the timing and the parity.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.engine.runner import CHECKS_ONLY
from pipeline.stages.attention import TOLERANCE  # the fuse stage's own parity tolerance
from pipeline.stages._parity import compare, node_counts

MIN_GAIN = 1.1      # the flat form's speedup must be clearly there: a few Reshapes are not free
PROBE_SHAPE = (8, 64)  # batch, sequence of the timed synthetic rows


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _broadcast_adds(model) -> set[str]:
    """Outputs of the Adds whose two operands shape inference shows to differ: a broadcast sum,
    such as ALBERT's word embeddings [batch, seq, E] plus position embeddings [1, seq, E], which
    rows of [-1, E] would no longer line up (the runtime refused the rewrite there, and every
    residual norm of the model was kept fused with it). Unknown shapes are not a difference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - no shapes (a model past 2 GB, a custom op): none known
        return set()

    def dims(v):
        t = v.type.tensor_type
        if not t.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0  # -1: dynamic
                else (d.dim_param or None)
                for d in t.shape.dim]

    shapes = {v.name: dims(v) for v in [*inferred.input, *inferred.value_info, *inferred.output]}
    out = set()
    for n in inferred.node:
        if n.op_type == "Add" and len(n.input) == 2:
            a, b = shapes.get(n.input[0]), shapes.get(n.input[1])
            if a is not None and b is not None and None not in a + b and a != b:
                out.add(n.output[0])
    return out


def _residual_norms(graph, broadcast: set[str] = frozenset()) -> list[tuple]:
    """(kind, node, add or None) for each residual LayerNorm the rewrite applies to; the sums in
    ``broadcast`` (``_broadcast_adds``) are not."""
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    outputs = {o.name for o in graph.output}
    found = []
    for n in graph.node:
        if n.op_type == "SkipLayerNormalization" and n.domain == "com.microsoft":
            if len(n.input) >= 3 and n.input[2] in inits and not any(
                    o and (readers.get(o) or o in outputs) for o in n.output[1:3]):
                found.append(("skip", n, None))
        elif (n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx")
              and _attrs(n).get("axis", -1) == -1 and n.input[1] in inits
              and not any(o for o in n.output[1:])):
            add = producer.get(n.input[0])
            if (add is not None and add.op_type == "Add" and readers.get(add.output[0]) == 1
                    and add.output[0] not in outputs and add.output[0] not in broadcast
                    and not any(i in inits or producer.get(i, add).op_type == "Constant"
                                for i in add.input)):
                found.append(("add", n, add))
    return found


def flatten(model) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``) in place; returns how many norms changed."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    found = _residual_norms(g, _broadcast_adds(model))
    if not found:
        return 0
    replace, drop = {}, set()
    for k, (kind, norm, add) in enumerate(found):
        hidden = int(numpy_helper.to_array(inits[norm.input[2 if kind == "skip" else 1]]).shape[-1])
        p = f"{norm.name or norm.output[0]}{ROWS}"
        rows = numpy_helper.from_array(np.array([-1, hidden], np.int64), f"{p}_shape2d")
        g.initializer.append(rows)
        x, skip = (norm.input[0], norm.input[1]) if kind == "skip" else (add.input[0], add.input[1])
        nodes = [helper.make_node("Shape", [x], [f"{p}_shape"], name=f"{p}_shape"),
                 helper.make_node("Reshape", [x, rows.name], [f"{p}_x"], name=f"{p}_x"),
                 helper.make_node("Reshape", [skip, rows.name], [f"{p}_skip"], name=f"{p}_skip"),
                 helper.make_node("Add", [f"{p}_x", f"{p}_skip"], [f"{p}_sum"], name=f"{p}_add")]
        total = f"{p}_sum"
        if kind == "skip":
            gamma = norm.input[2]
            beta = norm.input[3] if len(norm.input) > 3 else ""
            bias = norm.input[4] if len(norm.input) > 4 else ""
            eps = _attrs(norm).get("epsilon", 1e-12)  # the contrib op's default
            if bias:
                nodes.append(helper.make_node("Add", [total, bias], [f"{p}_biased"], name=f"{p}_bias"))
                total = f"{p}_biased"
            if len(norm.output) > 3 and norm.output[3]:  # the sum itself is read further on
                nodes.append(helper.make_node("Reshape", [total, f"{p}_shape"], [norm.output[3]],
                                              name=f"{p}_sum_back"))
        else:
            gamma = norm.input[1]
            beta = norm.input[2] if len(norm.input) > 2 else ""
            eps = _attrs(norm).get("epsilon", 1e-5)
            drop.add(id(add))
        nodes.append(helper.make_node("LayerNormalization", [total, gamma] + ([beta] if beta else []),
                                      [f"{p}_y"], name=f"{p}_norm", axis=-1, epsilon=float(eps)))
        nodes.append(helper.make_node("Reshape", [f"{p}_y", f"{p}_shape"], [norm.output[0]],
                                      name=f"{p}_back"))
        replace[id(norm)] = nodes
    # each rewrite where its norm stood: its inputs exist there (the Add came earlier)
    order = []
    for n in g.node:
        if id(n) in drop:
            continue
        order.extend(replace.get(id(n), [n]))
    del g.node[:]
    g.node.extend(order)
    if not any(o.domain in ("", "ai.onnx") and o.version >= 17 for o in model.opset_import):
        raise ValueError("LayerNormalization needs opset 17 or later")
    return len(found)


ROWS = "_rows"  # every node the rewrite adds is named <norm>_rows_<part>


def residual_nodes(graph) -> list[str]:
    """The nodes a rewrite added: the residual stream's sums and norms, float in every INT8
    mode as they were inside SkipLayerNormalization (one per-tensor scale on a pretrained
    encoder's residual stream, whose outlier channels reach 50x the median, loses it)."""
    graph = getattr(graph, "graph", graph)  # a ModelProto or its graph
    return [n.name for n in graph.node if f"{ROWS}_" in n.name
            and n.op_type in ("Add", "LayerNormalization", "Reshape", "Shape")]


def _probe_models(hidden: int):
    """A SkipLayerNormalization and its flat rewrite, as serialized models on [batch, seq, hidden]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    vi = helper.make_tensor_value_info
    gamma = numpy_helper.from_array(np.ones(hidden, np.float32), "gamma")
    beta = numpy_helper.from_array(np.zeros(hidden, np.float32), "beta")
    graph = helper.make_graph(
        [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"],
                          domain="com.microsoft", epsilon=1e-5)], "probe",
        [vi("x", TensorProto.FLOAT, ["batch", "seq", hidden]),
         vi("skip", TensorProto.FLOAT, ["batch", "seq", hidden])],
        [vi("y", TensorProto.FLOAT, None)], [gamma, beta])
    fused = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    flat = onnx.ModelProto()
    flat.CopyFrom(fused)
    flatten(flat)
    return fused.SerializeToString(), flat.SerializeToString()


def faster(hidden: int, hardware, max_seconds: float = 3.0) -> dict:
    """The flat form's speedup over SkipLayerNormalization on the target (median of per-round
    ratios, 95 % interval), both run as the pipeline runs every model."""
    import onnxruntime as ort

    from pipeline.measure import timing
    from pipeline.runtimes.onnxruntime import _options

    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((*PROBE_SHAPE, hidden)).astype(np.float32) for n in ("x", "skip")}
    sessions = {k: ort.InferenceSession(m, _options(hardware), providers=[hardware.provider])
                for k, m in zip(("skip", "flat"), _probe_models(hidden))}
    fns = {k: (lambda s: lambda x: s.run(None, x))(s) for k, s in sessions.items()}
    times, info = timing.head_to_head(fns, [feeds], [("skip", "flat")], 30, max_seconds, 0.02)
    return {"flat_over_skip": timing.ratio_ci(times["skip"], times["flat"]),
            "ms": {k: float(np.median(v)) for k, v in times.items()},
            "shape": [*PROBE_SHAPE, hidden], "rounds": info.get("rounds")}


def flattened_if_faster(src: Path, target: Path, task, ds, hardware, speed=None) -> dict:
    """``target``: ``src`` with its residual norms flat when that is faster here and changes no
    output, else ``src``'s graph; the record says which and why. ``speed(hidden, hardware)``:
    the timing (default ``faster``; the tests inject theirs)."""
    import onnx

    from pipeline.runtimes import onnxruntime as ort

    model = onnx.load(str(src))
    found = _residual_norms(model.graph, _broadcast_adds(model))
    record = {"flattened": 0, "candidates": len(found), "timing": None, "why_not": None,
              "parity": None}
    if not found:
        record["why_not"] = "no residual LayerNorm"
    else:
        inits = {t.name: t for t in model.graph.initializer}
        kind, norm, _ = found[0]
        hidden = int(inits[norm.input[2 if kind == "skip" else 1]].dims[-1])
        record["timing"] = (speed or faster)(hidden, hardware)
        low = record["timing"]["flat_over_skip"]["ci95"][0]
        if low <= MIN_GAIN:
            record["why_not"] = (f"SkipLayerNormalization is as fast here (flat form "
                                 f"{record['timing']['flat_over_skip']['median']:.2f}x, 95 % "
                                 f"interval from {low:.2f}, needs > {MIN_GAIN})")
    if record["why_not"] is None:
        try:
            n = flatten(model)
            big = model.ByteSize() > 1_900_000_000  # past protobuf's 2 GB limit: weights beside it
            onnx.save(model, str(target), save_as_external_data=big,
                      location=target.name + ".data" if big else None)
            before, after = ort.session(src, hardware), ort.session(target, hardware, probe=True)
            record["parity"] = compare(lambda x: ort.run(before, x), lambda x: ort.run(after, x),
                                       task, ds)
        except Exception as e:  # noqa: BLE001 - the runtime refused the rewrite: keep src's
            record["why_not"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        else:
            p = record["parity"]
            # by the largest difference alone: the rewrite only reorders float sums, and a
            # decoded output that rounds values (a user's ONNX file) flips on a 1e-7 change
            if p["max_abs_diff"] > TOLERANCE:
                record["why_not"] = f"outputs differ from the fused graph's (max |diff| {p['max_abs_diff']:.2e})"
            else:
                record["flattened"] = n
    if not record["flattened"]:
        shutil.copyfile(src, target)
    return record


@dataclass(frozen=True)
class Norms:
    data: object           # DataSplit: the samples parity is checked on
    hardware: object = field(metadata=CHECKS_ONLY)  # the machine's fingerprint keys the timing
    name = "norms"
    version = 2  # 2: broadcast sums are not rewritten
    hardware_dependent = True  # the choice is a timing on this machine

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline.models import task

        t = task(self.data.task)
        record = flattened_if_faster(parent.model, out_dir / "model.onnx", t,
                                     t.dataset(self.data), self.hardware)
        return {**record, "nodes": node_counts(out_dir / "model.onnx")}
