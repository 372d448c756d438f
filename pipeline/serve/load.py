"""The load generator: open-loop Poisson arrivals of real encoded files, and a concurrency sweep,
against a running server (``python -m pipeline.serve.load URL ...``).

In: the server's URL (this machine's own, 127.0.0.1, is what the tests and ``make`` use), request
bodies (the PNG/JPEG files of a folder, OCR lines rendered by the task's own generator and
scaled up to a scanner's size, or the lines of a text file for a text model), the rates to offer or a start rate to sweep up from, the seconds
per step and the p99 target (``slo.p99_ms``). Out: a ``LoadReport``: per step the offered and
achieved rate, p50/p99/p999 from the client's clock (counted from when each request was due, not
when it went out, so a client that falls behind does not hide queueing), errors by status,
the time of each server stage as the server reported it (decode, preprocess, queue, inference,
postprocess) and the network and HTTP time (client latency minus the server's own), whether the
step reached steady state, and the highest rate whose p99 met the target. Where the server has
``/metrics`` (ours), each step also has the batch sizes its batcher formed and the share of the
step its model's thread was busy, read before and after the step.

Why not Locust: its users are closed loops (a user waits for its answer before its next request,
at best paced by ``constant_throughput``), so a slow server slows the arrivals and hides its
queue; open-loop Poisson arrivals need a generator that sends on schedule whatever the answers
do. This one is aiohttp on one event loop; a request due while ``max_in_flight`` are unanswered is
counted as a client-side drop, so the generator's own memory stays bounded.

A step counts only when it reached steady state: its arrivals are cut into windows of
``window_s`` seconds and the median latency of each of the last ``steady_windows`` windows must
agree with theirs within ``steady_tolerance`` of their median, or within ``steady_floor`` of the
p99 target where that is wider; a step whose latencies still climb is saturated, not measured.
The floor is there because a relative tolerance alone calls a server unsteady whose medians move
from 12 to 19 ms against a 200 ms target: scheduling noise on a shared host, not a queue (a queue
that grows without bound crosses any fixed margin within a step). The windows' medians, not
their p99: at 17 requests a second a one-second window's p99 is its slowest request, one hiccup
of a shared host, while a queue that grows lifts the median as surely. Each window's p99 is reported beside it. A sweep stops at the first step that
misses the target or fails more than 1 % of its requests; a step that is not steady is not
counted, and the sweep goes on.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

STAGES = ("decode", "preprocess", "queue", "inference", "postprocess")


@dataclass
class Step:
    offered_qps: float
    seconds: float
    sent: int = 0
    ok: int = 0
    errors: dict = field(default_factory=dict)   # HTTP status (or "connection", "dropped") -> n
    achieved_qps: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    p999_ms: float = float("nan")
    # a distribution-free interval of p99 at ``LoadConfig.ci_level``, from the order statistics
    # of the answered requests (binomial, normal approximation); an end it cannot bound (too few
    # requests) is None. It counts the sampling error of one step as if requests were
    # independent; queueing correlates neighbours, so the truth is wider.
    p99_ci_ms: list = field(default_factory=lambda: [None, None])
    stage_ms: dict = field(default_factory=dict)  # stage -> mean ms (server's own clock)
    network_ms: float = float("nan")              # median client latency minus server total
    window_p50_ms: list = field(default_factory=list)
    window_p99_ms: list = field(default_factory=list)
    # requests per window that were not answered 200 (shed, failed or dropped by the client):
    # a burst the server shed in one window reads apart from errors spread over the step
    window_errors: list = field(default_factory=list)
    steady: bool = False
    meets_slo: bool = False
    # from the server's /metrics before and after the step (absent on a server without them)
    batch_sizes: dict = field(default_factory=dict)   # requests per model run -> runs
    inference_busy_share: float = float("nan")        # the model's thread: busy s / step s
    server: dict = field(default_factory=dict)        # the caller's probe: counter deltas
    # The generator's own CPU seconds over the step (this process): on a server's own machine
    # the client competes for the cores the server is measured on, and this says how much.
    client_cpu_s: float = float("nan")


@dataclass
class ConcurrencyStep:
    concurrency: int
    seconds: float
    ok: int = 0
    errors: dict = field(default_factory=dict)
    throughput_qps: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")


@dataclass
class LoadReport:
    url: str
    slo_p99_ms: float
    bodies: int
    steps: list = field(default_factory=list)
    max_qps_within_slo: float = 0.0
    concurrency: list = field(default_factory=list)
    # the server's /readyz before the first step: which version (NAME:VERSION@sha256:...) and
    # settings the numbers belong to; None when it has no such route or was not ready
    server: dict | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LoadConfig:
    slo_p99_ms: float = 200.0
    step_seconds: float = 10.0
    window_s: float = 1.0
    steady_windows: int = 3
    steady_tolerance: float = 0.5
    steady_floor: float = 0.05   # a share of slo_p99_ms: medians closer than this agree
    ci_level: float = 0.95       # of each step's p99 interval (Step.p99_ci_ms)
    # Above step_seconds: a step at a rate too low to send the requests its p99 interval needs
    # at ci_level in step_seconds (interval_requests) runs longer, up to this; 0 or below
    # step_seconds: every step lasts step_seconds (a low rate's interval may stay open above).
    max_step_seconds: float = 0.0
    max_in_flight: int = 256
    max_error_share: float = 0.01
    seed: int = 0


def _steady(medians: list[float], cfg: LoadConfig) -> bool:
    last = [p for p in medians[-cfg.steady_windows:] if np.isfinite(p)]
    if len(last) < min(cfg.steady_windows, max(1, len(medians))):
        return False
    mid = float(np.median(last))
    margin = max(cfg.steady_tolerance * mid, cfg.steady_floor * cfg.slo_p99_ms)
    return all(abs(p - mid) <= margin for p in last)


def quantile_interval(values: np.ndarray, q: float, level: float) -> list[float | None]:
    """[low, high] holding the ``q`` quantile of the population ``values`` were drawn from with
    probability ``level``: the order statistics at nq -+ z sqrt(nq(1-q)) (the number of values
    below the quantile is binomial). An end past the sample is None: unbounded."""
    x = np.sort(np.asarray(values, dtype=float))
    n = x.size
    lo, hi = _ranks(n, q, level)
    return [float(x[lo - 1]) if lo >= 1 else None, float(x[hi - 1]) if hi <= n else None]


def _ranks(n: int, q: float, level: float) -> tuple[int, int]:
    """The 1-based ranks of the order statistics that bound the ``q`` quantile of ``n`` values."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + level / 2)
    half = z * np.sqrt(n * q * (1 - q))
    return int(np.floor(n * q - half)), int(np.ceil(n * q + half))


