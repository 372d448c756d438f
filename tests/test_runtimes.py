"""The runtime layer on tiny ONNX graphs: OpenVINO against ONNX Runtime, the executed precision
read back from each engine, the precision checks, per-runtime failures, and cache keys."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.core import isolate
from pipeline import runtimes
from pipeline.engine.compose import compose
from pipeline.config import HardwareConfig
from pipeline.core.errors import ConfigError, StageError
from pipeline.runtimes import Target
from tests.conftest import run_cli
from tests.cpu_probe import openvino_capabilities

HW = HardwareConfig().target()
needs_openvino = pytest.mark.skipif(not runtimes.installed("openvino"),
                                    reason="openvino is not installed")


def conv_net(path, seed: int = 0):
    """image [N,3,16,16] -> Conv 3->8 -> Relu -> Flatten -> MatMul -> [N,10]."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, (8,)).astype(np.float32), "b")
    fc = numpy_helper.from_array(rng.normal(0, 0.05, (8 * 16 * 16, 10)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["image", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"], axis=1),
             helper.make_node("MatMul", ["f", "fc"], ["logits"])]
    graph = helper.make_graph(nodes, "conv_net",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                             ["n", 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                             ["n", 10])], [w, b, fc])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def qdq(src, dst):
    """Static INT8 in QDQ format, as the quantize stage writes it: u8 activations, s8 weights,
    and the weight range the pipeline picks for the instruction set in use (7-bit without VNNI,
    where the AVX2 sequence saturates 16-bit sums and the engines' outputs would differ)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from pipeline.quant import defaults as quant_defaults
    from pipeline.config import QuantConfig
    from pipeline.core.env import effective_flags

    settings = quant_defaults.resolve(QuantConfig(), effective_flags())

    rng = np.random.default_rng(1)

    class Reader:
        def __init__(self):
            self.batches = iter([{"image": rng.random((4, 3, 16, 16), np.float32)}
                                 for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    reduce_range=settings.reduce_range)
    return dst


def images(n=4, seed=2):
    return np.random.default_rng(seed).random((n, 3, 16, 16), np.float32)


def on(model, target: Target, x) -> dict:
    """Load, run and describe in a child process: runtimes set process-global thread pools,
    which must not leak into the test process. Each child imports OpenVINO itself: its import
    starts a thread (gone a moment later), and a forkserver that had imported it could fork
    while that thread held a lock no thread of the child would release."""
    return isolate.call(f"probe {target}", runtimes.probe, model,
                        runtimes.settings_for(HW, target), x)


ORT, OV, OV_BF16 = Target("onnxruntime", "fp32"), Target("openvino", "fp32"), \
    Target("openvino", "bf16")


@needs_openvino
def test_openvino_runs_onnx_like_onnxruntime(tmp_path, isa):
    model = conv_net(tmp_path / "m.onnx")
    x = images()
    ort_out = on(model, ORT, x)["output"]
    ov = on(model, OV, x)
    assert ov["output"].shape == ort_out.shape == (4, 10)
    np.testing.assert_allclose(ov["output"], ort_out, rtol=1e-4, atol=1e-4)
    info = ov["describe"]
    # every setting explicit, and read back from the compiled model: f32 really is f32 here
    assert info["settings"] == {"device": "CPU", "INFERENCE_NUM_THREADS": 2,
                                "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    assert "float32" in info["compiled"]["INFERENCE_PRECISION_HINT"]
    assert info["executed"]["ops"]["Convolution"] == {"fp32": 1}


@needs_openvino
def test_qdq_model_is_read_back_as_int8_on_both_runtimes(tmp_path, isa):
    if "INT8" not in openvino_capabilities():
        pytest.skip("this CPU plugin reports no INT8 capability (no VNNI/AMX-INT8 kernels)")
    model = qdq(conv_net(tmp_path / "m.onnx"), tmp_path / "int8.onnx")
    x = images()
    on_ov = on(model, OV, x)
    ex = on_ov["describe"]["executed"]
    assert ex["ops"]["Convolution"] == {"int8": 1}, ex
    assert ex["conv_matmul_int8_share"] == 1.0
    on_ort = on(model, ORT, x)
    assert on_ort["describe"]["executed"]["ops"]["QLinearConv"] == {"int8": 1}
    # the float model is read back as float: the INT8 reading is not a constant
    float_ex = on(tmp_path / "m.onnx", OV, x)["describe"]["executed"]
    assert float_ex["ops"]["Convolution"] == {"fp32": 1}
    assert float_ex["conv_matmul_int8_share"] == 0.0
    ref = on_ort["output"]
    np.testing.assert_allclose(on_ov["output"], ref, atol=0.05 * np.abs(ref).max())


@needs_openvino
def test_bf16_precision_is_what_executes(tmp_path):
    if not runtimes.cpu_supports("bf16"):
        pytest.skip("this CPU has neither avx512_bf16 nor amx_bf16")
    model = conv_net(tmp_path / "m.onnx")
    x = images()
    bf16 = on(model, OV_BF16, x)
    info = bf16["describe"]
    assert info["executed"]["ops"]["Convolution"] == {"bf16": 1}
    assert "bfloat16" in info["compiled"]["INFERENCE_PRECISION_HINT"]
    f32 = on(model, OV, x)["output"]
    diff = np.abs(bf16["output"] - f32)
    assert 0 < diff.max() < 0.05 * np.abs(f32).max()  # bf16 rounding: close, not identical


@pytest.mark.parametrize("overrides, flags, expected", [
    (["hardware.runtime=openvino", "hardware.precision=bf16"], {"avx512f", "avx2"},
     "hardware.precision=bf16: this CPU has neither avx512_bf16 nor amx_bf16"),
    (["hardware.runtime=openvino", "hardware.precision=fp16"], {"avx512_bf16"},
     "hardware.precision=fp16: this CPU has neither avx512_fp16 nor amx_fp16 (its float flags: "
     "avx512_bf16); valid here: fp32, bf16"),
    (["hardware.precision=bf16"], {"avx512_bf16"},
     "hardware.precision=bf16: onnxruntime runs float ops on the CPU in fp32 only"),
    (["quant=bf16"], {"amx_bf16"}, "quant=bf16: onnxruntime runs float ops on the CPU in fp32"),
    (["quant=bf16", "hardware.runtime=auto"], set(), "quant=bf16: this CPU has neither"),
    (["hardware=l4", "hardware.runtime=openvino"], {"avx512_bf16"},
     "hardware.runtime=openvino: OpenVINO targets run on the CPU here; hardware=l4 is a gpu"),
])
def test_precision_and_runtime_checks_are_one_line(overrides, flags, expected):
    cfg = compose(overrides)
    with pytest.raises(ConfigError) as e:
        runtimes.check(cfg.hardware, cfg.quant.mode, flags=frozenset(flags))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_supported_settings_pass_the_check():
    for overrides in (["hardware.runtime=openvino", "hardware.precision=bf16"],
                      ["quant=bf16", "hardware.runtime=auto"], []):
        cfg = compose(overrides)
        runtimes.check(cfg.hardware, cfg.quant.mode, flags=frozenset({"amx_bf16"}))


def test_cli_refuses_a_precision_before_building(tmp_path):
    proc = run_cli("hardware.precision=bf16", f"workdir={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "hardware.precision=bf16" in lines[0], proc.stderr
    assert not any(tmp_path.iterdir())


@needs_openvino
def test_unsupported_operator_fails_on_its_runtime_only(tmp_path):
    """ONNX's Det has an ONNX Runtime kernel and no OpenVINO conversion rule."""
    det = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph([det], "det", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["n", 2, 2])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(tmp_path / "det.onnx"))
    x = np.array([[[2, 0], [0, 3]]], np.float32)
    assert on(tmp_path / "det.onnx", ORT, x)["output"][0] == pytest.approx(6.0)
    with pytest.raises(StageError) as e:
        on(tmp_path / "det.onnx", OV, x)
    msg = str(e.value)
    assert "openvino fp32: cannot read det.onnx" in msg and "Det" in msg and "\n" not in msg


