"""A small image classifier for the bring-your-own-model tests: a factory the pipeline imports as
``model.factory=tests.byo_net:small_cnn``, and generated images it learns in seconds.

Classes (16 x 16 RGB, with noise): 0 = horizontal stripes, 1 = vertical stripes, 2 = a bright
square in the middle. ``train`` fits the network on them and saves safetensors; ``to_onnx``
exports the same network at a chosen opset (12 exercises the pipeline's opset upgrade).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

SIZE, CLASSES = 16, 3


def small_cnn(classes: int = CLASSES, width: int = 8) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))


def exits(**params) -> nn.Module:
    """A factory that ends the process, as a script's argument parsing does."""
    raise SystemExit("usage: train.py [-h] --epochs N")


def image(label: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.uniform(0, 60, size=(SIZE, SIZE, 3))
    if label == 0:
        x[::4] += 180
    elif label == 1:
        x[:, ::4] += 180
    else:
        x[5:11, 5:11] += 180
    return np.clip(x, 0, 255).astype(np.uint8)


def write_folder(root: Path, per_class: int, seed: int = 0, labelled: bool = True) -> Path:
    """``root/<class>/<n>.png`` (imagefolder with labels) or ``root/<n>.png`` (no labels)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(CLASSES):
        folder = root / f"class{c}" if labelled else root
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            Image.fromarray(image(c, rng)).save(folder / f"{c}-{k}.png")
    return root


def train(path: Path, steps: int = 60, seed: int = 0) -> Path:
    """A few dozen steps on fresh generated images; saves the weights as safetensors."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed + 100)
    net = small_cnn()
    opt = torch.optim.Adam(net.parameters(), lr=0.02)
    for _ in range(steps):
        labels = rng.integers(0, CLASSES, size=32)
        x = np.stack([image(int(c), rng) for c in labels]).astype(np.float32) / 255.0
        loss = nn.functional.cross_entropy(net(torch.from_numpy(x.transpose(0, 3, 1, 2))),
                                           torch.from_numpy(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_file({k: v.contiguous() for k, v in net.eval().state_dict().items()}, str(path))
    return path


def to_onnx(checkpoint: Path, path: Path, opset: int = 12) -> Path:
    """The trained network as an ONNX file with a dynamic batch (the legacy exporter, which
    writes old opsets, as other teams' files often are)."""
    from safetensors.torch import load_file

    net = small_cnn()
    net.load_state_dict(load_file(str(checkpoint)))
    torch.onnx.export(net.eval(), (torch.zeros(1, 3, SIZE, SIZE),), str(path), dynamo=False,
                      opset_version=opset, input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    return path


def batch_of_one(given: Path, path: Path, rows: int = 0, mixed: bool = False) -> Path:
    """``given`` as a static export writes it: the batch fixed at 1 and the ``Flatten`` a
    ``Reshape`` to the constant ``[1, features]``, so the graph fails at batch 2 (as a
    transformer's baked ``[1, 197, 12, 64]`` or a detector's NMS tail do). ``rows``: the logits
    reshaped to ``[rows, -1]`` instead of ``[1, classes]``, an output without a batch axis.
    ``mixed``: the ``Flatten`` kept and the logits reshaped to ``[1, -1]``: batch 2 runs without
    an error and returns both samples' logits as one row ``[1, 6]`` (a YOLO head's
    ``[1, 82, -1]`` does that to its anchors)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(given))
    g = model.graph
    g.initializer.append(numpy_helper.from_array(np.array([1, -1], np.int64), "baked_shape"))
    if mixed:
        last = g.output[0].name
        for n in g.node:
            n.output[:] = [f"{o}_" if o == last else o for o in n.output]
        g.node.append(helper.make_node("Reshape", [f"{last}_", "baked_shape"], [last]))
    else:
        at = next(k for k, n in enumerate(g.node) if n.op_type == "Flatten")
        flat = g.node[at]
        g.node.remove(flat)
        g.node.insert(at, helper.make_node("Reshape", [flat.input[0], "baked_shape"],
                                           list(flat.output), name="baked_reshape"))
    for v in list(g.input) + list(g.output):
        v.type.tensor_type.shape.dim[0].ClearField("dim_param")
        v.type.tensor_type.shape.dim[0].dim_value = 1
    if rows:
        g.initializer.append(numpy_helper.from_array(np.array([rows, -1], np.int64), "rows"))
        last = g.output[0].name
        for n in g.node:
            n.output[:] = [f"{o}_" if o == last else o for o in n.output]
        g.node.append(helper.make_node("Reshape", [f"{last}_", "rows"], [last]))
        for k, d in enumerate(g.output[0].type.tensor_type.shape.dim):
            d.dim_param = f"d{k}"  # replaces the value: the output is [rows, classes]
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
