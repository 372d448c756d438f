"""What a Python process's CPU looks like to the libraries, and what ONNX Runtime's u8 x s8
MatMul makes of full-range and 7-bit weights there: asked by ``tests/test_cpu_emulation.py``
inside the emulated AVX2 CPU (``tests/python-avx2``)."""
from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import numpy as np

from tests.stages.support import exact_dynamic_matmul


def features() -> dict:
    """The instruction sets as the libraries that dispatch on cpuid see them. Not torch: the
    emulated run also sets the caps, and ``ATEN_CPU_CAPABILITY=avx2`` makes torch say AVX2 on any
    CPU (its import alone took 9 s of the emulated run's 40)."""
    from numpy._core._multiarray_umath import __cpu_features__ as numpy_cpu

    out = {"numpy": {k: bool(numpy_cpu.get(k)) for k in
                     ("AVX2", "FMA3", "AVX512F", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI")}}
    out["openvino"] = openvino_capabilities()
    return out


def openvino_capabilities() -> list[str] | None:
    """OpenVINO's CPU plugin's ``OPTIMIZATION_CAPABILITIES`` (None where OpenVINO is not
    installed), asked in a child as every OpenVINO session of the emulated files is: their test
    process never holds OpenVINO or the threads its import starts. Two whole-suite runs whose
    emulated AVX2 child asked here first, in the test process, hung waiting on a later OpenVINO
    child."""
    if importlib.util.find_spec("openvino") is None:
        return None
    from pipeline.core import isolate

    return isolate.call("OpenVINO's CPU capabilities", _capabilities)


def _capabilities() -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def u8s8_error(reduce_range: bool) -> float:
    """Dynamic INT8 of one MatMul (onnxruntime.quantization, signed symmetric weights per
    channel; ``reduce_range``: 7-bit weights) on the worst case for AVX2's vpmaddubsw, activations
    near 255 times weights near the top of their range: ONNX Runtime's output against the exact
    integer product of the same quantized values, as a share of the largest output (0: exact; a
    16-bit pair sum that saturated costs tens of percent)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w = rng.uniform(0.9, 1.0, size=(64, 16)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], "mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 16])],
        [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with tempfile.TemporaryDirectory() as tmp:
        f, q = Path(tmp) / "f.onnx", Path(tmp) / "q.onnx"
        onnx.save(m, str(f))
        quantize_dynamic(str(f), str(q), per_channel=True, reduce_range=reduce_range,
                         weight_type=QuantType.QInt8)
        inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(q)).graph.initializer}
        x = rng.uniform(0.95, 1.0, size=(2, 5, 64)).astype(np.float32)
        got = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
    want = exact_dynamic_matmul(x, inits["w_quantized"], inits["w_scale"])
    return float(np.abs(got - want).max() / np.abs(want).max())
