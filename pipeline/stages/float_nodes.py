"""float_nodes: an INT8 model with some nodes handed back to float, by editing its QDQ graph.

In: a static ``quantize`` artifact (``parent``: its QDQ model and the nodes it already keeps
float) and the ``prepare`` artifact it was quantized from (``prepared``: the float weights and the
nodes the quantizer removed). Out: ``model.onnx`` with the nodes in ``nodes`` float and the same
metadata a ``quantize`` stage gives (per-node precision, excluded names, QDQ propagation), so
that evaluate and explain take it as they take a quantized model.

Why: the mixed-precision search needs one "this group float" model per trial. A whole
``quantize_static`` per trial (shape inference, the quantizer's pass, the dynamic pass for the
LSTM) took 3-7 s on a 10.9 MB recognizer, hundreds of times. Editing the all-INT8 graph keeps
every calibrated scale of the rest and costs a load and a save. What onnxruntime's QDQ quantizer
would have done without those nodes is replayed from its rules, in graph order as it works:
- a node quantizes its float inputs and outputs; a data-movement op (MaxPool, Reshape, ...) and
  a removable activation (Relu, Clip) only when their input is already quantized;
- a tensor keeps its QuantizeLinear/DequantizeLinear pair while any remaining node quantizes it,
  else the pair goes and its readers take the float tensor;
- a handed-back node reads its float weights (from ``prepared``) instead of dequantized ones;
- a Relu or Clip the quantizer folded into its producer's range comes back where its input is
  no longer quantized.
``tests/test_search.py`` checks on small graphs that the result equals ``quantize_static`` with
those nodes excluded: same nodes, same scales, same outputs. The search ranks with these models
only; every model it evaluates on the whole set or ships is quantized for real.
Nodes of the dynamic pass (a ``DynamicQuantizeLSTM``) are not handled here: the search
re-quantizes a group that holds one.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import StageError

# Ops onnxruntime's QDQ quantizer handles as data movement: output quantized with the input's
# scale, and only when the input is quantized already (QDQDirect8BitOp and its subclasses).
DIRECT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "AveragePool", "Slice",
              "TopK", "MaxPool", "Resize", "Gather", "GatherElements")
REMOVABLE = ("Relu", "Clip")  # folded into the producer's range when its input is quantized
NEVER = ("QuantizeLinear", "DequantizeLinear", "Where")  # Where: only when forced
# Ops that read a tensor's shape, not its values: floating one changes nothing (the OCR model's
# Shape of a dequantized tensor was a hand-back candidate, a block of its own).
SHAPE_ONLY = ("Shape", "Size", "Constant", "ConstantOfShape")


def default_op_types() -> set[str]:
    """What ``quantize_static`` quantizes when given no op types: its two registries."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return set(QLinearOpsRegistry) | set(QDQRegistry)


def quantized_tensors(graph, excluded: set, static_op_types=None) -> set[str]:
    """The activation tensors onnxruntime's QDQ quantizer quantizes in ``graph`` (the float
    model) with the nodes ``excluded`` kept float: its per-node rules, replayed in node order."""
    inits = {i.name for i in graph.initializer}
    ops = default_op_types() if static_op_types is None else set(static_op_types)
    done: set[str] = set()
    for n in graph.node:
        if n.name in excluded or n.op_type in NEVER or n.op_type not in ops:
            continue
        if n.op_type in DIRECT_OPS or n.op_type in REMOVABLE:
            if n.input and n.input[0] in done:
                done.update(o for o in n.output[:1] if o)
            continue
        done.update(t for t in list(n.input) + list(n.output) if t and t not in inits)
    return done


