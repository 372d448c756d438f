"""attention: self-attention that onnxruntime.transformers left unfused, as one
``com.microsoft.MultiHeadAttention`` node per layer.

Why: the optimizer fuses BERT's attention but not an attention whose scores carry extra additive
terms, such as MPNet's relative position bias. There each layer runs as four head Transposes, a
scaled Q.K^T MatMul, one Add per term, Softmax, P.V and the head merge; ONNX Runtime's CPU
``MultiHeadAttention`` takes the projected Q, K and V as ``[batch, sequence, hidden]`` with the
terms as one ``attention_bias`` and does the rest in one kernel. Measured on all-mpnet-base-v2's
dynamic INT8 (AMD EPYC with AVX512-VNNI, 2 threads, side by side in one process): 1.08x the
unfused graph at batch 1 and 1.06x at batch 8, at the same outputs.

The rewrite: per ``Softmax`` over the last axis, walk back through the ``Add`` nodes (each one's
other input is a term), at most one ``Div``/``Mul`` by a scalar constant (the scale) to a
``MatMul`` of ``Transpose(0,2,1,3)(Reshape(q))`` and ``Transpose(0,2,3,1)(Reshape(k))``; forward
from the Softmax to ``MatMul(P, Transpose(0,2,1,3)(Reshape(v)))``, ``Transpose(0,2,1,3)`` and the
merging ``Reshape``. Each intermediate must have no other reader (the merge's ``Shape`` readers,
which only compute the merged shape, die with it). The terms are summed once for every layer that
shares them (MPNet's bias and mask are the same in all 12). Anything else is left as it was.

In (stage ``FuseAttention``): an ONNX artifact (the export) and the head count. Out:
``model.onnx`` with the fused layers, their count, node counts and parity against the parent;
when nothing matched, or the fused graph does not reproduce the parent's outputs, the parent's
graph unchanged and the reason.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.engine.runner import CHECKS_ONLY
from pipeline.stages._parity import compare, node_counts

HEADS_IN = (0, 2, 1, 3)   # [b, s, heads, d] -> [b, heads, s, d] (and back, after P.V)
KEYS_IN = (0, 2, 3, 1)    # [b, s, heads, d] -> [b, heads, d, s]: K already transposed for Q.K^T
SCALES = ("Div", "Mul")   # the scores' one scale, by a scalar constant
TOLERANCE = 1e-3          # the fuse stage's own parity tolerance


def _attr(node, name, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _scalar(name, producer, inits):
    from onnx import numpy_helper

    if name in inits:
        value = numpy_helper.to_array(inits[name])
    elif name in producer and producer[name].op_type == "Constant":
        t = _attr(producer[name], "value")
        value = numpy_helper.to_array(t) if t is not None else None
    else:
        return None
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def fuse_attention(model, num_heads: int) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``, in place); returns the number of layers fused."""
    from onnx import helper

    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    inits = {t.name: t for t in g.initializer}
    outputs = {o.name for o in g.output}

    def sole(name):  # read by exactly one node and not a graph output
        return len(readers.get(name, [])) == 1 and name not in outputs

    def split_heads(name, perm):
        """``name`` = Transpose(perm)(Reshape(x)), each read once: (x, [transpose, reshape])."""
        t = producer.get(name)
        if t is None or t.op_type != "Transpose" or tuple(_attr(t, "perm", ())) != perm \
                or not sole(name):
            return None
        r = producer.get(t.input[0])
        if r is None or r.op_type != "Reshape" or not sole(r.output[0]):
            return None
        return r.input[0], [t, r]

    def score_side(name):
        p = producer.get(name)
        return p is not None and p.op_type in ("Add", "Div", "Mul", "MatMul") and sole(name)

    dead, added, summed, fused = set(), [], {}, 0
    for sm in list(g.node):
        if sm.op_type != "Softmax" or _attr(sm, "axis", -1) not in (-1, 3):
            continue
        x, terms, chain, scale, qk = sm.input[0], [], [], 1.0, None
        while sole(x) and x in producer:
            n = producer[x]
            if n.op_type == "Add":
                a, b = n.input
                if score_side(a) == score_side(b):
                    break  # neither or both lead back to the scores: not this pattern
                x, term = (a, b) if score_side(a) else (b, a)
                terms.append(term)
            elif n.op_type in SCALES and not any(c.op_type in SCALES for c in chain):
                c = _scalar(n.input[1], producer, inits)
                if not c:
                    break
                scale *= 1.0 / c if n.op_type == "Div" else c
                x = n.input[0]
            elif n.op_type == "MatMul":
                qk = n
                break
            else:
                break
            chain.append(n)
        if qk is None:
            continue
        q, k = split_heads(qk.input[0], HEADS_IN), split_heads(qk.input[1], KEYS_IN)
        pv = readers.get(sm.output[0], [])
        if q is None or k is None or len(pv) != 1 or pv[0].op_type != "MatMul" \
                or pv[0].input[0] != sm.output[0] or not sole(pv[0].output[0]):
            continue
        pv = pv[0]
        v = split_heads(pv.input[1], HEADS_IN)
        merge = readers[pv.output[0]][0]
        if v is None or merge.op_type != "Transpose" or merge.output[0] in outputs \
                or tuple(_attr(merge, "perm", ())) != HEADS_IN:
            continue
        after = readers.get(merge.output[0], [])
        reshapes = [r for r in after if r.op_type == "Reshape"]
        if len(reshapes) != 1 or any(r.op_type != "Shape" for r in after if r is not reshapes[0]):
            continue
        key = tuple(sorted(set(terms)))
        if len(key) != len(terms):
            continue  # one term added twice: not an attention this rewrite knows
        if key not in summed:  # the terms once for every layer that shares them
            acc = key[0] if key else ""
            for j, term in enumerate(key[1:]):
                out = f"attention_bias/{len(summed)}/{j}"
                added.append(helper.make_node("Add", [acc, term], [out], name=out))
                acc = out
            summed[key] = acc
        base = sm.name.rsplit("/", 1)[0] if "/" in sm.name else sm.name
        added.append(helper.make_node(
            "MultiHeadAttention", [q[0], k[0], v[0], "", "", summed[key]], [reshapes[0].output[0]],
            name=f"{base}/MultiHeadAttention", domain="com.microsoft", num_heads=num_heads,
            scale=scale))
        dead.update(id(n) for n in (qk, sm, pv, merge, reshapes[0], *chain, *q[1], *k[1], *v[1]))
        fused += 1
    if not fused:
        return 0
    _replace_nodes(g, [n for n in g.node if id(n) not in dead] + added, outputs, inits)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return fused


