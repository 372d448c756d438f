"""Cold start: time from a fresh process to the first result, per model and runtime.

In: an ONNX model path and the target's settings (runtime, precision, threads). Out: medians over
``repeats`` fresh Python processes of: interpreter start and runtime import, session creation or
compilation (file load, graph optimization, kernel selection), and the first inference; plus the
total wall time seen from the parent. This is what an autoscaled or serverless replica pays
before it can answer, and it differs per engine (OpenVINO compiles, ONNX Runtime optimizes the
graph). A fresh ``subprocess`` (not a fork) is used so nothing is already imported or cached in
memory; each child imports only its runtime, with the settings the benchmark ran it with.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

_PRINT = r"""
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "session_ms": (t2 - t1) * 1e3,
                  "first_inference_ms": (t3 - t2) * 1e3}))
"""
_CHILD = {
    "onnxruntime": r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import onnxruntime as ort
t1 = time.perf_counter()
s = json.loads(sys.argv[2])
so = ort.SessionOptions()
so.intra_op_num_threads = s["intra_op_threads"]; so.inter_op_num_threads = s["inter_op_threads"]
sess = ort.InferenceSession(sys.argv[1], so, providers=[s["provider"]],
                            disabled_optimizers=s.get("disabled_optimizers") or None)
t2 = time.perf_counter()
sess.run(None, {n: np.zeros(shape, dtype) for n, shape, dtype in s["inputs"]})
t3 = time.perf_counter()
""" + _PRINT,
    "openvino": r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import openvino as ov
t1 = time.perf_counter()
s = json.loads(sys.argv[2])
compiled = ov.Core().compile_model(sys.argv[1], "CPU", s["config"])
request = compiled.create_infer_request()
t2 = time.perf_counter()
request.infer({n: np.zeros(shape, dtype) for n, shape, dtype in s["inputs"]})
t3 = time.perf_counter()
""" + _PRINT,
}


def _settings(hardware, example: dict, model) -> dict:
    out = {"inputs": [[n, [int(d) for d in a.shape], str(a.dtype)] for n, a in example.items()],
           "provider": hardware.provider,
           "intra_op_threads": hardware.intra_op_threads,
           "inter_op_threads": hardware.inter_op_threads}
    if hardware.runtime == "onnxruntime":
        from pipeline.runtimes.onnxruntime import disabled_optimizers

        out["disabled_optimizers"] = disabled_optimizers(model)
    if hardware.runtime == "openvino":
        from pipeline.runtimes.openvino import compile_config

        out["config"] = compile_config(hardware)
    return out


def measure(model, hardware, repeats: int, example: dict) -> dict:
    """``example``: the feeds of one request (input name -> array); zeros of their shapes and
    dtypes are what the fresh process runs first."""
    runtime = getattr(hardware, "runtime", "onnxruntime")
    if runtime not in _CHILD:
        return {"error": f"no cold-start probe for runtime {runtime!r}"}
    rows = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD[runtime], str(model),
                               json.dumps(_settings(hardware, example, model))],
                              capture_output=True, text=True)
        total = (time.perf_counter() - t0) * 1e3
        if proc.returncode != 0:
            return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
        rows.append({**json.loads(proc.stdout.strip().splitlines()[-1]), "total_ms": total})
    return {k: float(np.median([r[k] for r in rows])) for k in rows[0]} | {
        "repeats": repeats, "runtime": runtime}
