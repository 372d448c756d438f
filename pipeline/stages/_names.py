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

from pipeline.runtimes.ops import NAMED_OPS


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
        if node.op_type in NAMED_OPS and mod:
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
    name_inlined(exported, optimized, names)
    return names


def name_inlined(exported, optimized, names: dict) -> None:
    """Name the nodes ONNX Runtime leaves unnamed when it inlines a function op it has no kernel
    for (HardSwish becomes HardSigmoid and Mul): the node writing the function's output takes its
    module's name (``blocks.0.dw.2``), the nodes feeding only it ``<module>/<op type>``. Unnamed
    nodes could be neither profiled nor kept float one by one (every unnamed kernel profiles as
    ''); any other unnamed node gets its op type and a number. Adds compute nodes to ``names``."""
    graph = optimized.graph
    unnamed = [n for n in graph.node if not n.name]
    if not unnamed:
        return
    module_by_output = {o: module_of(n) for n in exported.graph.node for o in n.output if module_of(n)}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    owner = {id(n): module_by_output[o] for n in unnamed for o in n.output if o in module_by_output}
    changed = True
    while changed:  # inner nodes of an inlined function feed its output node
        changed = False
        for n in unnamed:
            if id(n) not in owner:
                mods = {owner.get(id(c)) for o in n.output for c in consumers.get(o, ())}
                if len(mods) == 1 and None not in mods:
                    owner[id(n)] = mods.pop()
                    changed = True
    outputs = {id(n): any(o in module_by_output for o in n.output) for n in unnamed}
    taken = {n.name for n in graph.node if n.name}
    for n in unnamed:
        mod = owner.get(id(n))
        base = (mod if outputs[id(n)] else f"{mod}/{n.op_type}") if mod else n.op_type
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        n.name = name
        taken.add(name)
        if n.op_type in NAMED_OPS:
            names[name] = n.op_type
