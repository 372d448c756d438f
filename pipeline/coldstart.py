"""Cold start: time from a fresh process to the first result, per model.

In: an ONNX model path and the hardware settings. Out: medians over ``repeats`` fresh Python
processes of: interpreter start and runtime import, session creation (file load, graph
optimization, kernel selection), and the first inference; plus the total wall time seen from the
parent. This is what an autoscaled or serverless replica pays before it can answer. A fresh
``subprocess`` (not a fork) is used so nothing is already imported or cached in memory.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import onnxruntime as ort
t1 = time.perf_counter()
so = ort.SessionOptions()
so.intra_op_num_threads = int(sys.argv[2]); so.inter_op_num_threads = int(sys.argv[3])
sess = ort.InferenceSession(sys.argv[1], so, providers=[sys.argv[4]])
t2 = time.perf_counter()
inp = sess.get_inputs()[0]
sess.run(None, {inp.name: np.zeros(json.loads(sys.argv[5]), np.float32)})
t3 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "session_ms": (t2 - t1) * 1e3,
                  "first_inference_ms": (t3 - t2) * 1e3}))
"""


def measure(model, hardware, repeats: int, shape: tuple[int, ...]) -> dict:
    rows = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(model),
                               str(hardware.intra_op_threads), str(hardware.inter_op_threads),
                               hardware.provider, json.dumps([int(d) for d in shape])],
                              capture_output=True, text=True)
        total = (time.perf_counter() - t0) * 1e3
        if proc.returncode != 0:
            return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
        rows.append({**json.loads(proc.stdout), "total_ms": total})
    return {k: float(np.median([r[k] for r in rows])) for k in rows[0]} | {"repeats": repeats}
