"""The CPU bound of a served model, as issue 36 defines it: the usable cores over the CPU-seconds
one request costs, its parts measured each alone.

In: the served artifact (``pipeline.serve.artifact.open_ref``), request bodies as a client sends
them, the server's intra-op thread count, the batch sizes its batcher formed (``serve_batch_size``
in ``/metrics``, read per step by ``pipeline.serve.load``) and a running server's process id. Out:
a ``CpuBound``: CPU-milliseconds per request in decode + preprocess, in inference at the batches
formed, and in the HTTP layer, and ``cores / (their sum)`` requests a second.

Each part is timed in process CPU time, never wall time, so a part that waits costs nothing and
a part that spins (onnxruntime's pool threads spin between runs) costs what it burns:
- decode + preprocess: the server's own reader (``readers.prepare``) on the bodies, in a child
  process that does nothing else (``time.process_time``: every thread of that process);
- inference: the model on the server's runtime with its intra-op threads, in a child, at each batch
  size the batcher formed (copies of one request: a batch is one shape class), per request, then
  weighted by the share of requests each size answered;
- HTTP: the request bodies ``POST``-ed one at a time to the server's HTTP stack with nothing
  behind it (``benchmarks.serve_http_floor``: uvicorn, Starlette, the server's own body reader, a
  JSON answer of the server's shape), that process's CPU time (``psutil``, user + system) per
  request: reading and parsing a request with its 30 KB body, routing it, writing the answer.
  ``GET /healthz`` on the running server (no body, a short answer) is kept beside it
  (``http_get_cpu_ms``), not in the sum: it leaves the body's bytes out.
Not handled: the load generator's own CPU (another process, left out), the kernel's loopback work
outside the server's process.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

WARM = 20  # runs before a part is timed: the first runs allocate


@dataclass
class CpuBound:
    cores: int                        # usable cores (os.sched_getaffinity) of this process
    threads: int                      # the server's intra-op threads, inference timed with them
    decode_preprocess_cpu_ms: float   # per request, one worker
    inference_cpu_ms_by_batch: dict = field(default_factory=dict)  # batch size -> per request
    batch_share: dict = field(default_factory=dict)   # batch size -> share of requests answered
    batches_from: str = "batch 1"     # where the batch sizes came from
    http_cpu_ms: float = float("nan")  # per request with its body, the HTTP stack alone
    http_get_cpu_ms: float = float("nan")  # per GET /healthz on the running server: not summed

    @property
    def inference_cpu_ms(self) -> float:
        share = self.batch_share or {1: 1.0}
        return sum(s * self.inference_cpu_ms_by_batch[b] for b, s in share.items())

    @property
    def cpu_ms_per_request(self) -> float:
        http = self.http_cpu_ms if self.http_cpu_ms == self.http_cpu_ms else 0.0  # nan: unmeasured
        return self.decode_preprocess_cpu_ms + self.inference_cpu_ms + http

    @property
    def bound_qps(self) -> float:
        return self.cores * 1000.0 / self.cpu_ms_per_request

    def as_dict(self) -> dict:
        return {**asdict(self), "inference_cpu_ms": self.inference_cpu_ms,
                "cpu_ms_per_request": self.cpu_ms_per_request, "bound_qps": self.bound_qps}


def _prepare_cpu_ms(key, bodies: list[bytes], runs: int) -> float:
    """CPU-ms per request of the server's reader (decode + preprocess), in this process alone."""
    from pipeline.serve.inputs import Limits
    from pipeline.serve.load import _content_type
    from pipeline.serve.readers import prepare

    limits = Limits(1 << 26, 1 << 26, 1 << 16)
    for k in range(WARM):
        prepare(bodies[k % len(bodies)], _content_type(bodies[k % len(bodies)]), limits, key)
    t0 = time.process_time()
    for k in range(runs):
        body = bodies[k % len(bodies)]
        prepare(body, _content_type(body), limits, key)
    return (time.process_time() - t0) * 1000.0 / runs


