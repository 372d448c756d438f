"""What the stage tests share: a tiny ONNX graph as a user's model with its data (the task the
stages read), a tiny torch network as a user's factory, and an artifact around a model file, as
the runner would hand it to a stage."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.quant.defaults import Int8Settings


def int8_settings() -> Int8Settings:
    """The INT8 settings the pipeline resolves for the CPU the test runs on (u8 activations, s8
    weights; 7-bit weights without VNNI/AMX), from ``effective_flags``: under the AVX2 cap of the
    ``isa`` fixture's child run they are an AVX2 machine's. Not fixed full-range weights: ONNX
    Runtime's u8 x s8 kernels (MLAS, which dispatches on cpuid, not on the caps) multiply those
    exactly only with VNNI/AMX and saturate 16-bit sums on AVX2, so an expectation measured with
    them on a VNNI machine fails on an AVX2 one. With these settings every class computes
    exactly, and the same expectations hold everywhere (docs/cpus.md)."""
    from pipeline.config import QuantConfig
    from pipeline.core.env import effective_flags
    from pipeline.quant.defaults import resolve

    return resolve(QuantConfig(), effective_flags())


# The stage tests' static/dynamic INT8 settings: this CPU's (or the cap's), as the recipe's.
INT8 = int8_settings()

def save(path: Path, nodes: list, inputs: list, outputs: list, initializers: list = (),
         opset: int = 17) -> Path:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def linear_graph(path: Path, weights: dict[str, np.ndarray], chain: list[tuple[str, str]],
                 width: int) -> Path:
    """x [batch, width] through the MatMul/Relu/... nodes of ``chain`` ((op, weight name or ""),
    in order); one output ``y``."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, prev = [], "x"
    for k, (op, w) in enumerate(chain):
        out = "y" if k == len(chain) - 1 else f"t{k}"
        nodes.append(helper.make_node(op, [prev, w] if w else [prev], [out], name=f"{op.lower()}{k}"))
        prev = out
    out_width = weights[[w for _, w in chain if w][-1]].shape[1]
    return save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_width])],
                [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])


def mlp_graph(folder: Path, rng, width: int, hidden: int, out: int) -> Path:
    """``folder``/model.onnx: x [batch, width] -> MatMul W1 -> Relu -> MatMul W2 -> y [batch, out],
    weights drawn from ``rng`` (W1, then W2); nodes named matmul0, relu1, matmul2."""
    folder.mkdir()
    return linear_graph(folder / "model.onnx", {"W1": rng.standard_normal((width, hidden)),
                                                "W2": rng.standard_normal((hidden, out))},
                        [("MatMul", "W1"), ("Relu", ""), ("MatMul", "W2")], width=width)


def split(tmp: Path, model: Path, rows: np.ndarray, which: str = "evaluation", column: str = "x"):
    """A ``DataSplit`` of half of ``rows`` (one input row each) for ``model`` as a user's ONNX file
    scored by agreement with FP16 (no labels)."""
    from pipeline.config import ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.models import task
    from pipeline.models.sources import task_key

    data = rows_file(tmp, rows, column)
    n = len(rows) // 2  # half calibrate, half evaluate (the two never overlap)
    key = task_key(ModelConfig(name="onnx", path=str(model)),
                   DataConfig(format="jsonl", path=str(data), input_column=column,
                              calibration_samples=n, evaluation_samples=n),
                   MetricConfig(name="agreement"), data_dir=str(tmp / "data"))
    return task(key).split(which, n, str(tmp / "data"))


def rows_file(tmp: Path, rows, column: str = "x", labels=None) -> Path:
    """``rows`` (one model input each, and a ``label`` each where given) as a JSON Lines file."""
    lines = [{column: r} for r in np.asarray(rows).round(5).tolist()]
    for line, label in zip(lines, labels if labels is not None else []):
        line["label"] = int(label)
    path = tmp / "rows.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def mlp(width: int = 6, classes: int = 3):
    """The torch factory of the load and export tests (``tests.stages.support:mlp``)."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, classes))


def torch_key(tmp: Path, rows, checkpoint: Path | None = None):
    """The task key of ``mlp`` as a user's torch model (input ``x`` [batch, 6]) on ``rows``,
    scored by agreement with FP16 (no labels)."""
    from pipeline.config import ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.models.sources import task_key

    n = len(rows) // 2
    return task_key(ModelConfig(source="torch", name="mlp", factory="tests.stages.support:mlp",
                                checkpoint=str(checkpoint) if checkpoint else None,
                                inputs={"x": ["batch", 6]}),
                    DataConfig(format="jsonl", path=str(rows_file(tmp, rows)), input_column="x",
                               calibration_samples=n, evaluation_samples=n),
                    MetricConfig(name="agreement"), data_dir=str(tmp / "data"))


def artifact(folder: Path, stage: str = "given", **meta):
    """``folder`` (holding ``model.onnx``) as a stage's parent or reference artifact."""
    from pipeline.core.artifact import Artifact

    return Artifact(path=folder, stage=stage, key=stage, digest=stage, files={}, meta=meta)


