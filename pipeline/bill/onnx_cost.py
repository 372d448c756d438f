"""The cost of one inference of any ONNX model: parameters, weight bytes, FLOPs, activations.

In: an ``.onnx`` file, a batch size and one sample's input shape. Out: a plain dict:
parameters and their bytes by stored type, FLOPs and multiply-accumulates per op type (Conv,
MatMul, Gemm, LSTM/GRU/RNN, Attention, their quantized forms), activation memory (everything the
graph produces, and the peak of what is alive at once when buffers are freed after their last
reader), input/output bytes, and a per-operation list (FLOPs, bytes, precision) for the roofline.
onnx does the reading and the shape inference (``pipeline.bill.shapes``); weights are never
loaded, only their declared shapes, so a multi-GB model is billed in a second.

What counts, and why:
- A *parameter* is a stored float tensor of more than one value, or an integer tensor that a
  DequantizeLinear turns back into floats (a quantized weight). BatchNorm's running mean and
  variance are statistics, and Q/DQ scales and zero points are quantization metadata: both are
  bytes, not parameters. Integer shape constants are neither.
- Work that depends only on constants (dequantizing weights, the exporter's weight re-packing)
  is done once when a runtime loads the model and is not charged per inference; nor is shape
  arithmetic. Q/DQ pairs around activations are fused by runtimes (QLinearConv), so a tensor
  that is only re-quantized is counted at its quantized size and the pairs themselves cost nothing.
- FLOPs are 2 x MACs for contractions; element-wise ops count one FLOP per output value,
  normalizations and softmax a few. Bias additions inside Conv/Gemm are not counted.
Deliberately not handled: control-flow subgraphs (Loop, If, Scan) and op types without a formula
here; both are listed under ``uncounted`` rather than guessed.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

CONTRACTIONS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "FusedConv", "MatMul",
                "MatMulInteger", "QLinearMatMul", "FusedMatMul", "MatMulNBits", "Gemm",
                "FusedGemm", "QGemm", "LSTM", "GRU", "RNN", "Attention", "MultiHeadAttention",
                "QAttention", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
PER_VALUE = {  # FLOPs per output value (rough; these ops are memory-bound anyway)
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Relu", "LeakyRelu",
                     "PRelu", "Sigmoid", "Tanh", "Exp", "Log", "Erf", "Gelu", "FastGelu",
                     "QuickGelu", "HardSigmoid", "HardSwish", "Clip", "Neg", "Abs", "Max", "Min",
                     "Sum", "Mean", "Floor", "Ceil", "Round", "Sign", "Where", "Equal", "Less",
                     "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Elu", "Selu",
                     "Softplus", "Softsign", "Mish", "Resize", "CumSum", "Celu", "BiasGelu"), 1),
    **dict.fromkeys(("BatchNormalization", "InstanceNormalization"), 2),
    **dict.fromkeys(("Softmax", "LogSoftmax"), 3),
    **dict.fromkeys(("LayerNormalization", "GroupNormalization", "SimplifiedLayerNormalization",
                     "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"), 5),
}
WINDOWED = {"MaxPool", "AveragePool", "LpPool"}             # FLOPs = outputs x window
REDUCING = {"GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceSum", "ReduceMax",
            "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1", "ReduceSumSquare",
            "ReduceLogSumExp"}                               # FLOPs = inputs
MOVING = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose", "Concat",
          "Split", "Slice", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad",
          "Cast", "CastLike", "Shape", "Size", "Constant", "ConstantOfShape", "Range",
          "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ScatterND",
          "ScatterElements", "TopK", "ArgMax", "ArgMin", "NonZero", "OneHot", "Trilu",
          "DepthToSpace", "SpaceToDepth", "Dropout"}         # data movement: no arithmetic
VIEWS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout"}  # no new buffer
NOT_PARAMETERS = {"BatchNormalization": {3, 4}, "QuantizeLinear": {1, 2},
                  "DequantizeLinear": {1, 2}, "Resize": {1, 2, 3}, "Clip": {1, 2},
                  # the scales and zero points of the integer kernels' own inputs
                  "MatMulInteger": {2, 3}, "ConvInteger": {2, 3},
                  "DynamicQuantizeMatMul": {2, 3}, "MatMulIntegerToFloat": {2, 3, 4, 5},
                  "QAttention": {3, 4, 6, 7}, "QLinearConv": {1, 2, 4, 5, 6, 7},
                  "QLinearMatMul": {1, 2, 4, 5, 6, 7}, "QGemm": {1, 2, 4, 5, 7, 8},
                  "DynamicQuantizeLSTM": {8, 9, 10, 11}}
# Integer weights an integer kernel reads directly (dynamic INT8, QOperator models), counted as
# parameters like those a DequantizeLinear feeds
INTEGER_WEIGHTS = {"MatMulInteger": {1}, "ConvInteger": {1}, "DynamicQuantizeMatMul": {1},
                   "MatMulIntegerToFloat": {1}, "QAttention": {1}, "QLinearConv": {3},
                   "QLinearMatMul": {3}, "QGemm": {3}, "DynamicQuantizeLSTM": {1, 2}}


def dtype_name(elem_type: int) -> str:
    from onnx import helper

    name = helper.tensor_dtype_to_string(elem_type).split(".")[-1].lower()
    short = {"float": "fp32", "float16": "fp16", "bfloat16": "bf16", "double": "fp64"}
    return short.get(name, name)


def itemsize(elem_type: int) -> float:
    from onnx import TensorProto, helper

    if elem_type in (TensorProto.INT4, TensorProto.UINT4, getattr(TensorProto, "FLOAT4E2M1", -1)):
        return 0.5
    if elem_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return 0.0
    return float(helper.tensor_dtype_to_np_dtype(elem_type).itemsize)


def input_shapes(model, batch: int, sample_shape=None, size=None) -> dict[str, list[int]]:
    """Concrete input shapes: the batch first, then ``sample_shape`` (first input) or the model's
    own static sizes. ``size``: (input name, axis, value), the dynamic axis the benchmark timed
    and the size it fed there, or a list of them (with the axes every sample had at one size:
    a recognizer's height of 48 declared dynamic); every input's dimension of the same symbolic
    name (a sequence that input_ids and attention_mask share) takes that value too. A dimension
    that is dynamic and not given is an error naming it."""
    from pipeline.core.errors import ConfigError

    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]

    def declared_of(inp):
        # a dim_value of -1 is how some exporters (Paddle2ONNX) mark a dynamic size
        return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                else (d.dim_param or "?")
                for d in inp.type.tensor_type.shape.dim]

    named = {}  # symbolic dimension -> the size the benchmark fed it
    at = {}     # (input, axis) -> that size, for a dimension with no name ("?")
    for name, axis, value in ([] if size is None else
                              [size] if isinstance(size[0], str) else size):
        timed = next((declared_of(i) for i in inputs if i.name == name), None)
        if timed is not None and axis < len(timed) and isinstance(timed[axis], str):
            at[(name, axis)] = value
            if timed[axis] != "?":
                named[timed[axis]] = value
    shapes = {}
    for k, inp in enumerate(inputs):
        declared = declared_of(inp)
        rest = list(sample_shape) if (k == 0 and sample_shape is not None) else \
            [at.get((inp.name, j), named.get(d, d)) if isinstance(d, str) else d
             for j, d in enumerate(declared[1:], start=1)]
        if len(rest) != len(declared) - 1:
            raise ConfigError(f"bill.input_shape={list(sample_shape)}: input {inp.name!r} has "
                              f"{len(declared)} dims {declared}; give the {len(declared) - 1} "
                              "after the batch")
        # A size the model fixes (channels, height) cannot be billed as another one.
        clash = [(j + 1, d, r) for j, (d, r) in enumerate(zip(declared[1:], rest))
                 if isinstance(d, int) and d > 0 and r != d]
        if clash:
            j, d, r = clash[0]
            raise ConfigError(f"bill.input_shape={list(sample_shape)}: input {inp.name!r} is "
                              f"{declared}, its dim {j} is fixed at {d}, not {r}")
        dynamic = [d for d in rest if not isinstance(d, int)]
        if dynamic:
            raise ConfigError(f"input {inp.name!r} {declared} has dynamic sizes {dynamic}; "
                              "set bill.input_shape=[...] (one sample, without the batch)")
        if isinstance(declared[0], int) and declared[0] not in (batch, 0):
            raise ConfigError(f"input {inp.name!r} has a fixed batch of {declared[0]}; "
                              f"bill.batch={batch} cannot be billed")
        shapes[inp.name] = [batch, *rest]
    return shapes


def analyse(path: str | Path, batch: int, sample_shape=None, size=None) -> dict:
    """The cost of one inference at ``batch``; ``sample_shape`` is one sample's input shape
    without the batch (first input only; null = the model's static sizes); ``size``: the
    benchmark's dynamic axis and the size fed there (``input_shapes``)."""
    from pipeline.bill import shapes as shape_inference

    model = _read(path)
    shape_inference.toposort(model.graph)
    shapes = input_shapes(model, batch, sample_shape, size)
    tensors = _Tensors(model.graph, shape_inference.infer(model, shapes))
    constants, fixed = _constants_and_fixed(model.graph)
    params = _parameters(model, tensors.info, tensors.consumers)
    ops, by_op, uncounted = _operations(model.graph, tensors, constants, fixed)
    g = model.graph
    activations = _activations(g, tensors.info, tensors.producer, tensors.consumers, fixed,
                               tensors.nbytes)
    constant_bytes = sum(tensors.nbytes(c) or 0 for c in constants)
    unknown = sorted(o for n in g.node for o in n.output
                     if o and o not in fixed and tensors.shape(o) is None)
    return {
        "model": str(path), "file_bytes": Path(path).stat().st_size, "inputs": shapes,
        "outputs": {o.name: tensors.shape(o.name) for o in g.output},
        "parameters": params["count"], "parameter_bytes": params["bytes"],
        "parameters_by_dtype": params["by_dtype"],
        "parameter_bytes_by_dtype": params["bytes_by_dtype"],
        "other_constant_bytes": constant_bytes - params["bytes"],
        "excluded_constants": params["excluded"],
        "flops": sum(o["flops"] for o in ops), "macs": sum(o["macs"] for o in ops),
        "by_op": {k: v for k, v in sorted(by_op.items(), key=lambda kv: -kv[1]["flops"])},
        "activations": activations,
        "compulsory_bytes": constant_bytes + activations["io_bytes"],
        "uncounted": dict(uncounted), "unknown_shapes": unknown[:20],
        "unknown_shape_count": len(unknown), "ops": ops,
    }


def _read(path):
    """The model's graph and declared weight shapes (never the weights); one line when the file
    is not an ONNX model with an input."""
    import onnx

    from pipeline.core.errors import StageError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf and OS errors alike: not a model we can read
        raise StageError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    inits = {i.name for i in model.graph.initializer}
    if not [i for i in model.graph.input if i.name not in inits]:  # protobuf reads b"" as empty
        raise StageError(f"{path}: not an ONNX model with an input "
                         f"({Path(path).stat().st_size} bytes, {len(model.graph.node)} nodes)")
    return model


class _Tensors:
    """The graph's tensors after shape inference: who produces and reads each, its shape and
    its bytes (as stored, and as an operation really reads or writes it)."""

    def __init__(self, g, info: dict):
        self.info = info  # name -> (shape or None, elem type)
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers = defaultdict(list)  # name -> [(node index, node, input slot)]
        for k, n in enumerate(g.node):
            for j, i in enumerate(n.input):
                if i:
                    self.consumers[i].append((k, n, j))

    def shape(self, name):
        s = self.info.get(name, (None, 0))[0]
        return None if s is None or None in s else s

    def nbytes(self, name) -> float | None:
        s, t = self.info.get(name, (None, 0))
        return None if s is None or None in s else math.prod(s) * itemsize(t)

    def stored(self, name) -> float:
        """Bytes an operation really reads for this input: a dequantized tensor is read in its
        quantized form (the runtime's fused kernel takes the integers)."""
        p = self.producer.get(name)
        if p is not None and p.op_type == "DequantizeLinear":
            return self.nbytes(p.input[0]) or 0.0
        return self.nbytes(name) or 0.0

    def written(self, name) -> float:
        """Bytes an operation really writes: an output that is only re-quantized is written as
        integers by the fused kernel."""
        uses = self.consumers.get(name, [])
        if uses and all(u.op_type == "QuantizeLinear" for _, u, _ in uses):
            return self.nbytes(uses[0][1].output[0]) or 0.0
        return self.nbytes(name) or 0.0


def _constants_and_fixed(g) -> tuple[set[str], set[str]]:
    """The constants (initializers, Constant outputs), and every tensor known before the first
    inference: the constants, what is computed from constants alone, and shape arithmetic."""
    constants = {i.name for i in g.initializer}
    constants |= {n.output[0] for n in g.node if n.op_type == "Constant"}
    derived, meta = set(), set()
    for n in g.node:
        ins = [i for i in n.input if i]
        if n.op_type == "Constant":
            continue
        if n.op_type in ("Shape", "Size"):
            meta.update(n.output)
        elif ins and all(i in constants or i in derived for i in ins):
            derived.update(n.output)
        elif ins and all(i in constants or i in derived or i in meta for i in ins):
            meta.update(n.output)
    return constants, constants | derived | meta


def _operations(g, tensors: _Tensors, constants: set[str], fixed: set[str]):
    """Each operation charged per inference (FLOPs, MACs, bytes moved, precision), the totals by
    op type (every node counted, charged or not), and the op types without a formula."""
    ops, by_op, uncounted = [], defaultdict(lambda: {"count": 0, "flops": 0.0, "macs": 0.0,
                                                     "bytes": 0.0}), defaultdict(int)
    for n in g.node:
        by_op[n.op_type]["count"] += 1
        if n.op_type in ("Constant", "QuantizeLinear", "DequantizeLinear") or n.op_type in VIEWS:
            continue
        if all(o in fixed for o in n.output if o):
            continue
        macs, flops = _work(n, tensors.shape, uncounted)
        moved = (sum(tensors.stored(i) for i in n.input if i)
                 + sum(tensors.written(o) for o in n.output if o))
        op = {"op": n.op_type, "name": n.name, "flops": flops, "macs": macs, "bytes": moved,
              "precision": _precision(n, tensors.producer, tensors.info, constants)}
        ops.append(op)
        agg = by_op[n.op_type]
        agg["flops"] += flops
        agg["macs"] += macs
        agg["bytes"] += moved
    return ops, by_op, uncounted


def _parameters(model, info, consumers) -> dict:
    from onnx import TensorProto

    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    quantized = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4,
                 TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32}
    names = [i.name for i in model.graph.initializer]
    names += [n.output[0] for n in model.graph.node if n.op_type == "Constant"
              and any(a.name == "value" for a in n.attribute)]
    out = {"count": 0, "bytes": 0.0, "by_dtype": defaultdict(int),
           "bytes_by_dtype": defaultdict(float), "excluded": defaultdict(int)}
    for name in dict.fromkeys(names):
        dims, t = info.get(name, (None, 0))
        if dims is None or None in dims:
            continue
        numel = math.prod(dims)
        uses = consumers.get(name, [])
        if any(j in NOT_PARAMETERS.get(n.op_type, ()) for _, n, j in uses):
            norm = any(n.op_type == "BatchNormalization" for _, n, _ in uses)
            why = "batchnorm statistics" if norm else "quantization scales and zero points"
            out["excluded"][why] += numel
            continue
        dequantized = any((n.op_type == "DequantizeLinear" and j == 0)
                          or j in INTEGER_WEIGHTS.get(n.op_type, ()) for _, n, j in uses)
        if numel <= 1 or not (t in floats or (t in quantized and dequantized)):
            continue
        out["count"] += numel
        out["bytes"] += numel * itemsize(t)
        out["by_dtype"][dtype_name(t)] += numel
        out["bytes_by_dtype"][dtype_name(t)] += numel * itemsize(t)
    return {k: dict(v) if isinstance(v, defaultdict) else v for k, v in out.items()}


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _work(n, shape, uncounted) -> tuple[float, float]:
    """(MACs, FLOPs) of one node from the concrete shapes of its inputs and outputs."""
    op, a = n.op_type, _attrs(n)
    y = shape(n.output[0]) if n.output and n.output[0] else None
    inp = lambda k: shape(n.input[k]) if len(n.input) > k and n.input[k] else None  # noqa: E731
    macs = None
    if op in ("Conv", "ConvInteger", "FusedConv", "QLinearConv"):
        w = inp(3 if op == "QLinearConv" else 1)
        if y and w:
            macs = math.prod(y) * math.prod(w[1:])
    elif op == "ConvTranspose":
        x, w = inp(0), inp(1)
        if x and w:
            macs = math.prod(x) * math.prod(w[1:])
    elif op in ("MatMul", "MatMulInteger", "FusedMatMul", "QLinearMatMul",
                "DynamicQuantizeMatMul", "MatMulIntegerToFloat"):
        x = inp(0)
        if y and x:
            macs = math.prod(y) * x[-1]
    elif op == "MatMulNBits":
        if y:
            macs = math.prod(y) * a["K"]
    elif op in ("Gemm", "FusedGemm", "QGemm"):
        x = inp(0)
        if y and x:
            macs = math.prod(y) * (x[0] if a.get("transA", 0) else x[-1])
    elif op in ("LSTM", "GRU", "RNN"):
        x, w = inp(0), inp(1)
        if x and w:
            seq, batch = (x[1], x[0]) if a.get("layout", 0) else (x[0], x[1])
            dirs, gates_h, size = w  # W: [directions, gates * hidden, input]
            hidden = a.get("hidden_size") or gates_h // {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
            macs = seq * batch * dirs * gates_h * (size + hidden)  # input and recurrent GEMMs
    elif op in ("Attention", "QAttention") and n.domain == "com.microsoft":
        macs = _fused_attention_macs(inp)
    elif op in ("Attention", "MultiHeadAttention"):
        macs = _attention_macs(n, a, inp)
    if op in CONTRACTIONS:
        if macs is None:
            uncounted[op] += 1
            return 0.0, 0.0
        return float(macs), 2.0 * macs
    if op in PER_VALUE and y:
        return 0.0, float(PER_VALUE[op] * math.prod(y))
    if op in WINDOWED and y:
        return 0.0, float(math.prod(y) * math.prod(a.get("kernel_shape", [1])))
    if op in REDUCING and inp(0):
        return 0.0, float(math.prod(inp(0)))
    if op not in MOVING and op not in PER_VALUE and op not in WINDOWED and op not in REDUCING:
        uncounted[op] += 1
    return 0.0, 0.0


def _fused_attention_macs(inp) -> float | None:
    """ONNX Runtime's fused BERT attention (com.microsoft Attention, QAttention): the input
    [B, S, H_in] times the packed Q/K/V weight [H_in, 3 x hidden], then QK^T and AV over all
    heads together (2 x S x S x hidden per sequence; the head count cancels out)."""
    x, w = inp(0), inp(1)
    if not (x and w) or len(x) != 3 or len(w) != 2:
        return None
    b, s, _ = x
    hidden = w[1] // 3
    return float(b * s * w[0] * w[1] + 2 * b * s * s * hidden)


def _attention_macs(n, a, inp) -> float | None:
    """QK^T and AV: batch x query heads x query length x key length x (head dim + value dim).
    ONNX Attention (opset 23) takes [B, H, S, D] or [B, S, H*D] with q_num_heads/kv_num_heads;
    com.microsoft.MultiHeadAttention takes [B, S, H*D] with num_heads."""
    q, k, v = inp(0), inp(1), inp(2)
    if not (q and k and v) or len(q) != len(k):
        return None
    past = inp(4) if n.op_type == "Attention" else None
    if len(q) == 4:
        b, hq, sq, d = q
        skv, dv = k[2] + (past[2] if past else 0), v[3]
    elif len(q) == 3:
        hq = a.get("q_num_heads") or a.get("num_heads")
        hkv = a.get("kv_num_heads") or hq
        if not hq:
            return None
        b, sq, d = q[0], q[1], q[2] // hq
        skv, dv = k[1] + (past[2] if past else 0), v[2] // hkv
    else:
        return None
    return float(b * hq * sq * skv * (d + dv))


def _precision(n, producer, info, constants) -> str:
    """The arithmetic an op runs in: integer when both its operands are dequantized integers
    (runtimes fuse DQ -> Conv -> Q into an integer kernel), else the float type it produces."""
    if n.op_type in ("QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm"):
        return "int8"
    if n.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm") and len(n.input) > 1:
        srcs = []
        for name in n.input[:2]:
            p = producer.get(name)
            srcs.append(dtype_name(info.get(p.input[0], (None, 0))[1])
                        if p is not None and p.op_type == "DequantizeLinear" else None)
        if all(s in ("int8", "uint8") for s in srcs):
            return "int8"
        if all(s in ("int4", "uint4", "int8", "uint8") for s in srcs):
            return "int4"
    t = info.get(n.output[0], (None, 1))[1] if n.output else 1
    name = dtype_name(t)
    return name if name in ("fp32", "fp16", "bf16", "fp64") else "fp32"


def _activations(g, info, producer, consumers, fixed, nbytes) -> dict:
    """Total and peak activation bytes, with buffers freed after their last reader."""
    index = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    root = {}

    def find(name):
        while name in root:
            name = root[name]
        return name

    size = {}
    for n in g.node:
        out = n.output[0] if n.output else ""
        if not out or out in fixed:
            continue
        src = n.input[0] if n.input else ""
        if n.op_type in VIEWS or n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            if src and src not in fixed:
                root[out] = src  # a view, or the fused Q/DQ of an activation: no new buffer
                if n.op_type == "QuantizeLinear" and all(
                        u.op_type == "QuantizeLinear" for _, u, _ in consumers[src]):
                    size[find(src)] = nbytes(out) or 0.0  # only ever stored quantized
                continue
        for o in n.output:
            if o and o not in fixed:
                size.setdefault(o, nbytes(o) or 0.0)
    inputs = [i.name for i in g.input if i.name not in fixed]
    for name in inputs:
        size[name] = nbytes(name) or 0.0
    end = defaultdict(lambda: -1)
    for name, uses in consumers.items():
        if name in fixed:
            continue
        r = find(name)
        end[r] = max(end[r], max(k for k, _, _ in uses))
    last = len(g.node)
    for o in g.output:
        end[find(o.name)] = last
    events = defaultdict(float)
    for name, b in size.items():
        start = index.get(name, -1)
        events[start] += b
        events[max(end[name], start) + 1] -= b
    live = peak = 0.0
    for k in sorted(events):
        live += events[k]
        peak = max(peak, live)
    produced = {k: v for k, v in size.items() if k not in inputs}
    largest = max(produced.items(), key=lambda kv: kv[1]) if produced else ("", 0.0)
    io = sum(size[i] for i in inputs) + sum(nbytes(o.name) or 0 for o in g.output)
    return {"total_bytes": sum(produced.values()), "peak_bytes": peak, "io_bytes": io,
            "largest_tensor": largest[0], "largest_bytes": largest[1]}