def handback_candidates(graph, precision: dict, excluded=()) -> tuple[list[str], dict]:
    """What the mixed search may hand back to float in ``graph`` (an INT8 QDQ model), in graph
    order: the nodes reported INT8 (``precision``), then also every other node the quantizer
    wrapped in Q/DQ pairs, though no reported precision names it INT8 (a LayerNormalization, a
    Concat, a Mul or Softmax between DequantizeLinear and QuantizeLinear), unless it is
    ``excluded`` already or a Q/DQ, data-movement or folded op. Returned with the order: for each
    of the latter, the nodes to float together with it (``{name: (name, ...)}``): it and the
    data-movement ops (Flatten, Reshape, AveragePool, ...) that feed it alone, since such an op
    quantizes its output whenever its input is quantized: a LayerNormalization after a Flatten,
    floated alone, would still read the Flatten's rounded output."""
    inits = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)

    def float_readers(t: str) -> set:
        """The names of the nodes reading ``t``, directly or through its Q/DQ pair."""
        out: set = set()
        for r in readers.get(t, []):
            out |= (float_readers(r.output[0]) if r.op_type in ("QuantizeLinear", "DequantizeLinear")
                    else {r.name})
        return out

    def dequantized(t: str) -> bool:  # an activation read through a DequantizeLinear
        dq = producer.get(t)
        return dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] not in inits

    def rounded_by(t: str):
        """The node whose output reaches a reader of ``t`` as DequantizeLinear(QuantizeLinear(.))."""
        if not dequantized(t):
            return None
        q = producer.get(producer[t].input[0])
        return producer.get(q.input[0]) if q is not None and q.op_type == "QuantizeLinear" else None

    order, closure = [], {}
    for n in graph.node:
        name = n.name[:-len("_quant")] if n.name.endswith("_quant") else n.name
        if precision.get(name, "").startswith("int8"):
            order.append(name)
            continue
        if (not n.name or name in excluded or n.op_type in NEVER or n.op_type in DIRECT_OPS
                or n.op_type in REMOVABLE or n.op_type in SHAPE_ONLY):
            continue
        if not (any(dequantized(t) for t in n.input)
                or any(r.op_type == "QuantizeLinear" for o in n.output for r in readers.get(o, []))):
            continue
        group, todo = [name], [n]
        while todo:
            for t in todo.pop().input:
                p = rounded_by(t)
                if (p is not None and p.op_type in DIRECT_OPS and p.name and p.name not in group
                        and p.name not in excluded and float_readers(p.output[0]) <= set(group)):
                    group.append(p.name)
                    todo.append(p)
        order.append(name)
        closure[name] = tuple(group)
    return order, closure


def edit(model, prepared, floated: set, excluded: set, static_op_types=None):
    """``model`` (the INT8 ``onnx.ModelProto``, quantized with ``excluded`` float) edited so that
    ``floated`` is float too; ``prepared``: the float model it was quantized from."""
    pg = prepared.graph
    after = quantized_tensors(pg, excluded | floated, static_op_types)
    unquantize = quantized_tensors(pg, excluded, static_op_types) - after
    e = _Edit(model.graph, pg)
    missing = sorted(n for n in floated if n not in e.names and n not in e.p_nodes)
    if missing:
        raise StageError(f"float_nodes: {missing[0]!r} is not a node of the INT8 model")
    # Each phase replays one of the quantizer's rules listed in the module docstring.
    _read_float_weights(e, floated)
    _drop_pairs(e, unquantize)
    restore = _folded_activations(e, after)
    kept = _rewired([n for n in e.g.node if id(n) not in e.drop], e)
    order = _without_dead_pairs(_with_activations(kept, restore, e), e.outputs)
    del e.g.node[:]
    e.g.node.extend(order)
    # 4. Initializers nothing reads any more (int8 weights, scales of removed pairs).
    read = {t for n in e.g.node for t in n.input} | e.outputs
    keep = [i for i in e.g.initializer if i.name in read]
    del e.g.initializer[:]
    e.g.initializer.extend(keep)
    return model


class _Edit:
    """The INT8 graph being edited, the float graph it came from, and what the edit has decided
    so far: the nodes to drop (by id) and the tensors their readers read instead."""

    def __init__(self, g, pg):
        self.g, self.pg = g, pg
        self.p_nodes = {n.name: n for n in pg.node}
        self.p_inits = {i.name: i for i in pg.initializer}
        self.inits = {i.name: i for i in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output}
        self.names = {n.name for n in g.node}
        self.outputs = {o.name for o in g.output}
        self.drop: set[int] = set()  # ids of nodes to remove
        self.rewire: dict[str, str] = {}  # tensor read -> tensor to read instead

    def add_float_initializer(self, name: str) -> None:
        if name not in self.inits:
            self.g.initializer.append(self.p_inits[name])
            self.inits[name] = self.p_inits[name]


def _read_float_weights(e: _Edit, floated: set) -> None:
    """1. Handed-back nodes read their float weights."""
    for n in e.g.node:
        if n.name not in floated:
            continue
        src = e.p_nodes.get(n.name)
        for k, t in enumerate(n.input):
            dq = e.producer.get(t)
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in e.inits:
                continue
            if src is None or k >= len(src.input) or src.input[k] not in e.p_inits:
                raise StageError(f"float_nodes: no float weight for input {k} of {n.name!r}")
            name = src.input[k]
            if dq.output[0] == name:  # the quantizer kept the name (a bias): its DQ must go
                e.drop.add(id(dq))
            e.add_float_initializer(name)
            n.input[k] = name


