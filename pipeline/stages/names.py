"""Readable node names: the PyTorch module each ONNX node came from.

In: the exported model (whose nodes carry torch's ``pkg.torch.onnx.name_scopes`` metadata) and the
optimized model (whose fused nodes lost it). Out: the optimized model with every compute node
renamed after its module (``cnn.4``, ``rnn``, ``head``), so reports, profiles and sensitivity
tables read ``cnn.4`` rather than ``node_Conv_24``.

Why matching by op type and order: graph fusion (Conv+BatchNorm) replaces nodes and drops their
metadata, but it does not reorder the compute ops of one type; the k-th Conv of the optimized
graph is the k-th Conv of the export. Ops without a match keep their name.
"""
from __future__ import annotations

import json

COMPUTE_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Attention",
               "MaxPool", "AveragePool", "GlobalAveragePool", "Relu", "Add", "Mul", "Sigmoid",
               "HardSigmoid", "HardSwish", "Softmax")


def module_of(node) -> str | None:
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = [s for s in json.loads(prop.value.replace("'", '"')) if s]
            # The last entry names the op inside the module; the one before it is the module.
            return scopes[-2] if len(scopes) >= 2 else (scopes[0] if scopes else None)
    return None


def rename_like_export(exported, optimized) -> dict[str, str]:
    """Rename compute nodes of ``optimized`` (in place) after the export's modules.
    Returns {new name: op type}."""
    by_op: dict[str, list[str]] = {}
    for node in exported.graph.node:
        mod = module_of(node)
        if node.op_type in COMPUTE_OPS and mod:
            by_op.setdefault(node.op_type, []).append(mod)
    seen: dict[str, int] = {}
    used: set[str] = set()
    names = {}
    for node in optimized.graph.node:
        k = seen.get(node.op_type, 0)
        seen[node.op_type] = k + 1
        mods = by_op.get(node.op_type, [])
        if k < len(mods) and len(mods) == sum(n.op_type == node.op_type for n in optimized.graph.node):
            name = mods[k] if mods[k] not in used else f"{mods[k]}/{node.op_type}"
            if name not in used:
                node.name = name
                used.add(name)
                names[name] = node.op_type
    return names