def interval_requests(q: float, level: float) -> int:
    """The fewest values whose ``q`` quantile ``quantile_interval`` bounds at both ends at
    ``level`` (381 for p99 at 95 %): with fewer, a step's p99 interval is open above, and a
    comparison of two servers' rates cannot rest on that step."""
    n = 1
    while True:
        lo, hi = _ranks(n, q, level)
        if lo >= 1 and hi <= n:
            return n
        n += 1


def step_length(qps: float, cfg: LoadConfig) -> float:
    """Seconds of arrivals for a step at ``qps``: ``step_seconds``, or longer (up to
    ``max_step_seconds``) where that is too short to send ``interval_requests`` for p99 at
    ``cfg.ci_level``. A tenth more than that count: Poisson arrivals send fewer than the rate
    times the length about half the time, and a failed request is not a latency."""
    if cfg.max_step_seconds <= cfg.step_seconds:
        return cfg.step_seconds
    need = 1.1 * interval_requests(0.99, cfg.ci_level) / qps
    return min(cfg.max_step_seconds, max(cfg.step_seconds, need))


async def _post(session, url: str, body: bytes, content_type: str):
    """(status or error name, server timings or None)."""
    import aiohttp

    try:
        async with session.post(f"{url}/predict", data=body,
                                headers={"Content-Type": content_type}) as r:
            payload = await r.json(content_type=None)
            return r.status, (payload.get("timing_ms") if r.status == 200 else None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return "connection", None


def _content_type(body: bytes) -> str:
    """What a client would declare the body as: an image by its magic bytes, a JSON object (a
    model of arrays' ``{"inputs": ...}``, or ``{"text": ...}``) as JSON, other UTF-8 as text."""
    if body[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if body[:2] == b"\xff\xd8":
        return "image/jpeg"
    try:  # a text model's request: a sentence
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    if text.lstrip().startswith("{"):
        try:
            if isinstance(json.loads(text), dict):
                return "application/json"
        except (json.JSONDecodeError, RecursionError):
            pass  # a sentence that happens to open with a brace
    return "text/plain; charset=utf-8"


@dataclass(frozen=True)
class _Counters:
    """What a server's /metrics says so far: the model thread's busy seconds and the batcher's
    histogram of batch sizes (cumulative: runs of at most ``size`` requests)."""
    busy_s: float | None
    runs_up_to: dict  # batch size -> runs of that size or smaller


async def _counters(session, url: str) -> _Counters | None:
    """The server's counters (parsed by prometheus_client), or None when it has no /metrics."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with session.get(f"{url}/metrics") as r:
            if r.status != 200:
                return None
            text = await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    busy, runs = None, {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "serve_inference_busy_seconds_total":
                busy = sample.value
            elif sample.name == "serve_batch_size_bucket" and sample.labels["le"] != "+Inf":
                runs[int(float(sample.labels["le"]))] = sample.value
    return _Counters(busy, runs)


def _batches(before: _Counters, after: _Counters) -> dict:
    """{batch size: runs} formed between two reads."""
    runs, below = {}, 0.0
    for size in sorted(after.runs_up_to):
        total = after.runs_up_to[size] - before.runs_up_to.get(size, 0.0)
        if total - below > 0:
            runs[size] = int(round(total - below))
        below = total
    return runs


class Records:
    """What each request of a step came to, in arrays allocated once for the step's schedule.

    Why arrays: a soak sends hundreds of thousands of requests, and a Python tuple (and a dict
    of server timings) kept per request makes the generator's heap grow for the whole step, so
    each of CPython's full collections takes longer than the last: at 336 req/s they reached a
    few hundred milliseconds past 100,000 requests, the generator sent nothing meanwhile, then
    sent the overdue requests at once, and the server shed the burst (503) that the generator
    itself had made. Arrays are not tracked by the collector, whatever their length."""

    CODES = {-1: "connection", -2: "dropped"}  # not HTTP statuses: the client's own outcomes

    def __init__(self, due: np.ndarray):
        n = due.size
        self.due = np.asarray(due, dtype=float)
        self.latency_ms = np.full(n, np.inf)
        self.status = np.zeros(n, dtype=np.int32)   # HTTP status, or a key of CODES
        self.stage_ms = np.full((n, len(STAGES) + 1), np.nan)  # STAGES, then the server's total

    def add(self, k: int, latency_ms: float, status, timings: dict | None) -> None:
        self.latency_ms[k] = latency_ms
        self.status[k] = (int(status) if str(status).isdigit() else
                          next(c for c, name in self.CODES.items() if name == status))
        for j, stage in enumerate((*STAGES, "total")):
            if timings and stage in timings:
                self.stage_ms[k, j] = timings[stage]

    @classmethod
    def of(cls, rows: list[tuple]) -> "Records":
        """From (due s, latency ms, status, server timings or None) rows, in any order."""
        out = cls(np.asarray([r[0] for r in rows], dtype=float))
        for k, (_, latency, status, timings) in enumerate(rows):
            out.add(k, latency, status, timings)
        return out

    def outcomes(self, which: np.ndarray) -> dict:
        """{outcome as ``Step.errors`` keys it ("503", "dropped"...): requests} of ``which``."""
        codes, counts = np.unique(self.status[which], return_counts=True)
        return {self.CODES.get(int(c), str(int(c))): int(n) for c, n in zip(codes, counts)}


async def open_loop(url: str, bodies: list[bytes], qps: float, cfg: LoadConfig,
                    seed: int = 0, probe: Callable[[], dict] | None = None) -> Step:
    import aiohttp

    rng = np.random.default_rng(seed)
    seconds = step_length(qps, cfg)
    due = np.cumsum(rng.exponential(1.0 / qps, size=int(qps * seconds * 1.5) + 16))
    due = due[due < seconds]
    picks = rng.integers(0, len(bodies), size=due.size)
    types = [_content_type(b) for b in bodies]  # once, not per request: the client's CPU
    step = Step(qps, seconds, sent=int(due.size))
    records = Records(due)
    in_flight = 0
    # Only the requests still unanswered are held: a finished task is dropped at once, so the
    # heap stays the size of what is in flight (see Records).
    pending: set = set()
    connector = aiohttp.TCPConnector(limit=cfg.max_in_flight)
    timeout = aiohttp.ClientTimeout(total=max(30.0, 10 * cfg.slo_p99_ms / 1000.0))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        before, probed = await _counters(session, url), probe() if probe else {}
        t0, cpu0 = time.perf_counter(), time.process_time()

        async def one(k: int):
            nonlocal in_flight
            in_flight += 1
            try:
                status, timings = await _post(session, url, bodies[picks[k]], types[picks[k]])
            finally:
                in_flight -= 1
            end = time.perf_counter() - t0
            records.add(k, (end - due[k]) * 1000.0, status, timings)

        for k in range(due.size):
            wait = due[k] - (time.perf_counter() - t0)
            if wait > 0:
                await asyncio.sleep(wait)
            if in_flight >= cfg.max_in_flight:  # the client's own bound: counted, not sent
                records.add(k, float("inf"), "dropped", None)
                continue
            task = asyncio.create_task(one(k))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        elapsed = time.perf_counter() - t0
        step.client_cpu_s = time.process_time() - cpu0
        after = await _counters(session, url)
    if probe:
        step.server = {k: v - probed[k] for k, v in probe().items()}
    if before and after:
        step.batch_sizes = _batches(before, after)
        if before.busy_s is not None and after.busy_s is not None:
            step.inference_busy_share = (after.busy_s - before.busy_s) / elapsed
    return _summarize(step, records, elapsed, cfg)


def _summarize(step: Step, records: Records, elapsed: float, cfg: LoadConfig) -> Step:
    ok = records.status == 200
    step.errors.update(records.outcomes(~ok))
    step.ok = int(ok.sum())
    step.achieved_qps = step.ok / max(elapsed, step.seconds)
    if step.ok:
        lat = records.latency_ms[ok]
        step.p50_ms, step.p99_ms, step.p999_ms = (float(np.percentile(lat, q))
                                                  for q in (50, 99, 99.9))
        step.p99_ci_ms = quantile_interval(lat, 0.99, cfg.ci_level)
        timed = records.stage_ms[ok]
        for j, stage in enumerate(STAGES):  # the stages this server reports (a naive one: only
            values = timed[:, j][~np.isnan(timed[:, j])]   # its total)
            if values.size:
                step.stage_ms[stage] = float(np.mean(values))
        total = timed[:, -1]
        step.stage_ms["server_total"] = float(np.mean(total))
        step.network_ms = float(np.median(lat - total))
    # a failed or dropped request counts as infinitely late: errors are not fast answers
    late = np.where(ok, records.latency_ms, np.inf)
    windows = int(np.ceil(step.seconds / cfg.window_s))
    for w in range(windows):
        lat = late[(w * cfg.window_s <= records.due) & (records.due < (w + 1) * cfg.window_s)]
        step.window_errors.append(int(np.isinf(lat).sum()))
        # "higher" takes a window's own order statistic, so a rank that falls on such a request
        # reads inf (interpolating between two of them read nan)
        step.window_p50_ms.append(float(np.percentile(lat, 50, method="higher")) if lat.size
                                  else float("nan"))
        step.window_p99_ms.append(float(np.percentile(lat, 99, method="higher")) if lat.size
                                  else float("nan"))
    step.steady = _steady(step.window_p50_ms, cfg)
    errors = sum(step.errors.values())
    step.meets_slo = (step.steady and step.p99_ms <= cfg.slo_p99_ms
                      and errors <= cfg.max_error_share * max(step.sent, 1))
    return step


async def closed_loop(url: str, bodies: list[bytes], concurrency: int,
                      seconds: float) -> ConcurrencyStep:
    """``concurrency`` clients, each sending its next request when its last is answered."""
    import aiohttp

    out = ConcurrencyStep(concurrency, seconds)
    latencies: list[float] = []
    types = [_content_type(b) for b in bodies]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:
        t0 = time.perf_counter()

        async def client(c: int):
            k = c
            while time.perf_counter() - t0 < seconds:
                body, kind = bodies[k % len(bodies)], types[k % len(bodies)]
                k += concurrency
                start = time.perf_counter()
                status, _ = await _post(s, url, body, kind)
                if status == 200:
                    latencies.append((time.perf_counter() - start) * 1000.0)
                else:
                    out.errors[str(status)] = out.errors.get(str(status), 0) + 1

        await asyncio.gather(*(client(c) for c in range(concurrency)))
        elapsed = time.perf_counter() - t0
    out.ok = len(latencies)
    out.throughput_qps = len(latencies) / elapsed
    if latencies:
        out.p50_ms, out.p99_ms = (float(np.percentile(latencies, q)) for q in (50, 99))
    return out


def run(url: str, bodies: list[bytes], cfg: LoadConfig, rates: list[float] | None = None,
        start_qps: float = 10.0, growth: float = 1.5, max_steps: int = 12,
        concurrency: list[int] | None = None, probe: Callable[[], dict] | None = None,
        refine: int = 0) -> LoadReport:
    """Open-loop steps at ``rates`` (all of them), or from ``start_qps`` up by ``growth`` until a
    step misses the target (down instead when the first already missed: ``lower``), then
    ``refine`` bisection steps (``refined``); then the concurrency
    sweep, if asked. ``probe``: cumulative counters of the server read before and after each
    step (the bench's: its processes' CPU seconds), their differences kept in ``Step.server``."""
    if not bodies:
        raise ValueError("no request bodies")
    report = LoadReport(url, cfg.slo_p99_ms, len(bodies), server=ready(url))
    if report.server:
        print(f"load: {url} serves {report.server.get('version') or report.server.get('model')}",
              flush=True)
    sweep = rates is None
    plan = list(rates or [start_qps * growth ** k for k in range(max_steps)])

    def measure(qps: float) -> Step:
        step = asyncio.run(open_loop(url, bodies, qps, cfg, seed=cfg.seed + len(report.steps),
                                     probe=probe))
        report.steps.append(step)
        print(_line(step), flush=True)
        return step

    for qps in plan:
        step = measure(qps)
        # The sweep ends when the target is missed or requests fail; a step that met the
        # target without reaching steady state (a shared host's burst) does not count, but
        # it does not end the sweep either.
        errors = sum(n for k, n in step.errors.items())
        if sweep and (not step.p99_ms <= cfg.slo_p99_ms
                      or errors > cfg.max_error_share * max(step.sent, 1)):
            break
    for qps in lower(report.steps, start_qps, growth, max_steps if sweep else 0):
        measure(qps)
    for qps in refined(report.steps, refine if sweep else 0):
        measure(qps)
    report.max_qps_within_slo = max((s.offered_qps for s in report.steps if s.meets_slo),
                                    default=0.0)
    for c in concurrency or []:
        cs = asyncio.run(closed_loop(url, bodies, c, cfg.step_seconds))
        report.concurrency.append(cs)
        print(f"concurrency {c:>3}: {cs.throughput_qps:8.1f} req/s  p50 {cs.p50_ms:7.2f} ms  "
              f"p99 {cs.p99_ms:7.2f} ms  errors {cs.errors or 0}", flush=True)
    return report


def ready(url: str) -> dict | None:
    """The server's /readyz answer (a JSON object), or None: no such route, not ready, or not
    this project's server (the load test measures any HTTP endpoint that takes the bodies)."""
    import urllib.error
    import urllib.request

    # no proxy from the environment, as the requests themselves (aiohttp) take none
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/readyz", timeout=10) as r:
            body = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def lower(steps: list[Step], start_qps: float, growth: float, count: int):
    """When the sweep's first rate already missed the target (a slower model than the start
    assumed), up to ``count`` rates below it, each ``growth`` times lower, until a step meets
    the target: the sweep then has a rate that held, not 0, and ``refined`` narrows the bracket
    above it. Nothing when any step met the target."""
    rate = start_qps
    for _ in range(count):
        if any(s.meets_slo for s in steps):
            return
        rate /= growth
        yield rate


def refined(steps: list[Step], count: int):
    """Up to ``count`` rates between the highest step that met the target and the lowest step
    above it that did not (missed it, failed, or never steadied), each the geometric middle of
    the two, the bracket narrowed by each new step's outcome as it is appended to ``steps``. A
    sweep grows its rate by a factor (1.5 by default), so its answer is only known within that
    factor; three bisections narrow it to about 5 %. Nothing to refine when no step met the
    target or none above it missed."""
    for _ in range(count):
        met = [s.offered_qps for s in steps if s.meets_slo]
        if not met:
            return
        lo = max(met)
        above = [s.offered_qps for s in steps if not s.meets_slo and s.offered_qps > lo]
        if not above:
            return
        yield (lo * min(above)) ** 0.5


def _line(s: Step) -> str:
    stages = " ".join(f"{k} {v:.2f}" for k, v in s.stage_ms.items())
    return (f"{s.offered_qps:8.1f} req/s offered, {s.achieved_qps:8.1f} answered: p50 "
            f"{s.p50_ms:.2f} p99 {s.p99_ms:.2f} p999 {s.p999_ms:.2f} ms, errors "
            f"{s.errors or 0}, "
            + (f"model busy {s.inference_busy_share:.0%}, " if s.inference_busy_share
               == s.inference_busy_share else "")
            + (("meets" if s.meets_slo else "misses") + " the target" if s.steady else
               "not steady: not counted")
            + f" | ms: {stages} network "
            f"{s.network_ms:.2f}")


def ocr_lines(count: int, scale: float = 1.0, seed: int = 7, fmt: str = "PNG") -> list[bytes]:
    """``count`` text lines drawn by the OCR task's generator (seed 7: no evaluation line), each
    scaled by ``scale`` (a scanner at 300 dpi gives lines about 4x the model's 32 pixels) and
    encoded as ``fmt``."""
    import io

    from PIL import Image

    from pipeline.models.ocr import data as ocr_data

    out = []
    for sample in ocr_data.generate(seed, count):
        img = Image.fromarray(ocr_data.to_array(sample))
        if scale != 1.0:
            img = img.resize((round(img.width * scale), round(img.height * scale)),
                             Image.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


def texts(path: Path) -> list[bytes]:
    """Each non-empty line of a UTF-8 file, as a text model's request body."""
    return [ln.encode() for ln in Path(path).read_text(encoding="utf-8").splitlines()
            if ln.strip()]


def files(folder: Path) -> list[bytes]:
    """Every file of ``folder`` (sorted), sent as it is: what a client would upload."""
    return [p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()]


def check_writable(path: Path) -> None:
    """``path`` can take the report: its folder exists and is writable, and it is no folder."""
    import os

    from pipeline.core.errors import ConfigError

    if path.is_dir():
        raise ConfigError(f"--out {path}: a folder; name the report's file")
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        raise ConfigError(f"--out {path}: its folder {path.parent} does not exist or is not "
                          "writable")


def write(report: LoadReport, path: Path) -> None:
    """The report as strict JSON (a number it could not measure, NaN or infinite, is null), whole
    or not at all: a failed write leaves no half file behind."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(_finite(report.to_json()), indent=2, allow_nan=False))
        tmp.rename(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _finite(value):
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
