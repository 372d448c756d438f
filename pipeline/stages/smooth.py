"""channel_ranges and smooth: outlier channels of the activations moved into the weights
(SmoothQuant-style migration) before INT8.

Why: a pretrained transformer's LayerNorm and GELU outputs carry a few hidden channels tens of
times larger than the rest (measured on all-mpnet-base-v2: the largest channel 16-42x the median
one after each attention LayerNorm, 10-35x after GELU). INT8 activations get one scale per tensor
(dynamic INT8 computes it per call, static INT8 from calibration), so those few channels set the
step and every other channel keeps 3-5 bits: mean cosine 0.87 against FP32 with per-channel
weights. The product ``X @ W`` is unchanged when channel ``j`` of ``X`` is divided by ``s_j`` and
row ``j`` of ``W`` multiplied by it; with ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` the
activation's channels even out and the weights, quantized per output channel, take part of the
spread. ``alpha`` trades one against the other; the INT8 sub-recipe tries a few and keeps the
best on the ranking subset, or none (``pipeline.recipes.int8.smoothing``).

In (``channel_ranges``): a ``prepare`` artifact and the calibration split. Out: ``ranges.npz``,
the largest absolute value of each channel of every activation that feeds a weighted MatMul
(padded positions included, as in calibration), and each one's outlier ratio (largest channel
over the median channel). In (``smooth``): the same ``prepare`` artifact, those ranges and
``alpha``. Out: ``model.onnx`` with one ``Mul`` by ``1/s`` per such activation whose outlier
ratio reaches ``MIN_OUTLIER_RATIO`` (an even one is left alone: no bits to gain, a Mul to
pay), shared by every MatMul it feeds (Q, K and V read one LayerNorm output, so they share
``s``, taken over all their weights), and the weights' rows multiplied by ``s``; in FP32 the model computes the same function
(parity is the evaluation's business: the recipe scores every smoothed model).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# An activation whose largest channel is within this factor of its median one is even (1-4x
# measured on even activations): smoothing it gains no bits and costs a Mul on every call.
MIN_OUTLIER_RATIO = 5.0
SUFFIX = "_smoothed"  # the Mul's output: <activation>_smoothed; the Mul is named <activation>_smooth


def smoothable(model) -> dict[str, list[str]]:
    """Activation -> the MatMul nodes it feeds whose other input is a 2-D float weight
    (a ``Linear``): the token-wise layers of a transformer. Weights must not be shared with
    another node (its rows would be scaled for one input only)."""
    import onnx

    graph = model.graph if hasattr(model, "graph") else onnx.load(
        str(model), load_external_data=False).graph
    weights = {t.name: t for t in graph.initializer
               if len(t.dims) == 2 and t.data_type == onnx.TensorProto.FLOAT}
    uses: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    groups: dict[str, list[str]] = {}
    for n in graph.node:
        if (n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in weights
                and n.input[0] not in weights and uses[n.input[1]] == 1):
            groups.setdefault(n.input[0], []).append(n.name)
    return groups


def outlier_ratio(absmax: np.ndarray) -> float:
    """Largest channel over the median channel: about 1-4 for an even activation."""
    return float(absmax.max() / max(float(np.median(absmax)), 1e-12))


def scales(absmax: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """Per input channel ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)``, over every weight
    the activation feeds (rows are input channels). Channels that never fire keep 1."""
    wmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
    s = np.power(np.maximum(absmax, 1e-5), alpha) / np.power(np.maximum(wmax, 1e-5), 1 - alpha)
    return np.where(absmax > 0, s, 1.0).astype(np.float32)


def migrate(src: Path, ranges: dict[str, np.ndarray], alpha: float, target: Path) -> dict:
    """``src`` with every smoothable activation in ``ranges`` divided by its scales and the
    weights it feeds multiplied by them; returns per activation its outlier ratio before and after."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    groups = {a: ns for a, ns in smoothable(model).items()
              if a in ranges and outlier_ratio(ranges[a]) >= MIN_OUTLIER_RATIO}
    nodes = {n.name: n for n in graph.node}
    muls, record = {}, {}
    for act, names in groups.items():
        ws = [numpy_helper.to_array(inits[nodes[n].input[1]]) for n in names]
        if any(w.shape[0] != ranges[act].shape[0] for w in ws):
            continue  # not a channel-wise product of this activation: left alone
        s = scales(ranges[act], ws, alpha)
        for n, w in zip(names, ws):
            name = nodes[n].input[1]
            inits[name].CopyFrom(numpy_helper.from_array((w * s[:, None]).astype(np.float32), name))
            nodes[n].input[0] = act + SUFFIX
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32), act + "_smooth_scale")
        graph.initializer.append(inv)
        muls[act] = helper.make_node("Mul", [act, inv.name], [act + SUFFIX], name=act + "_smooth")
        for vi in [v for v in graph.value_info if v.name == act]:  # the quantizer reads its type
            twin = graph.value_info.add()
            twin.CopyFrom(vi)
            twin.name = act + SUFFIX
        record[act] = {"nodes": names, "outlier_ratio": round(outlier_ratio(ranges[act]), 2),
                       "outlier_ratio_after": round(outlier_ratio(ranges[act] / s), 2)}
    # each Mul right before the first node that reads it: the graph stays topologically sorted
    order = []
    for n in list(graph.node):
        for i in n.input:
            if i.endswith(SUFFIX) and i[:-len(SUFFIX)] in muls:
                order.append(muls.pop(i[:-len(SUFFIX)]))
        order.append(n)
    del graph.node[:]
    graph.node.extend(order)
    big = model.ByteSize() > 1_900_000_000  # past protobuf's 2 GB limit: weights beside it
    onnx.save(model, str(target), save_as_external_data=big,
              location=target.name + ".data" if big else None)
    return record


