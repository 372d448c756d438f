"""The OpenVINO backend: the same ONNX files compiled by OpenVINO's CPU plugin.

In: an ONNX file (FP32, FP16 or the QDQ INT8 from the quantize stage) and the target's settings.
Out: a compiled model with one synchronous infer request; ``run`` returns a copy of the first
output. Compiled with every setting explicit, because OpenVINO's defaults depend on the CPU:
``INFERENCE_NUM_THREADS`` (the target's intra-op threads), ``PERFORMANCE_HINT`` and
``INFERENCE_PRECISION_HINT``. The last matters most: on a CPU with AVX512-BF16 or AMX the
default is bf16, not f32, and a model gated in f32 would ship in bf16 (about a point of accuracy
on a real OCR recognizer). ``describe`` reads back the compiled properties and, from
the runtime model OpenVINO actually executes (``get_runtime_model()``, each node's ``layerType``
and ``runtimePrecision``), the precision every convolution, fully-connected and RNN layer runs
in, so a QDQ model is proven to execute in INT8 kernels rather than dequantized to float.
Deliberately not handled: GPU/NPU devices, several streams with asynchronous requests, model
caching across processes.
"""
from __future__ import annotations

from pathlib import Path

NAME = "openvino"
HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
# OpenVINO element types -> this project's precision names.
PRECISION_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16", "u8": "int8", "i8": "int8",
                   "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_core = None


def version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("openvino")
    except metadata.PackageNotFoundError:
        return None


def precisions() -> tuple[str, ...]:
    return tuple(HINTS)


def core():
    global _core
    if _core is None:
        import openvino as ov

        _core = ov.Core()
    return _core


def compile_config(settings) -> dict:
    """The explicit compile settings (also what the Triton export writes)."""
    return {"INFERENCE_NUM_THREADS": int(settings.intra_op_threads),
            "PERFORMANCE_HINT": settings.performance_hint.upper(),
            "INFERENCE_PRECISION_HINT": HINTS[settings.precision]}


class OvModel:
    def __init__(self, model: Path, settings):
        from pipeline.runtimes.failure import RuntimeFailure, first_line

        self.settings = settings
        c = core()
        what = f"{NAME} {settings.precision}"
        if settings.precision == "fp16" and "FP16" not in c.get_property("CPU",
                                                                          "OPTIMIZATION_CAPABILITIES"):
            raise RuntimeFailure(f"{what}: this CPU plugin offers no FP16 inference")
        try:
            ov_model = c.read_model(str(model))
        except Exception as e:  # noqa: BLE001 - e.g. an operator its ONNX frontend lacks
            raise RuntimeFailure(f"{what}: cannot read {model.name}: {first_line(e)}") from None
        try:
            self.compiled = c.compile_model(ov_model, "CPU", compile_config(settings))
        except Exception as e:  # noqa: BLE001
            raise RuntimeFailure(f"{what}: compile failed: {first_line(e)}") from None
        self.request = self.compiled.create_infer_request()

    def run(self, batch):
        # share_inputs: no copy of the input (as ONNX Runtime binds numpy memory); the output is
        # copied, since the request's buffer is reused by the next call.
        feeds = batch if isinstance(batch, dict) else {0: batch}
        return self.request.infer(feeds, share_inputs=True)[0]

    def describe(self, example=None) -> dict:
        if example is not None:
            self.run(example)
        props = {}
        for key in ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "PERFORMANCE_HINT",
                    "NUM_STREAMS", "EXECUTION_DEVICES"):
            try:
                props[key] = str(self.compiled.get_property(key))
            except Exception:  # noqa: BLE001 - a property this version does not report
                continue
        return {"runtime": NAME, "version": version(), "precision": self.settings.precision,
                "settings": {"device": "CPU", **compile_config(self.settings)},
                "compiled": props, "executed": executed(self.compiled)}


def executed(compiled) -> dict:
    """Per layer type, the precision OpenVINO's runtime model executes it in."""
    from pipeline.runtimes.ops import COMPUTE_OPS, executed_summary

    ops: dict[str, dict[str, int]] = {}
    for node in compiled.get_runtime_model().get_ordered_ops():
        info = node.get_rt_info()
        layer = info["layerType"].astype(str) if "layerType" in info else node.get_type_name()
        if layer not in COMPUTE_OPS:
            continue
        raw = info["runtimePrecision"].astype(str) if "runtimePrecision" in info else "?"
        precision = PRECISION_NAMES.get(raw.lower(), raw)
        ops.setdefault(layer, {}).setdefault(precision, 0)
        ops[layer][precision] += 1
    return executed_summary(ops)


def load(model: Path, settings) -> OvModel:
    return OvModel(model, settings)