def _drop_pairs(e: _Edit, unquantize: set) -> None:
    """2. Tensors no remaining node quantizes lose their Q/DQ pair."""
    consumers: dict[str, list] = {}
    for n in e.g.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
    for q in e.g.node:
        # (a graph output's producer writes <t>_QuantizeLinear_Input: the tensor is still <t>)
        if (q.op_type != "QuantizeLinear"
                or q.input[0].removesuffix("_QuantizeLinear_Input") not in unquantize):
            continue
        e.drop.add(id(q))
        for dq in consumers.get(q.output[0], []):
            if dq.op_type == "DequantizeLinear":
                e.drop.add(id(dq))
                e.rewire[dq.output[0]] = q.input[0]


def _folded_activations(e: _Edit, after: set) -> list:
    """3. The Relu/Clip nodes the quantizer folded into their producer whose input is float
    again: they come back."""
    return [pn for pn in e.pg.node
            if pn.op_type in REMOVABLE and pn.name not in e.names and pn.input[0] not in after
            and pn.output[0] in e.producer]


def _rewired(kept: list, e: _Edit) -> list:
    """The kept nodes reading the float tensors of removed pairs; a graph output read through a
    removed pair keeps its name."""
    for n in kept:
        for k, t in enumerate(n.input):
            if t in e.rewire:
                n.input[k] = e.rewire[t]
    for o in e.g.output:
        if o.name in e.rewire:
            src = e.rewire[o.name]
            for n in kept:
                for k, t in enumerate(n.output):
                    if t == src:
                        n.output[k] = o.name
                for k, t in enumerate(n.input):
                    if t == src:
                        n.input[k] = o.name
    return kept


def _with_activations(kept: list, restore: list, e: _Edit) -> list:
    """``kept`` in order, each restored activation right after its producer, which writes the
    activation's input again."""
    import onnx

    order, restore = [], list(restore)
    for n in kept:
        order.append(n)
        for pn in list(restore):
            if pn.output[0] in n.output:
                k = list(n.output).index(pn.output[0])
                n.output[k] = pn.input[0]
                order.append(onnx.helper.make_node(pn.op_type, list(pn.input), list(pn.output),
                                                   name=pn.name, domain=pn.domain or None)
                             if not pn.attribute else _copy(pn))
                for t in pn.input[1:]:  # Clip's bounds
                    if t and t in e.p_inits:
                        e.add_float_initializer(t)
                restore.remove(pn)
    return order


def _without_dead_pairs(order: list, outputs: set) -> list:
    """Without the dequantized weights nothing reads any more (the handed-back nodes' int8
    weights), and the quantizers that fed only them."""
    while True:
        read = {t for n in order for t in n.input} | outputs
        dead = [n for n in order if n.op_type in ("QuantizeLinear", "DequantizeLinear")
                and not any(o in read for o in n.output)]
        if not dead:
            return order
        order = [n for n in order if all(n is not d for d in dead)]


def _copy(node):
    import onnx

    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


@dataclass(frozen=True)
class FloatNodes:
    nodes: tuple                   # node names handed back to float, sorted
    static_op_types: tuple | None  # the quantizer's op types (None: every one), as quantized
    name = "float_nodes"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path, prepared) -> dict:
        import onnx

        from pipeline.stages._parity import node_counts
        from pipeline.stages.quantize import _keep_float_regions, precisions

        excluded = set(parent.meta.get("excluded", ()))
        model = onnx.load(str(parent.model))
        float_model = onnx.load(str(prepared.model))
        static = None if self.static_op_types is None else set(self.static_op_types)
        edit(model, float_model, set(self.nodes), excluded, static)
        target = out_dir / "model.onnx"
        onnx.save(model, str(target))
        precision = precisions(target)
        names = sorted(excluded | set(self.nodes))
        floated = [n for n in names if precision.get(n) == "float"]
        disabled = _keep_float_regions(target) if floated else []
        nodes = node_counts(target)
        return {**{k: parent.meta.get(k) for k in ("calibration_set", "calibration", "settings")},
                "nodes": nodes, "excluded": names, "edited_from": parent.digest,
                "exclusion_ignored": sorted(n for n in names
                                            if precision.get(n, "float").startswith("int8")),
                "precision": precision, "onnxruntime_disabled_optimizers": disabled,
                "qdq_pairs": nodes.get("QuantizeLinear", 0)}
