"""probe: this machine's memory bandwidth and matrix-multiply throughput, for ``conf/hardware/cpu.yaml``.

In: a thread count (the profile's ``intra_op_threads``) and a few seconds. Out: best-of-N numbers:
copy bandwidth of a 256 MiB array (numpy, and torch on the given threads), counted STREAM-style
as bytes read plus bytes written; GEMM throughput for FP32 (numpy's BLAS, torch and ONNX
Runtime's MatMul, the best of the three), BF16 and FP16
(torch) and INT8 (``torch._int_mm``: int8 x int8 -> int32, checked against an exact product);
and the host's memory from /proc/meminfo. numpy and torch do the work. The best run is kept
because the question is what the hardware can do, not what a busy moment allowed; numbers taken
while other processes run are still lower bounds (the output says what else was running).
Deliberately not handled: cache-resident bandwidth, NUMA, turbo behaviour over minutes, and the
kernels ONNX Runtime itself picks (the pipeline's benchmark measures those).
"""
from __future__ import annotations

import os
import time

import numpy as np

BANDWIDTH_BYTES = 256 * 2 ** 20   # far beyond any L3, so the copy streams through DRAM
GEMM_N = 2048                     # 17 GFLOP per FP32 product: long enough to time, short to run
SMALL_N = 512                     # a first, smaller product for types that may lack fast kernels


def _best(fn, seconds: float, max_runs: int = 20) -> float:
    fn()  # warm-up: page faults, thread start, kernel choice
    best, t_end, runs = float("inf"), time.perf_counter() + seconds, 0
    while runs < 2 or (time.perf_counter() < t_end and runs < max_runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best


def bandwidth(threads: int, seconds: float = 1.0) -> dict:
    import torch

    torch.set_num_threads(threads)
    n = BANDWIDTH_BYTES // 8
    src, dst = np.ones(n), np.empty(n)
    out = {"numpy_copy_gbs": 2 * src.nbytes / _best(lambda: np.copyto(dst, src), seconds) / 1e9}
    ts, td = torch.ones(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    out["torch_copy_gbs"] = 2 * ts.nbytes / _best(lambda: td.copy_(ts), seconds) / 1e9
    out["best_gbs"] = max(out["numpy_copy_gbs"], out["torch_copy_gbs"])
    return out


def _slow(rate_small: float, fp32_rate: float) -> bool:
    """Without native arithmetic for a type torch falls back to a loop that takes minutes at
    full size (and slows down further once out of cache); a smaller product at under a fifth
    of FP32's rate says so first."""
    return rate_small < 0.2 * fp32_rate


def gemm(threads: int, seconds: float = 2.0, n: int = GEMM_N) -> dict:
    import torch

    torch.set_num_threads(threads)
    flop = 2.0 * n ** 3
    small_n = n // 4 if n < GEMM_N else SMALL_N
    out = {}
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    out["fp32_numpy"] = flop / _best(lambda: a @ a, seconds) / 1e12
    out["fp32_onnxruntime"] = flop / _best(_ort_matmul(a, threads), seconds) / 1e12
    for name, dtype in (("fp32_torch", torch.float32), ("bf16_torch", torch.bfloat16),
                        ("fp16_torch", torch.float16)):
        x = torch.from_numpy(a).to(dtype)
        small = x[:small_n, :small_n].contiguous()
        t_small = _best(lambda: small @ small, min(0.3, seconds), 5)
        if dtype != torch.float32 and _slow(2 * small_n ** 3 / t_small, out["fp32_numpy"] * 1e12):
            out[name] = 2 * small_n ** 3 / t_small / 1e12
            out[f"{name}_note"] = f"no fast path; measured on {small_n} x {small_n}"
            continue
        out[name] = flop / _best(lambda: x @ x, seconds) / 1e12
    q = torch.randint(-128, 128, (n, n), dtype=torch.int8)
    if hasattr(torch, "_int_mm"):
        check = torch._int_mm(q[:64, :64], q[:64, :64].t().contiguous())
        exact = q[:64, :64].to(torch.int32) @ q[:64, :64].t().to(torch.int32)
        if torch.equal(check, exact):
            # without VNNI/AMX torch's int8 product is a slow generic loop: the same first check
            small = q[:small_n, :small_n].contiguous()
            t_small = _best(lambda: torch._int_mm(small, small), min(0.3, seconds), 3)
            if _slow(2 * small_n ** 3 / t_small, out["fp32_numpy"] * 1e12):
                out["int8_torch"] = 2 * small_n ** 3 / t_small / 1e12
                out["int8_torch_note"] = f"no fast path; measured on {small_n} x {small_n}"
            else:
                out["int8_torch"] = flop / _best(lambda: torch._int_mm(q, q), seconds) / 1e12
    return out


def _ort_matmul(a: np.ndarray, threads: int):
    """One FP32 MatMul on ONNX Runtime's own kernels (MLAS), the ones the pipeline's models run:
    numpy's and torch's BLAS can pick narrower kernels on a new CPU (on an AMD EPYC with
    AVX512-VP2INTERSECT, 0.28 and 0.24 TFLOP/s against MLAS's 0.48 on 2 cores), and a peak below
    what the model itself reaches is no floor."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    n = a.shape[0]
    info = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "abc"]
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm", info[:2],
                          info[2:])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    feeds = {"a": a, "b": a}
    return lambda: sess.run(None, feeds)


def memory_gb() -> float | None:
    from pipeline.core.env import meminfo_bytes

    total = meminfo_bytes("MemTotal")
    return total / 1e9 if total is not None else None


def busy_processes() -> list[str]:
    """Other processes using CPU now: the reason a probe may read low."""
    import subprocess

    try:
        ps = subprocess.run(["ps", "-eo", "pid,pcpu,comm", "--sort=-pcpu"], capture_output=True,
                            text=True, timeout=5).stdout.splitlines()[1:]
    except (OSError, subprocess.SubprocessError):
        return []
    me = os.getpid()
    return [ln.strip() for ln in ps if float(ln.split()[1]) >= 20 and int(ln.split()[0]) != me]


def probe(threads: int, seconds: float = 2.0, n: int = GEMM_N) -> dict:
    from pipeline.core.env import cpu_info

    t0 = time.time()
    bw = bandwidth(threads, seconds / 2)
    mm = gemm(threads, seconds, n)
    # A type without a fast path is left out of the peaks: the roofline then uses a wider one.
    peaks = {"fp32": max(mm["fp32_numpy"], mm["fp32_torch"], mm["fp32_onnxruntime"])}
    for p in ("bf16", "fp16", "int8"):
        if f"{p}_torch_note" not in mm and mm.get(f"{p}_torch"):
            peaks[p] = mm[f"{p}_torch"]
    return {"cpu": cpu_info()["model"], "threads": threads, "memory_gb": memory_gb(),
            "bandwidth": bw, "gemm_tflops": mm,
            "profile": {"memory_bandwidth_gbs": bw["best_gbs"],
                        "peak_tflops": {k: v for k, v in peaks.items() if v is not None}},
            "busy": busy_processes(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "seconds": round(time.time() - t0, 1)}


def yaml_snippet(result: dict) -> str:
    p = result["profile"]
    lines = [f"# measured by `python -m pipeline.bill probe` on {result['date']} "
             f"({result['cpu']}, {result['threads']} threads)",
             f"memory_gb: {result['memory_gb']:.1f}",
             f"memory_bandwidth_gbs: {p['memory_bandwidth_gbs']:.1f}",
             "peak_tflops:"]
    lines += [f"  {k}: {v:.3f}" for k, v in p["peak_tflops"].items()]
    return "\n".join(lines)