def test_targets_offer_only_what_this_cpu_and_runtime_have():
    found, missing = runtimes.targets(frozenset({"avx512f"}))
    assert Target("onnxruntime", "fp32") in found
    assert all(t.precision == "fp32" for t in found)
    assert "openvino bf16" in missing or "openvino" in missing
    assert missing["onnxruntime bf16"].startswith("onnxruntime has no bf16")


@dataclass(frozen=True)
class HardwareRuntimeBefore:
    """HardwareRuntime as it was before runtimes existed."""
    name: str
    provider: str
    intra_op_threads: int
    inter_op_threads: int
    affinity: Optional[tuple[int, ...]] = None


def test_default_target_keeps_the_cache_keys(tmp_path):
    from pipeline.config import BenchConfig, LoadConfig
    from pipeline.core.env import hardware_fingerprint
    from pipeline.task.contract import DataSplit
    from pipeline.engine.runner import Runner
    from pipeline.stages.benchmark import Benchmark
    from pipeline.stages.evaluate import Evaluate
    from pipeline.stages.loadtest import LoadTest

    before = HardwareRuntimeBefore(HW.name, HW.provider, HW.intra_op_threads,
                                   HW.inter_op_threads, HW.affinity)
    ov = runtimes.settings_for(HW, Target("openvino", "fp32"))
    assert hardware_fingerprint(HW) == hardware_fingerprint(before)
    assert hardware_fingerprint(ov) != hardware_fingerprint(HW)
    split = DataSplit("ocr", "evaluation", 2000, "calibration", "0" * 64)  # keys only: no data
    for make in (lambda hw: Evaluate(split, 64, hw),
                 lambda hw: Benchmark(split, BenchConfig(), hw),
                 lambda hw: LoadTest(split, "load", LoadConfig(), 200.0, hw)):
        keys = {name: Runner(tmp_path, hw).key(make(hw), None, {})
                for name, hw in (("now", HW), ("before", before), ("openvino", ov),
                                 ("bf16", dataclasses.replace(ov, precision="bf16")))}
        assert keys["now"] == keys["before"]
        assert len({keys["now"], keys["openvino"], keys["bf16"]}) == 3
    auto = Benchmark(split, BenchConfig(), dataclasses.replace(HW, runtime="auto"),
                     (("onnxruntime", "fp32"),))
    assert Runner(tmp_path, HW).key(auto, None, {}) != keys["now"]


