"""ONNX op types by role: the one home of every op-type table.

In: nothing; read by the stages (names, quantize, explain), the INT8 sub-recipe and the runtime
backends. Out: tuples of op types (``INT8_KERNELS`` holds prefixes), and ``executed_summary``,
what a backend reports its compute ops ran in. The tables overlap on
purpose and differ by what they are for: ``NAMED_OPS`` (nodes that get their module's name and a
precision in the reports) includes pools and activations, ``COMPUTE_OPS`` (whose *executed*
precision a runtime reports) holds only the compute-heavy ops under both runtimes' names.
"""
from __future__ import annotations

# Nodes renamed after their torch module and given a precision in the report (stages/_names.py,
# stages/quantize.py): the compute ops, plus the pools and activations a reader looks for.
NAMED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN", "Attention",
             "MaxPool", "AveragePool", "GlobalAveragePool", "Relu", "Add", "Mul", "Sigmoid",
             "HardSigmoid", "HardSwish", "Softmax")
# Ops with weights: an output node of one of these keeps its INT8 kernel (recipes/int8.py).
WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN")
# Ops whose executed precision is the point of INT8 or BF16: the compute-heavy ones, under
# ONNX Runtime's and OpenVINO's names.
COMPUTE_OPS = ("Conv", "MatMul", "Gemm", "LSTM", "GRU", "RNN", "FullyConnected", "Convolution",
               "RNNSeq", "RNNCell", "Deconvolution", "GroupConvolution")
# Convolutions and matmuls (recurrent layers aside): the share of these that ran in INT8 kernels
# proves a QDQ model runs as INT8.
GEMM_LIKE = ("Conv", "MatMul", "Gemm", "FullyConnected", "Convolution", "Deconvolution",
             "GroupConvolution")
# What the dynamic quantizer puts in place of a float node.
DYNAMIC_INT8_OPS = ("DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulInteger",
                    "ConvInteger", "QAttention")
# Prefixes of ONNX Runtime's INT8 kernels after its graph optimizations.
INT8_KERNELS = ("QLinear", "ConvInteger", "MatMulInteger", "DynamicQuantize",
                "MatMulIntegerToFloat", "QAttention")  # QAttention: a transformer's fused one
# Quantize/dequantize: format conversions, not compute.
FORMAT_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
# Shape and layout ops: neither compute nor a format conversion.
SHAPE_OPS = ("Shape", "Gather", "Slice", "Concat", "Reshape", "Squeeze", "Unsqueeze", "Expand",
             "Transpose", "Cast", "Identity", "Constant", "ReorderInput", "ReorderOutput")
# Op types ONNX Runtime's CPU provider has no INT8 kernel (or Q/DQ fusion) for: between a
# DequantizeLinear and a QuantizeLinear they still compute in float.
NO_INT8_KERNEL = ("HardSigmoid", "HardSwish")
# Activations ONNX Runtime fuses into the conv before them (an NCHWc kernel takes their name).
ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh")


def executed_summary(ops: dict[str, dict[str, int]]) -> dict:
    """{op type: {precision: count}}, and the share of convolutions and matmuls (recurrent
    layers aside) that executed in INT8 kernels: 1.0 proves a QDQ model runs as INT8."""
    kinds = {p for counts in ops.values() for p in counts}
    gemm = {op: c for op, c in ops.items()
            if any(op.endswith(g) or op.startswith(g) or g in op for g in GEMM_LIKE)}
    total = sum(sum(c.values()) for c in gemm.values())
    int8 = sum(c.get("int8", 0) for c in gemm.values())
    return {"ops": ops, "precisions": sorted(kinds),
            "conv_matmul_int8_share": int8 / total if total else None}
