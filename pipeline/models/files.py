"""The files a user's model is read from, each inside the folder the user named and in the
model's key: a Hugging Face folder's weights (safetensors only) and the tokenizer files it names,
an ONNX model's external data.

In: the folder or the model file a ``model.path`` names. Out: the files, resolved (``hf_files``,
``external_files``) and the ONNX model's digest over its file and its external data
(``onnx_digest``).
A name that leads out of the folder, or weights that are not safetensors, is one line (exit 2)
before any stage (``pipeline.core.userfiles``, ``pipeline.models.weights``). Called by
``pipeline.models.sources`` when a task key is made, and again by the stages that read the files.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.core import userfiles
from pipeline.core.errors import ConfigError
from pipeline.models import weights


def hf_files(folder: Path, key: str) -> list[Path]:
    """The folder's weights (safetensors only, ``pipeline.models.weights``) and the tokenizer
    files its ``tokenizer_config.json`` names (``fast_tokenizer_files``, which transformers joins
    to the folder unchecked), each refused unless it lies inside the folder. Links out of the
    folder are refused by its digest's walk (``pipeline.core.userfiles``)."""
    found = weights.folder_weights(folder, key)
    try:
        tok = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        tok = {}  # none, or broken: the tokenizer's own loading reports it
    names = tok.get("fast_tokenizer_files") if isinstance(tok, dict) else None
    for name in names if isinstance(names, list) else []:
        if isinstance(name, str):
            found.append(userfiles.inside(folder, name, key, "tokenizer_config.json"))
    return found


def _tensors(graph):
    """Every tensor a graph holds: initializers (sparse ones' values and indices too) and node
    attributes (a Constant's value, tensors of subgraphs), as onnx's external-data loader
    walks them."""
    for t in graph.initializer:
        yield t
    for sp in graph.sparse_initializer:
        yield sp.values
        yield sp.indices
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _tensors(a.g)
            for g in a.graphs:
                yield from _tensors(g)


def external_files(model, path: str | Path) -> dict[str, Path]:
    """The external data files the model names, by the name it gives them, each refused unless
    it lies inside the model's folder (``..``, an absolute path or a link out would read any file
    the process can) and exists."""
    from onnx.external_data_helper import uses_external_data

    folder = Path(path).absolute().parent  # onnx joins locations to the path as given
    found = {}
    for t in _tensors(model.graph):
        if uses_external_data(t):
            loc = next((e.value for e in t.external_data if e.key == "location"), "")
            target = userfiles.inside(folder, loc, f"model.path={path}",
                                      f"tensor {t.name}'s external data")
            if not target.is_file():
                raise ConfigError(f"model.path={path}: tensor {t.name} needs external data "
                                  f"{loc!r}, which is missing")
            found[loc] = target
    return found


def onnx_files(path: str | Path) -> dict[str, Path]:
    """The files an ONNX model is made of, by name: the model file and every external data file
    it names (each checked to lie beside it)."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError):
        return {"model": path}  # not ONNX: the task's read says so
    return {"model": path, **{f"data:{loc}": f for loc, f in external_files(model, path).items()}}


def onnx_digest(path: str | Path) -> str:
    """sha256 over the model file and every external data file it names: editing either gives
    a new task key."""
    return userfiles.digest_of(onnx_files(path))