def test_triton_export_follows_the_gated_runtime():
    from pipeline.registry.triton import config_pbtxt

    io = ([("image", "TYPE_FP32", [-1, 1, 32, -1])], [("logits", "TYPE_FP32", [-1, -1, 37])])
    evidence = {"config": {"hardware": {"intra_op_threads": 2, "inter_op_threads": 1},
                           "bench": {"batch_sizes": [1, 8]}},
                "runtime": {"deployed": {"runtime": "openvino", "precision": "bf16",
                                         "performance_hint": "latency", "intra_op_threads": 2,
                                         "version": "2026.4.1"}}}
    text = config_pbtxt("ocr", *io, 8, 1, "KIND_CPU", evidence, "ocr:x@sha256:y")
    assert 'backend: "openvino"' in text and 'default_model_filename: "model.onnx"' in text
    assert "onnxruntime" not in text.split("# gated on")[1].split("\n", 1)[1]
    for key, value in (("INFERENCE_NUM_THREADS", "2"), ("PERFORMANCE_HINT", "LATENCY"),
                       ("HINT_BF16", "YES"), ("NUM_STREAMS", "1")):
        assert f'key: "{key}"\n  value: {{ string_value: "{value}" }}' in text
    assert "# gated on: openvino 2026.4.1, precision bf16" in text
    evidence["runtime"]["deployed"]["precision"] = "fp32"  # no Triton key forces f32: said so
    text = config_pbtxt("ocr", *io, 8, 1, "KIND_CPU", evidence, "ocr:x@sha256:y")
    assert 'key: "HINT_BF16"' not in text and "has no key" in text
    del evidence["runtime"]  # evidence from before runtimes: ONNX Runtime, as it was
    text = config_pbtxt("ocr", *io, 8, 1, "KIND_CPU", evidence, "ocr:x@sha256:y")
    assert 'platform: "onnxruntime_onnx"' in text and 'key: "intra_op_thread_count"' in text
    assert text.count("{") == text.count("}")
    assert "# gated on: onnxruntime, precision fp32, 2 threads" in text


def test_a_recorded_deployed_runtime_is_read_with_its_runs_settings_where_it_lacks_them():
    """What the server and the Triton export run: the record where it says, the run's own
    hardware settings where it is silent or null (evidence from before runtimes were
    recorded), ONNX Runtime in fp32 where nothing says."""
    from pipeline.runtimes.record import Deployed

    hw = {"intra_op_threads": 4, "inter_op_threads": 1, "performance_hint": "throughput"}
    old = Deployed.read(None, hw)
    assert (old.runtime, old.precision, old.performance_hint, old.intra_op_threads) == (
        "onnxruntime", "fp32", "throughput", 4)
    assert Deployed.read({}).performance_hint == "latency" and Deployed.read({}).version is None
    rec = Deployed.read({"runtime": "openvino", "precision": "bf16", "intra_op_threads": None,
                         "performance_hint": "latency", "settings": {"disabled_optimizers":
                                                                     ["GeluFusion"]}}, hw)
    assert (rec.runtime, rec.precision, rec.performance_hint) == ("openvino", "bf16", "latency")
    assert rec.intra_op_threads == 4 and rec.disabled_optimizers == ["GeluFusion"]
