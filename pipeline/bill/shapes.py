"""Concrete shapes of every tensor of an ONNX graph at one batch and input size.

In: a ``ModelProto`` and the concrete shape of each graph input. Out: ``{tensor name: (shape,
element type)}`` with ``None`` for a dimension nobody could infer. ONNX's own shape inference
(``onnx.shape_inference.infer_shapes`` with data propagation) does the work. Exporters compute
reshape targets at run time (``Shape -> Gather -> Concat -> Reshape``), which onnx's data
propagation follows only part of the way; so between rounds the small integer tensors of that
shape arithmetic are evaluated with ``onnx.reference`` on a copy of the graph and turned into
constants, and inference runs again. The caller's graph is never modified.
Deliberately not handled: shapes inside control-flow subgraphs (Loop, If, Scan) and custom
domains that onnx has no inference for (their outputs stay unknown and are reported so).
"""
from __future__ import annotations

import numpy as np

MAX_ROUNDS = 6
SMALL = 64  # shape arithmetic works on a handful of int64 values; never fold real data


def infer(model, input_shapes: dict[str, list[int]]) -> dict[str, tuple]:
    import onnx

    from pipeline.core.errors import StageError

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]  # exporters leave symbolic dims ("batch") that would win the merge
    for out in m.graph.output:
        out.type.tensor_type.ClearField("shape")
    for inp in m.graph.input:
        if inp.name in input_shapes:
            dims = inp.type.tensor_type.shape.dim
            del dims[:]
            for d in input_shapes[inp.name]:
                dims.add().dim_value = int(d)
    info: dict[str, tuple] = {}
    for _ in range(MAX_ROUNDS):
        try:
            inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
            raise StageError(f"onnx shape inference failed at inputs {input_shapes}: "
                             f"{str(e).splitlines()[0]}") from None
        info = _collect(inferred)
        if all(s is not None and None not in s for s, _ in info.values()):
            break
        if not _fold_shape_arithmetic(m, info):
            break
    return info


def toposort(graph) -> None:
    """Order the nodes so each comes after its inputs' producers, in place. Some tools append
    nodes out of order (the FP16 converter adds its input Casts last); onnx's inference and the
    liveness count both read the list front to back."""
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    order, state = [], {}  # state: 1 = visiting, 2 = done

    def visit(k):
        stack = [(k, iter(graph.node[k].input))]
        state[k] = 1
        while stack:
            node, inputs = stack[-1]
            for name in inputs:
                dep = producer.get(name)
                if dep is not None and state.get(dep) is None:
                    state[dep] = 1
                    stack.append((dep, iter(graph.node[dep].input)))
                    break
            else:
                stack.pop()
                state[node] = 2
                order.append(node)

    for k in range(len(graph.node)):
        if k not in state:
            visit(k)
    if order != list(range(len(graph.node))):
        nodes = [graph.node[k] for k in order]
        copies = []
        for n in nodes:
            c = type(n)()
            c.CopyFrom(n)
            copies.append(c)
        del graph.node[:]
        graph.node.extend(copies)


def _dims(tensor_type) -> tuple | None:
    if not tensor_type.HasField("shape"):
        return None
    # -1: how some exporters (Paddle2ONNX) mark a dynamic size
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                 for d in tensor_type.shape.dim)


def _collect(model) -> dict[str, tuple]:
    g = model.graph
    info = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            info[vi.name] = (_dims(vi.type.tensor_type), vi.type.tensor_type.elem_type)
    for init in g.initializer:
        info[init.name] = (tuple(init.dims), init.data_type)
    for node in g.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    info[node.output[0]] = (tuple(a.t.dims), a.t.data_type)
    return info


def _small_values(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {}
    for init in model.graph.initializer:
        if int(np.prod(init.dims)) <= SMALL and init.data_location != 1:  # 1 = EXTERNAL
            values[init.name] = numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and int(np.prod(a.t.dims)) <= SMALL:
                    values[node.output[0]] = numpy_helper.to_array(a.t)
                elif a.name in ("value_int", "value_ints", "value_float", "value_floats"):
                    v = {"value_int": a.i, "value_ints": list(a.ints), "value_float": a.f,
                         "value_floats": list(a.floats)}[a.name]
                    dtype = np.int64 if "int" in a.name else np.float32
                    values[node.output[0]] = np.array(v, dtype=dtype)
    return values


def _fold_shape_arithmetic(model, info) -> int:
    """Replace shape-computing nodes whose inputs are now known by Constants; returns how many."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    values = _small_values(model)
    replaced = {}  # node index -> [(output name, value)]
    for k, node in enumerate(model.graph.node):
        if node.op_type == "Constant" or node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in ("Shape", "Size"):
            shape = info.get(node.input[0], (None, 0))[0]
            if shape is None or None in shape:
                continue
            if node.op_type == "Size":
                outs = [np.array(int(np.prod(shape)), dtype=np.int64)]
            else:
                attrs = {a.name: a.i for a in node.attribute}
                start, end = attrs.get("start", 0), attrs.get("end", len(shape))
                outs = [np.array(shape[start:end] if "end" in attrs else shape[start:],
                                 dtype=np.int64)]
        else:
            ins = [i for i in node.input if i]
            if not ins or not all(i in values for i in ins) or node.op_type.startswith("Random"):
                continue
            try:
                one = helper.make_model(helper.make_graph(
                    [node], "fold", [], [helper.make_tensor_value_info(o, 0, None)
                                         for o in node.output],
                    initializer=[numpy_helper.from_array(values[i], i) for i in ins]),
                    opset_imports=model.opset_import)
                outs = ReferenceEvaluator(one).run(None, {})
            except Exception:  # noqa: BLE001 - an op the reference cannot run stays unfolded
                continue
            if any(np.asarray(o).size > SMALL for o in outs):
                continue
        for name, value in zip(node.output, outs):
            values[name] = np.asarray(value)
        replaced[k] = [(n, np.asarray(v)) for n, v in zip(node.output, outs)]
    if not replaced:
        return 0
    nodes = []
    for k, node in enumerate(model.graph.node):
        if k in replaced:
            nodes += [helper.make_node("Constant", [], [n], value=numpy_helper.from_array(v, n))
                      for n, v in replaced[k] if n]
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(replaced)