def _inference_cpu_ms(served, bodies: list[bytes], threads: int, sizes: list[int],
                      requests: int) -> dict:
    """{batch size: CPU-ms per request} of the model on the server's runtime and threads, each
    size timed over about ``requests`` requests in batches of copies of one request."""
    from pipeline import runtimes
    from pipeline.config import HardwareRuntime
    from pipeline.serve.inputs import Limits
    from pipeline.serve.load import _content_type
    from pipeline.serve.readers import reader

    r = reader(served.reader_key)
    limits = Limits(1 << 26, 1 << 26, 1 << 16)
    prepared = [r.prepare(b, _content_type(b), limits).feeds for b in bodies[:8]]
    d = served.runtime
    model = runtimes.load(served.model, HardwareRuntime(
        "cpu", "CPUExecutionProvider", threads, 1, None, d.get("runtime", "onnxruntime"),
        d.get("precision", "fp32"), d.get("performance_hint", "latency")))
    out = {}
    for size in sizes:
        batches = [r.stack([p] * size) for p in prepared]
        for k in range(WARM):
            model.run(batches[k % len(batches)])
        runs = max(len(batches), requests // size)
        t0 = time.process_time()
        for k in range(runs):
            model.run(batches[k % len(batches)])
        out[size] = (time.process_time() - t0) * 1000.0 / (runs * size)
    return out


def http_cpu_ms(url: str, pid: int, requests: int = 1000) -> float:
    """CPU-ms of the server's main process per ``GET /healthz``, sent one at a time on one
    connection (the server otherwise idle)."""
    import psutil
    import requests as http

    proc = psutil.Process(pid)
    with http.Session() as s:
        for _ in range(WARM):
            s.get(f"{url}/healthz", timeout=30)
        before = proc.cpu_times()
        for _ in range(requests):
            s.get(f"{url}/healthz", timeout=30).raise_for_status()
        after = proc.cpu_times()
    return ((after.user - before.user) + (after.system - before.system)) * 1000.0 / requests


def http_floor_cpu_ms(bodies: list[bytes], tmp, requests: int = 1000) -> float:
    """CPU-ms per request of ``benchmarks.serve_http_floor`` (the HTTP stack, no model), the
    bodies ``POST``-ed one at a time on one connection."""
    import sys

    import psutil
    import requests as http

    from benchmarks.serve_process import start, stop
    from pipeline.serve.load import _content_type

    port_file = tmp / "http_floor.port"
    proc, url = start([sys.executable, "-m", "benchmarks.serve_http_floor", str(port_file)],
                      port_file)
    try:
        cpu = psutil.Process(proc.pid)
        with http.Session() as s:
            def post(k: int) -> None:
                body = bodies[k % len(bodies)]
                s.post(f"{url}/predict", data=body, timeout=30,
                       headers={"Content-Type": _content_type(body)}).raise_for_status()

            for k in range(WARM):
                post(k)
            before = cpu.cpu_times()
            for k in range(requests):
                post(k)
            after = cpu.cpu_times()
    finally:
        stop(proc)
    return ((after.user - before.user) + (after.system - before.system)) * 1000.0 / requests


def measure(served, bodies: list[bytes], threads: int, batch_counts: dict | None = None,
            http_ms: float = float("nan"), prepare_cpu_ms: float | None = None,
            runs: int = 400, http_get_ms: float = float("nan")) -> CpuBound:
    """Decode + preprocess (unless ``prepare_cpu_ms`` gives it: the same reader measured before)
    and inference, each in a child process of its own; inference at the batch sizes of
    ``batch_counts`` ({size: batches formed}; None or empty: batch 1 alone)."""
    from pipeline.core import isolate
    from pipeline.serve.config import usable_cores

    counts = {int(b): n for b, n in (batch_counts or {}).items() if n}
    answered = sum(b * n for b, n in counts.items())
    share = {b: b * n / answered for b, n in counts.items()} if answered else {}
    if prepare_cpu_ms is None:
        prepare_cpu_ms = isolate.call("serve bound: decode + preprocess", _prepare_cpu_ms,
                                      served.reader_key, bodies, runs)
    infer = isolate.call("serve bound: inference", _inference_cpu_ms, served, bodies, threads,
                         sorted(share or {1: 1.0}), runs)
    return CpuBound(usable_cores(), threads, prepare_cpu_ms, infer, share,
                    "the batcher's batches" if share else "batch 1", http_ms, http_get_ms)
