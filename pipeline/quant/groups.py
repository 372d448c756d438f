"""The units the mixed search ranks: module blocks, not single nodes.

In: the quantized nodes in graph order, each node's module path (``explain``'s ``module``, from
``quant/modules.py``) and whether ranking goes by ``blocks`` or by ``nodes``. Out: units in graph
order, each ``{"name", "nodes"}``.

Why: one ranking trial per node is N trials (270 on a real recognizer, over an hour on 2 cores).
A block is the module path up to its first index (``blocks.3.dw.0`` -> ``blocks.3``,
``encoder.layer.2.attention`` -> ``encoder.layer.2``), or its first part where it has none
(``rnn``, ``head``), as the float-region search groups nodes. Nodes with no module path (an
imported graph's ``Conv_12``) are cut in graph order into runs of about sqrt(N); a block larger
than twice that is cut the same way. So the trials grow with the blocks, about sqrt(N) at most
for a graph with no names, never with N.
"""
from __future__ import annotations

import math


def block(path: str | None) -> str | None:
    """The block of a module path or scoped node name; None for a name that is no path."""
    if not path or path.startswith("node_"):
        return None
    if path.startswith("/"):  # a TorchScript scope: /cnn/cnn.4/Conv -> cnn.cnn.4
        path = ".".join([p for p in path.split("/") if p][:-1])
    path = path.split("/")[0]
    if "." not in path and not path.isidentifier():
        return None
    parts = path.split(".")
    for k, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:k + 1])
    return parts[0] or None


def _chunks(names: list[str], size: int) -> list[list[str]]:
    return [names[i:i + size] for i in range(0, len(names), size)]


def units(nodes: list[str], modules: dict, by: str = "blocks") -> list[dict]:
    if by == "nodes":
        return [{"name": n, "nodes": [n]} for n in nodes]
    size = max(2, math.ceil(math.sqrt(max(len(nodes), 1))))
    runs: list[tuple[str | None, list[str]]] = []
    for n in nodes:
        # a node with a module path, or a name that is one (cnn.4); an imported graph's Conv_12
        # is not
        key = block(modules.get(n)) or (block(n) if "." in n or n.startswith("/") else None)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(n)
        else:
            runs.append((key, [n]))
    out: list[dict] = []
    for key, members in runs:
        parts = _chunks(members, size) if key is None or len(members) > 2 * size else [members]
        for k, part in enumerate(parts):
            name = key if key and len(parts) == 1 else \
                f"{key + ' ' if key else ''}{part[0]}..{part[-1]}" if len(part) > 1 else part[0]
            out.append({"name": name, "nodes": part})
    seen: dict[str, int] = {}
    for u in out:  # a module met twice in graph order (a residual's Add): names stay unique
        seen[u["name"]] = seen.get(u["name"], 0) + 1
        if seen[u["name"]] > 1:
            u["name"] = f"{u['name']} #{seen[u['name']]}"
    return out
