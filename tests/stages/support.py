"""What the stage tests share: a tiny ONNX graph as a user's model with its data (the task the
stages read), and an artifact around a model file, as the runner would hand it to a stage."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


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


def split(tmp: Path, model: Path, rows: np.ndarray, which: str = "evaluation", column: str = "x"):
    """A ``DataSplit`` of half of ``rows`` (one input row each) for ``model`` as a user's ONNX file
    scored by agreement with FP16 (no labels)."""
    from pipeline.config import ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.models import task
    from pipeline.models.sources import task_key

    data = tmp / "rows.jsonl"
    data.write_text("".join(json.dumps({column: r}) + "\n" for r in np.asarray(rows).round(5).tolist()))
    n = len(rows) // 2  # half calibrate, half evaluate (the two never overlap)
    key = task_key(ModelConfig(name="onnx", path=str(model)),
                   DataConfig(format="jsonl", path=str(data), input_column=column,
                              calibration_samples=n, evaluation_samples=n),
                   MetricConfig(name="agreement"), data_dir=str(tmp / "data"))
    return task(key).split(which, n, str(tmp / "data"))


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