def _replace_nodes(g, nodes, outputs, inits) -> None:
    """``nodes`` without the dead ones (the merged shapes' computations), topologically sorted,
    as the graph's nodes."""
    while True:
        used = {i for n in nodes for i in n.input} | outputs
        alive = [n for n in nodes if any(o in used for o in n.output)]
        if len(alive) == len(nodes):
            break
        nodes = alive
    ready = {i.name for i in g.input} | set(inits) | {""}
    order, pending = [], nodes
    while pending:
        rest = [n for n in pending if not all(i in ready for i in n.input)]
        for n in pending:
            if n not in rest:
                order.append(n)
                ready.update(n.output)
        if len(rest) == len(pending):
            raise ValueError(f"attention fusion left {len(rest)} nodes with unknown inputs")
        pending = [n for n in pending if n in rest]
    del g.node[:]
    g.node.extend(order)


def fused_copy(src: Path, target: Path, num_heads: int) -> int:
    """``src`` with its attention fused, saved as ``target`` (weights beside it past 2 GB)."""
    import onnx

    model = onnx.load(str(src))
    n = fuse_attention(model, num_heads)
    if n:
        big = model.ByteSize() > 1_900_000_000
        onnx.save(model, str(target), save_as_external_data=big,
                  location=target.name + ".data" if big else None)
    return n


def checked(src: Path, target: Path, num_heads: int, task, ds, hardware) -> dict:
    """Fuse ``src`` into ``target`` and check it against ``src`` on ``ds``; a graph that fails
    to load, to run or to agree is replaced by ``src``'s own, and the record says why."""
    from pipeline.runtimes import onnxruntime as ort

    try:
        n = fused_copy(src, target, num_heads)
    except ValueError as e:
        n, why = 0, str(e)
    else:
        why = "no unfused attention matched" if not n else None
    parity = None
    if n:
        try:
            before, after = ort.session(src, hardware), ort.session(target, hardware, probe=True)
            parity = compare(lambda x: ort.run(before, x), lambda x: ort.run(after, x), task, ds)
        except Exception as e:  # noqa: BLE001 - the runtime refused the fused graph: keep src's
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        else:
            if parity["max_abs_diff"] > TOLERANCE or parity["decoded_agreement"] < 1.0:
                why = (f"outputs differ from the unfused graph's (max |diff| "
                       f"{parity['max_abs_diff']:.2e})")
        if why:
            n = 0
    if not n:
        shutil.copyfile(src, target)
    return {"fused": n, "why_not": why, "parity": parity}


@dataclass(frozen=True)
class FuseAttention:
    data: object           # DataSplit: the samples parity is checked on
    num_heads: int
    hardware: object = field(metadata=CHECKS_ONLY)  # runs its checks: not in the key
    name = "attention"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline.models import task

        t = task(self.data.task)
        record = checked(parent.model, out_dir / "model.onnx", self.num_heads, t,
                         t.dataset(self.data), self.hardware)
        return {**record, "nodes": node_counts(out_dir / "model.onnx"),
                "num_heads": self.num_heads}
