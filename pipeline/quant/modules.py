"""Which module of the source network each ONNX node came from (``encoder.layer.3.attention.self.
query``), so the per-layer INT8 table reads in the model's own terms, not in node names.

In: ONNX model paths and a prefix to drop (a wrapper's attribute: ``model.`` for ``model=hf``,
whose network holds the transformers model as ``model``). Out: {node name: module path} for
every node a path is found for. Generic, from what exporters and optimizers keep, in this order:
the dynamo exporter's ``pkg.torch.onnx.name_scopes`` metadata (its last entry is the node, the
one before it the module); a TorchScript scope name (``/model/encoder/layer.0/output/dense/
MatMul``: the scopes before the op); a scoped output tensor name, which fused nodes keep
(onnxruntime's ``Attention_0`` writes ``/model/encoder/layer.0/attention/self/Reshape_3_output_0``,
the block it replaced); the common module of the node's named parameters (``embeddings.word_
embeddings.weight`` and ``embeddings.LayerNorm.bias``: ``embeddings``). A node none of these
name is left out: the table keeps its node name.
"""
from __future__ import annotations

import ast
from pathlib import Path

SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def _scoped(name: str) -> str:
    """``/a/b.0/c/Op`` -> ``a.b.0.c``; "" for a name that is not a scope path."""
    if not name.startswith("/"):
        return ""
    parts = [p for p in name.split("/") if p]
    return ".".join(parts[:-1])


def _from_metadata(node) -> str:
    for p in node.metadata_props:
        if p.key == SCOPES_KEY:
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                return ""
            return str(scopes[-2]) if isinstance(scopes, list) and len(scopes) >= 2 else ""
    return ""


def _from_parameters(node, initializers: set[str]) -> str:
    """The deepest module all the node's dotted parameter names share (``a.b.weight``: ``a.b``)."""
    owners = [n.rpartition(".")[0].split(".") for n in node.input
              if n in initializers and "." in n and "::" not in n]
    if not owners:
        return ""
    common = owners[0]
    for o in owners[1:]:
        k = 0
        while k < min(len(common), len(o)) and common[k] == o[k]:
            k += 1
        common = common[:k]
    return ".".join(common)


def node_modules(graph, prefix: str = "") -> dict[str, str]:
    initializers = {i.name for i in graph.initializer}
    out = {}
    for node in graph.node:
        path = (_from_metadata(node) or _scoped(node.name)
                or next((p for p in map(_scoped, node.output) if p), "")
                or _from_parameters(node, initializers))
        if prefix and (path + ".").startswith(prefix):  # the wrapper itself names no module
            path = path[len(prefix):]
        if path:
            out[node.name] = path
    return out


def module_paths(*models: Path, prefix: str = "") -> dict[str, str]:
    """Over several models (FP32 and INT8: the per-layer table names nodes of either); the first
    model that names a node wins."""
    import onnx

    out: dict[str, str] = {}
    for m in models:
        graph = onnx.load(str(m), load_external_data=False).graph
        for name, path in node_modules(graph, prefix).items():
            out.setdefault(name, path)
    return out