def outputs(model: Path, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _run(stage, parent, out_dir: Path, refs: dict) -> dict:
    return stage.run(parent, out_dir, **refs)


def run(stage, parent, out_dir: Path, **refs) -> dict:
    """``stage.run`` in a child process, as the runner runs it: a stage may set process-wide
    state (onnxruntime's global thread pool) that later tests must not inherit."""
    from pipeline.core import isolate

    out_dir.mkdir(parents=True, exist_ok=True)
    return isolate.call(f"stage {stage.name}", _run, stage, parent, out_dir, refs)


def token_graph(path: Path, weights: dict, nodes: list, hidden: int, out_dim: int) -> Path:
    """x [b, t, hidden] through ``nodes`` (the last one's output is the graph's), shapes inferred:
    a transformer's token-wise MatMuls in small."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", hidden])],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT,
                                       ["b", "t", out_dim])],
        [numpy_helper.from_array(w.astype(np.float32), k) for k, w in weights.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(onnx.shape_inference.infer_shapes(m), str(path))
    return path


def sqnr_db(ref: np.ndarray, y: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio of ``y`` against ``ref``, in dB."""
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - y) ** 2).sum(), 1e-30)))


def dynamic_int8(src: Path, out_dir: Path, per_channel: bool = True) -> Path:
    """The recipe's Quantize stage, dynamic MatMul only, with this CPU's settings."""
    from types import SimpleNamespace

    from pipeline.quant.calibration import DYNAMIC
    from pipeline.stages.quantize import Quantize

    out_dir.mkdir()
    Quantize(int8_settings(), per_channel, DYNAMIC, (),
             ("MatMul", "Gemm")).run(SimpleNamespace(model=src), out_dir)
    return out_dir / "model.onnx"


def exact_dynamic_matmul(x: np.ndarray, wq: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """What dynamic INT8 MatMul computes from float ``x`` and the model's quantized weights
    ``wq`` (signed, symmetric) and scales ``ws``, in exact integers: DynamicQuantizeLinear (the
    range [min(x, 0), max(x, 0)] on 0..255, round half to even), then the integer product,
    scaled back. The reference an INT8 kernel must meet up to float32 scaling."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    sx = np.float32((hi - lo) / 255)
    zp = int(np.clip(np.round(-lo / sx), 0, 255))
    xq = np.clip(np.round(x / sx) + zp, 0, 255).astype(np.int64)
    return ((xq - zp) @ wq.astype(np.int64)) * float(sx) * ws.astype(np.float64)


class _Images:
    """Four calibration batches of x [2, 3, 8, 8] for ``static_qdq``."""

    def __init__(self, seed: int = 1):
        self.batches = iter([{"x": np.random.default_rng(seed + k).normal(size=(2, 3, 8, 8))
                              .astype(np.float32)} for k in range(4)])

    def get_next(self):
        return next(self.batches, None)


def static_qdq(src: Path, dst: Path, exclude):
    """onnxruntime's own static QDQ INT8 of a model with input x [N, 3, 8, 8], ``exclude`` float,
    with the settings the recipe uses on this CPU (``int8_settings``: the weight range too): the
    reference an edited QDQ graph is compared with."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(str(src), str(dst), _Images(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8,
                    reduce_range=int8_settings().reduce_range,
                    nodes_to_exclude=sorted(exclude),
                    extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
    return onnx.load(str(dst))


def qdq_scales(model) -> dict:
    """Each Q/DQ node's scale, by node name."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.name: inits[n.input[1]].tolist() for n in model.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] in inits}


def run_unoptimized(model, x: np.ndarray) -> np.ndarray:
    """A ``ModelProto``'s first output for x, without onnxruntime's graph optimizations."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]