@dataclass(frozen=True)
class ChannelRanges:
    data: object           # DataSplit: the calibration samples
    batch_size: int
    name = "channel_ranges"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        import tempfile

        import onnx
        import onnxruntime as ort

        from pipeline.models import task

        acts = sorted(smoothable(parent.model))
        if not acts:
            np.savez(out_dir / "ranges.npz")
            return {"activations": 0, "samples": 0, "outlier_ratio": {}}
        model = onnx.load(str(parent.model))
        known = {o.name for o in model.graph.output}
        for a in acts:
            if a not in known:
                model.graph.output.append(onnx.helper.make_tensor_value_info(
                    a, onnx.TensorProto.FLOAT, None))
        t = task(self.data.task)
        ds = t.dataset(self.data)
        absmax: dict[str, np.ndarray] = {}
        with tempfile.TemporaryDirectory() as tmp:  # the runner puts it inside out_dir
            aug = Path(tmp) / "augmented.onnx"
            onnx.save(model, str(aug), save_as_external_data=True, location="augmented.data")
            del model
            sess = ort.InferenceSession(str(aug), providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            for batch in t.batches(ds, self.batch_size, sort=False, bounded=True):
                out = dict(zip(names, sess.run(names, batch.feeds)))
                for a in acts:
                    x = np.abs(out[a].reshape(-1, out[a].shape[-1])).max(axis=0)
                    absmax[a] = x if a not in absmax else np.maximum(absmax[a], x)
            del sess
        np.savez(out_dir / "ranges.npz", **{f"r{k}": absmax[a] for k, a in enumerate(acts)},
                 names=np.array(acts))
        return {"activations": len(acts), "samples": len(ds),
                "outlier_ratio": {a: round(outlier_ratio(absmax[a]), 2) for a in acts}}


def load_ranges(path: Path) -> dict[str, np.ndarray]:
    with np.load(path / "ranges.npz") as z:
        if "names" not in z:
            return {}
        return {str(a): z[f"r{k}"] for k, a in enumerate(z["names"])}


@dataclass(frozen=True)
class Smooth:
    alpha: float           # migration strength: 0 moves nothing into the weights' scale, 1 all
    name = "smooth"
    version = 2  # 2: even activations (outlier ratio < MIN_OUTLIER_RATIO) are left alone
    hardware_dependent = False

    def run(self, parent, out_dir: Path, ranges=None) -> dict:
        if ranges is None:
            from pipeline.core.errors import StageError

            raise StageError("smooth needs a channel_ranges artifact")
        record = migrate(parent.model, load_ranges(ranges.path), self.alpha, out_dir / "model.onnx")
        return {"alpha": self.alpha, "smoothed": record}
