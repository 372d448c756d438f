"""``make bench`` section ``serve``: the OCR artifact behind the real server, measured from raw
bytes by the load generator (``pipeline.serve.load``), on 127.0.0.1.

- ``cpu_bound`` (per served model, INT8 and FP32): issue 36's bound, the usable cores over the
  CPU-seconds one request costs, its parts measured each alone in process CPU time
  (``benchmarks.serve_bound``): decode + preprocess (the server's reader, one process), inference
  on the producer/consumer server's threads at the batch sizes its batcher formed at its highest
  steady rate within the target (read from ``/metrics`` per step), and the HTTP layer (the bodies
  ``POST``-ed to the server's HTTP stack with no model behind it, ``benchmarks.serve_http_floor``;
  ``GET /healthz`` on the running server beside it, not summed). Every served row reports its
  fraction of its model's bound, the share of the step the model's thread was busy (the article's
  utilisation) and the CPU the server's processes spent per request there (a check of the sum).
- ``servers``: the INT8 candidate from PNG bytes of lines at a scanner's size (4x the model's
  32-pixel height, ``--scale 4``) behind ``inline`` (all in the handler), ``pipeline`` (worker
  processes + batcher) and a naive FastAPI handler per request (``benchmarks.serve_naive``), and
  the FP32 model behind ``pipeline``: each one's open-loop sweep (steps of ``step_seconds``,
  longer at a rate too low for its p99 interval to close, ``MAX_STEP_SECONDS`` at most;
  steady-state windows, three bisection steps; for a server compared with ``pipeline``, swept
  first, up to two steps at rates between its own and ``pipeline``'s, ``deciding``) and its highest
  steady rate within ``slo.p99_ms``, side by side, with a 95 % interval for the ratio of two
  servers' rates (``bracket``).
- ``soak``: the pipeline server at 70 % of its highest rate for ``soak_seconds`` (600 in make
  bench): p99 per 10 s window and the server's process tree's RSS every 5 s, each with its
  slope per minute (flat: both near 0), and the errors; a target asks for no errors, a p99
  within the target in the last window and an RSS slope under ``bench.load.leak_mb_per_min``.
- ``encoder``: the zoo's all-mpnet-base-v2 (dynamic INT8) served from UTF-8 sentences: the same
  CPU bound and sweeps (inline, producer/consumer, FP32), no naive row.
- ``decoder``: SmolLM2-135M compiled by the pipeline and served from its run's folder: time to
  first token and tokens/s per stream at 1, 4 and 8 streams, peak RSS against the KV budget
  (``benchmarks.serve_decoder``).
"""
from __future__ import annotations

import functools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.serve_decoder import decoder_section, decoder_table
from benchmarks.serve_process import start, stop

SCALE = 4.0        # a 300 dpi scanner's line: about 128 pixels tall
SOAK_SHARE = 0.7   # the soak's rate, as a share of the highest steady rate within the target
LINES = 64         # distinct request bodies
# A ratio of two servers' rates rests on four step intervals (each server's bracket has two
# ends): at 1 - 0.05/4 each they hold together with at least 95 % (Bonferroni).
STEP_LEVEL = 1 - 0.05 / 4
# A step at a low rate runs up to this long, so that its p99 interval can close at STEP_LEVEL
# (618 answered requests): the encoder's rates (30 to 130 req/s) left every 5 s step's interval
# open above, and no comparison of its servers could be decided (load.step_length).
MAX_STEP_SECONDS = 30.0
PIPELINE = "int8 pipeline"  # the server the others are compared with; swept first
DECIDING_STEPS = 2  # per compared server (``deciding``)


def _fp32_folder(run: Path, report: dict, dest: Path) -> Path:
    """The run's FP32 model as a pulled folder would hold it (with the tokenizer files a text
    model's spec names, from the run's model folder), so the server serves it as is."""
    dest.mkdir(parents=True)
    shutil.copy(Path(report["lineage"]["fp32"]["path"]) / "model.onnx", dest / "model.onnx")
    spec = report.get("serving") or {}
    for name in spec.get("files", {}):
        shutil.copy(Path(report["config"]["model"]["path"]) / name, dest / name)
    fp32 = next(r for r in report["rows"] if r["role"] == "fp32")
    (dest / "manifest.json").write_text(json.dumps({
        "config": report["config"], "serving": report.get("serving"),
        "metrics": {"output_sha256": fp32.get("output_sha256")},
        "runtime": {"deployed": {"runtime": "onnxruntime", "precision": "fp32"}}}))
    return dest


def _cpu_seconds(pid: int) -> dict:
    """CPU seconds (user + system) the server's processes spent so far: all of them (``cpu_s``)
    and the main one alone (``main_cpu_s``: HTTP, the batcher, the model's thread; the rest is
    the worker processes); the load generator's probe, so each step carries their difference."""
    import psutil

    main = psutil.Process(pid)
    t = main.cpu_times()
    total = own = t.user + t.system
    for proc in main.children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:  # a worker replaced mid-step: its time is lost, not faked
            continue
        total += t.user + t.system
    return {"cpu_s": total, "main_cpu_s": own}


def _best(row: dict) -> dict | None:
    """The step at a server's highest steady rate within the target, or None."""
    ok = [st for st in row.get("steps", []) if st.get("meets_slo")]
    return max(ok, key=lambda st: st["offered_qps"]) if ok else None


def _batches_formed(row: dict) -> dict:
    """{batch size: runs} the batcher formed at the best step, else over the whole sweep."""
    best = _best(row)
    steps = [best] if best and best.get("batch_sizes") else row.get("steps", [])
    counts: dict = {}
    for st in steps:
        for size, runs in st.get("batch_sizes", {}).items():
            counts[int(size)] = counts.get(int(size), 0) + runs
    return counts


def _sweep(servers: dict, bodies: list[bytes], cfg, start_qps: float, tmp: Path,
           soak_seconds: float = 0.0,
           saturate_qps: float = 0.0) -> tuple[dict, dict | None, float]:
    """Each server started, swept open-loop from ``start_qps`` up, offered ``saturate_qps`` (the
    CPU bound: more than it can answer, ``saturated``), and stopped: ({name: highest steady rate
    within the target, steps, the saturated step, exit code}, the soak or None, the HTTP layer's
    CPU-ms per request measured on the INT8 producer/consumer server before its sweep)."""
    from benchmarks.serve_bound import http_cpu_ms
    from pipeline.serve import load

    out, soak, http_ms = {}, None, float("nan")
    for name, cmd in servers.items():
        port_file = tmp / f"{name.replace(' ', '_')}.port"
        cmd = cmd + ([str(port_file)] if "serve_naive" in cmd[2] else
                     ["--port", "0", "--ready-file", str(port_file)])
        proc, url = start(cmd, port_file)
        try:
            if name == PIPELINE:
                http_ms = http_cpu_ms(url, proc.pid)
            probe = functools.partial(_cpu_seconds, proc.pid)
            rep = load.run(url, bodies, cfg, start_qps=start_qps, growth=1.4, max_steps=14,
                           probe=probe, refine=3)
            row = out[name] = {"max_qps_within_slo": rep.max_qps_within_slo,
                               "steps": [vars(s) for s in rep.steps]}
            # The servers compared with the producer/consumer one (swept first): its decided
            # rate tested on them while they still run (``deciding``).
            for qps in deciding(row, out.get(PIPELINE) if name != PIPELINE else None,
                                cfg.slo_p99_ms, DECIDING_STEPS):
                step = load.run(url, bodies, cfg, rates=[qps], probe=probe).steps[0]
                row["steps"].append({**vars(step), "deciding": True})
                if step.meets_slo:
                    row["max_qps_within_slo"] = max(row["max_qps_within_slo"], qps)
            if saturate_qps > 0:
                row["saturated_step"] = vars(load.run(url, bodies, cfg, rates=[saturate_qps],
                                                      probe=probe).steps[0])
            if name == PIPELINE and soak_seconds > 0 and rep.max_qps_within_slo:
                soak = _soak(url, proc.pid, bodies, cfg, SOAK_SHARE * rep.max_qps_within_slo,
                             soak_seconds)
        finally:
            out.setdefault(name, {})["exit_code"] = stop(proc)
    return out, soak, http_ms


def _slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per minute; None with under 3 finite."""
    pts = [(t, v) for t, v in points if v == v]
    if len(pts) < 3:
        return None
    t, v = np.array(pts).T
    return float(np.polyfit(t / 60.0, v, 1)[0])


def _soak(url: str, pid: int, bodies: list[bytes], cfg, qps: float, seconds: float) -> dict:
    """The server held at ``qps`` for ``seconds``, open loop: p99 per 10 s window and the
    resident memory of the server's whole process tree (main process and workers) every 5 s,
    each with its least-squares slope per minute (flat: both near 0), and the errors."""
    import threading

    import psutil

    from benchmarks.decoder_runs import tree_sample
    from pipeline.serve import load

    def rss_mb() -> float:
        return (psutil.Process(pid).memory_info().rss + tree_sample(pid)[0]) / 2 ** 20

    def steal_s() -> float:
        """CPU time the hypervisor gave to other guests (``steal``), all cores, since boot: a
        window of errors with steal in it is the host's, not the server's."""
        return float(psutil.cpu_times().steal) if hasattr(psutil.cpu_times(), "steal") else 0.0

    samples, done, t0 = [(0.0, rss_mb())], threading.Event(), time.monotonic()
    steals = [(0.0, steal_s())]

    def sample() -> None:
        while not done.wait(5.0):
            samples.append((time.monotonic() - t0, rss_mb()))
            steals.append((time.monotonic() - t0, steal_s()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    window = 10.0
    try:
        run = load.run(url, bodies, load.LoadConfig(slo_p99_ms=cfg.slo_p99_ms,
                                                    step_seconds=seconds, window_s=window),
                       rates=[qps])
    finally:
        done.set()
        sampler.join()
    samples.append((time.monotonic() - t0, rss_mb()))
    step = run.steps[0]
    p99s = step.window_p99_ms
    return {"qps": step.offered_qps, "share_of_highest_rate": SOAK_SHARE, "seconds": seconds,
            "sent": step.sent, "ok": step.ok, "p99_ms": step.p99_ms, "errors": step.errors,
            "window_s": window, "window_p99_ms_first_last": [p99s[0], p99s[-1]] if p99s else [],
            # the windows that had errors (their start in s, and how many): one burst shed or a
            # steady trickle read apart here
            "error_windows": [[k * window, n] for k, n in enumerate(step.window_errors) if n],
            "window_p99_ms_max": max(p99s) if p99s else None,
            "p99_slope_ms_per_min": _slope_per_minute([((k + 0.5) * window, v)
                                                       for k, v in enumerate(p99s)]),
            "rss_mb_before_after": [samples[0][1], samples[-1][1]],
            "rss_slope_mb_per_min": _slope_per_minute(samples), "rss_samples": len(samples),
            # the whole course, window by window: when the p99 rose, when errors came, and how
            # much CPU the host took from this machine meanwhile (steal, summed over 5 s samples)
            "window_p99_ms": p99s, "window_errors": step.window_errors,
            "window_steal_s": _per_window(steals, window, len(p99s))}


def _per_window(samples: list[tuple[float, float]], window: float, count: int) -> list[float]:
    """A cumulative counter's increase in each of ``count`` windows of ``window`` s, from
    (time, value) samples: each interval's increase goes to the window its end falls in."""
    out = [0.0] * count
    for (_, v0), (t1, v1) in zip(samples, samples[1:]):
        k = min(int(t1 // window), count - 1) if count else 0
        if count:
            out[k] += v1 - v0
    return [round(v, 2) for v in out]


def _measured(servers: dict, models: dict, bodies: list[bytes], cfg, tmp: Path,
              soak_seconds: float = 0.0, text: bool = False) -> dict:
    """The sweeps of ``servers`` ({name: command}; a name starts with its model's key in
    ``models``: {"int8": Served, "fp32": Served}) and each model's CPU bound, each row with its
    fraction of its model's bound, its model thread's busy share and its processes' CPU per
    request at its highest steady rate. The sweeps start at a sixteenth of a first bound (batch 1,
    no HTTP part), the bounds are measured after them at the batches the batcher formed."""
    from benchmarks import serve_bound
    from pipeline.serve.config import ServeConfig

    # the producer/consumer server's threads per run of the model (``text``: a text model's split)
    threads = ServeConfig().resolved(text=text).intra_op_threads
    first = serve_bound.measure(models["int8"], bodies, threads)
    rows, soak, http_get_ms = _sweep(servers, bodies, cfg, max(1.0, first.bound_qps / 16), tmp,
                                     soak_seconds, saturate_qps=first.bound_qps)
    http_ms = serve_bound.http_floor_cpu_ms(bodies, tmp)
    # one reader serves both models (the same task, the same tokenizer files): its cost is one
    bounds = {key: serve_bound.measure(
        served, bodies, threads, _batches_formed(rows.get(f"{key} pipeline", {})), http_ms,
        prepare_cpu_ms=first.decode_preprocess_cpu_ms, http_get_ms=http_get_ms)
        for key, served in models.items()}
    for name, row in rows.items():
        bound = bounds[name.split()[0]]
        row["cpu_bound_qps"] = bound.bound_qps
        row["fraction_of_cpu_bound"] = (row.get("max_qps_within_slo") or 0.0) / bound.bound_qps
        if row.get("saturated_step"):
            row["saturated"] = saturated(row["saturated_step"], row["steps"], bound.bound_qps,
                                         bound.cores)
        best = _best(row)
        if best:
            row["inference_busy_share"] = best.get("inference_busy_share")
            cpu = best.get("server", {}).get("cpu_s")
            client = best.get("client_cpu_s")  # the load generator, on the same cores
            row["client_cpu_ms_per_request"] = client * 1000.0 / best["ok"] \
                if client and best["ok"] else None
            if row["client_cpu_ms_per_request"]:
                # the bound again with the load generator's CPU in the sum: what the cores could
                # serve with the client on them, as it is in this bench
                row["bound_with_load_generator_qps"] = bound.cores * 1000.0 / (
                    bound.cpu_ms_per_request + row["client_cpu_ms_per_request"])
            row["server_cpu_ms_per_request"] = cpu * 1000.0 / best["ok"] if cpu and best["ok"] \
                else None
            main = best.get("server", {}).get("main_cpu_s")
            row["server_main_cpu_ms_per_request"] = main * 1000.0 / best["ok"] \
                if main and best["ok"] else None
    out = {"cpu_bound": {key: b.as_dict() for key, b in bounds.items()}, "servers": rows}
    if soak:
        out["soak"] = soak
    return out


def section(base: list[str], cli, run_dir: Path | None = None, step_seconds: float = 5.0,
            soak_seconds: float = 600.0, encoder: bool = True, quick: bool = False,
            decoder: bool = True) -> dict:
    from pipeline.serve import load
    from pipeline.serve.artifact import open_ref

    if run_dir is None:
        code, _, report = cli(base)
        if not report:
            raise RuntimeError(f"the pipeline wrote no report (exit {code})")
        run_dir = Path("artifacts/runs/latest").resolve()
    report = json.loads((Path(run_dir) / "report.json").read_text())
    slo = float(report["config"]["slo"]["p99_ms"])
    bodies = load.ocr_lines(LINES, SCALE)
    out: dict = {"run": str(run_dir), "slo_p99_ms": slo, "scale": SCALE,
                 "body_bytes_median": int(np.median([len(b) for b in bodies]))}
    cfg = load.LoadConfig(slo_p99_ms=slo, step_seconds=step_seconds, window_s=1.0,
                          ci_level=STEP_LEVEL, max_step_seconds=MAX_STEP_SECONDS)
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    serve = [sys.executable, "-m", "pipeline.serve"]
    try:
        fp32 = _fp32_folder(run_dir, report, tmp / "fp32")
        models = {"int8": open_ref(str(run_dir), tmp / "pulled"),
                  "fp32": open_ref(str(fp32), tmp / "pulled-fp32")}
        servers = {
            PIPELINE: serve + [str(run_dir)],
            "int8 inline": serve + [str(run_dir), "--mode", "inline"],
            "int8 naive FastAPI": [sys.executable, "-m", "benchmarks.serve_naive",
                                   str(Path(report["lineage"]["candidate"]["path"])
                                       / "model.onnx")],
            "fp32 pipeline": serve + [str(fp32)],
        }
        out.update(_measured(servers, models, bodies, cfg, tmp, soak_seconds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["int8_vs_fp32"] = int8_vs_fp32(report, out["servers"])
    out["targets"] = targets(out)
    if encoder:
        try:
            out["encoder"] = encoder_section(cli, slo, step_seconds, quick)
        except Exception as e:  # noqa: BLE001 - a benchmark: the OCR rows stand, the cause is kept
            out["encoder"] = {"error": f"{type(e).__name__}: {e}"}
    if decoder:
        try:
            out["decoder"] = decoder_section(cli, quick)
        except Exception as e:  # noqa: BLE001 - a benchmark: the rows above stand
            out["decoder"] = {"error": f"{type(e).__name__}: {e}"}
    return out


def encoder_section(cli, slo: float, step_seconds: float, quick: bool) -> dict:
    """The zoo's all-mpnet-base-v2 (``benchmarks.zoo.mpnet``: from the package index, never a
    model hub) compiled with dynamic INT8, then served from UTF-8 sentences: inline, producer/
    consumer, and the FP32 model behind producer/consumer, with the CPU bound measured the same
    way. No naive FastAPI row: ``benchmarks.serve_naive`` reads images."""
    from benchmarks.zoo import mpnet
    from pipeline.serve import load
    from pipeline.serve.artifact import open_ref

    folder = mpnet.model_folder().resolve()
    size = mpnet.QUICK if quick else mpnet.FULL
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-text-"))
    try:
        data = tmp / "sentences.jsonl"
        data.write_text("".join(json.dumps({"text": t}) + "\n"
                                for t in mpnet.sentences(size["sentences"])))
        workdir = Path("artifacts") / "bench-serve-mpnet"
        run = mpnet.run_pipeline(cli, folder, data, workdir, "dynamic", size, quick)
        if "error" in run:
            return {"error": run["error"], "command": run.get("command")}
        run_dir = (workdir / "runs" / "latest").resolve()
        report = json.loads((run_dir / "report.json").read_text())
        # sentences the evaluation did not read (seed 1), as a client would send them
        bodies = [t.encode() for t in mpnet.sentences(64, seed=1)]
        out: dict = {"model": mpnet.NAME, "quant": "dynamic", "run": str(run_dir),
                     "slo_p99_ms": slo, "verdict": report["verdict"].get("summary"),
                     "body_bytes_median": int(np.median([len(b) for b in bodies]))}
        cfg = load.LoadConfig(slo_p99_ms=slo, step_seconds=step_seconds, window_s=1.0,
                              ci_level=STEP_LEVEL, max_step_seconds=MAX_STEP_SECONDS)
        serve = [sys.executable, "-m", "pipeline.serve"]
        fp32 = _fp32_folder(run_dir, report, tmp / "fp32")
        models = {"int8": open_ref(str(run_dir), tmp / "pulled"),
                  "fp32": open_ref(str(fp32), tmp / "pulled-fp32")}
        servers = {PIPELINE: serve + [str(run_dir)],
                   "int8 inline": serve + [str(run_dir), "--mode", "inline"],
                   "fp32 pipeline": serve + [str(fp32)]}
        out.update(_measured(servers, models, bodies, cfg, tmp, text=True))
        out["targets"] = targets(out)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def int8_vs_fp32(report: dict, servers: dict) -> dict:
    """The INT8 candidate's speedup over the FP32 model twice: the model alone (the run's own
    benchmark, FP32 p50 over the candidate's, per batch size) and end to end from raw bytes
    (behind the producer/consumer server: the ratio of the highest steady rates within the
    target, and of the p50 at the sweep's first step, where neither server queues)."""
    rows = {r.get("role"): r.get("latency") or {} for r in report.get("rows", [])}
    model = {b: rows["fp32"][b]["p50"] / c["p50"] for b, c in rows.get("candidate", {}).items()
             if b in rows.get("fp32", {}) and c.get("p50")}
    int8, fp32 = servers.get("int8 pipeline") or {}, servers.get("fp32 pipeline") or {}
    out: dict = {"model_only_p50_speedup": model}
    if int8.get("max_qps_within_slo") and fp32.get("max_qps_within_slo"):
        out["served_max_qps_ratio"] = int8["max_qps_within_slo"] / fp32["max_qps_within_slo"]
    if int8.get("steps") and fp32.get("steps"):
        out["served_p50_speedup_first_step"] = fp32["steps"][0]["p50_ms"] / \
            int8["steps"][0]["p50_ms"]
    return out


def bracket(row: dict, slo: float, max_error_share: float | None = None
            ) -> tuple[float, float | None]:
    """(low, high): a server's highest steady rate within the target lies in [low, high) with
    each step's interval level (``Step.p99_ci_ms``). ``low``: the highest steady rate whose p99
    interval lies wholly within the target, with its errors within their share (0 when none);
    ``high``: the lowest rate above it whose p99 interval lies wholly past the target or that
    failed more than that share (None when none did: unbounded). A step that never steadied, or
    whose interval straddles the target, decides neither end. Assumes the rate a server holds
    does not rise when it is offered more."""
    from pipeline.serve.load import LoadConfig

    if max_error_share is None:  # the share the load generator's own verdict allows
        max_error_share = LoadConfig().max_error_share
    low, misses = 0.0, []
    for st in row.get("steps", []):
        ci = st.get("p99_ci_ms") or [None, None]
        errors = sum((st.get("errors") or {}).values())
        failed = errors > max_error_share * max(st.get("sent", 0), 1)
        if st.get("steady") and not failed and ci[1] is not None and ci[1] <= slo:
            low = max(low, st["offered_qps"])
        elif failed or (ci[0] is not None and ci[0] > slo):
            misses.append(st["offered_qps"])
    above = [q for q in misses if q > low]
    return low, (min(above) if above else None)


def deciding(row: dict, pipeline: dict | None, slo: float, count: int):
    """Up to ``count`` rates at which to measure a server compared with the producer/consumer
    one (``pipeline``'s row, swept already), while its highest steady rate within the target
    lies below the pipeline's but no step of its own above that rate and below the pipeline's
    decided rate (``bracket``'s low end) was decided past the target, so that the ratio's
    interval reaches down to 1. Each rate is the geometric middle of the server's own highest
    rate (point estimate) and the pipeline's decided one: a step decided past the target there
    bounds the ratio above 1; a step that held, or decided nothing, moves the next rate up
    toward the pipeline's. The bisection's steps close the gap from below, at the server's
    own edge, where a step's interval straddles the target more often than not (run 10's
    ``inline``: 472 req/s read a p99 interval of 139 to 285 ms); this tests the question the
    comparison asks. Each step is one more interval at the step level, so one more chance of
    a wrong end: the bench keeps ``count`` small. Each new step is read from ``row`` as the
    caller appends it."""
    if not pipeline:
        return
    decided = bracket(pipeline, slo)[0]
    for _ in range(count):
        low, high = bracket(row, slo)
        own = max(row.get("max_qps_within_slo") or 0.0, low)
        if not decided or own >= decided or (high is not None and high < decided):
            return
        tried = [st["offered_qps"] for st in row["steps"] if st.get("deciding")]
        rate = (max([own, *tried]) * decided) ** 0.5
        if rate >= decided * 0.99:  # nothing left between the two
            return
        yield rate


def ratio_interval(a: dict, b: dict, slo: float) -> tuple[float, float | None]:
    """An interval for the ratio of two servers' highest steady rates within the target, from
    their brackets: [low_a / high_b, high_a / low_b], 0 and None where an end is unbounded."""
    low_a, high_a = bracket(a, slo)
    low_b, high_b = bracket(b, slo)
    low = low_a / high_b if high_b else 0.0
    high = high_a / low_b if high_a and low_b else None
    return low, high


def saturated(step: dict, steps: list[dict], bound_qps: float, cores: int) -> dict:
    """What a server answered when offered more than it can (``step``, at the CPU bound),
    whatever the latency: its capacity on these cores with the load generator beside it, as a
    share of the bound, and how busy the cores were (server and load generator CPU over cores x
    seconds); beside it the most any step of its sweep (``steps``) answered, since shedding
    costs CPU too and a step nearer its capacity may answer more. A capacity short of 80 % of
    the bound means no rate within any target reaches it here."""
    server_s = (step.get("server") or {}).get("cpu_s")
    client_s = step.get("client_cpu_s")
    answered = step["achieved_qps"]
    # the span the CPU was read over: the step, or longer when its last answers came after it
    # (achieved_qps is answers over that span, so it gives the span back)
    seconds = step["ok"] / answered if answered else step["seconds"]

    def per(cpu):
        return cpu * 1000.0 / step["ok"] if cpu and step["ok"] else None

    most = max([answered, *(st.get("achieved_qps", 0.0) for st in steps)])
    return {"offered_qps": step["offered_qps"], "answered_qps": answered,
            "most_answered_qps": most, "most_answered_fraction": most / bound_qps,
            "fraction_of_cpu_bound": answered / bound_qps, "errors": step["errors"],
            "p99_ms": step["p99_ms"], "inference_busy_share": step.get("inference_busy_share"),
            "server_cpu_ms_per_request": per(server_s),
            "client_cpu_ms_per_request": per(client_s),
            "cores_busy_share": (server_s + client_s) / (cores * seconds)
            if server_s and client_s else None}


def targets(section: dict) -> dict:
    """Highest steady rates within the target (req/s), compared as the issue asks, and the
    producer/consumer server's fraction of its CPU bound (>= 80 %); a comparison with a server
    the section did not run is left out."""
    servers, slo = section["servers"], section["slo_p99_ms"]
    pipe = servers.get("int8 pipeline") or {}
    rows = {"INT8 from raw bytes: producer/consumer beats inline": ("int8 inline", "inline"),
            "INT8 from raw bytes: producer/consumer beats a naive FastAPI handler":
                ("int8 naive FastAPI", "naive"),
            "producer/consumer: INT8 beats FP32 end to end": ("fp32 pipeline", "fp32")}
    out = {}
    for what, (name, short) in rows.items():
        if name not in servers:
            continue
        low, high = ratio_interval(pipe, servers[name], slo)
        a, b = pipe.get("max_qps_within_slo") or 0.0, servers[name].get("max_qps_within_slo") or 0.0
        out[f"{what} (95 % interval of the ratio above 1)"] = [
            {"pipeline": round(a, 1), short: round(b, 1), "ratio": a / b if b else None,
             "ci95": [low, high]}, low > 1.0]
    share = (section["servers"].get("int8 pipeline") or {}).get("fraction_of_cpu_bound")
    if share is not None:
        out["INT8 producer/consumer reaches >= 80 % of the CPU bound"] = [round(share, 3),
                                                                           share >= 0.8]
    from pipeline.config.bench import LoadConfig

    leak = LoadConfig().leak_mb_per_min  # the pipeline's own leak threshold (bench.load)
    soak = section.get("soak") or {}
    if "rss_slope_mb_per_min" in soak:
        flat = (not soak["errors"] and soak["window_p99_ms_first_last"][-1] <= section["slo_p99_ms"]
                and soak["rss_slope_mb_per_min"] is not None
                and soak["rss_slope_mb_per_min"] <= leak)
        out[f"soak at {SOAK_SHARE:.0%} of the highest rate: no errors, last window's p99 within "
            f"the target, RSS slope <= {leak:g} MB/min"] = [
            {"errors": sum(soak["errors"].values()) if soak["errors"] else 0,
             "last_p99_ms": round(soak["window_p99_ms_first_last"][-1], 1),
             "rss_slope_mb_per_min": soak["rss_slope_mb_per_min"]}, flat]
    return out



def table(section: dict) -> list[str]:
    """The results page's rows: each server's highest steady rate within the target, its share
    of the CPU bound and the stages of its fastest step that met it; the OCR model's, then the
    encoder's, then the decoder's streams."""
    if "servers" not in section:
        return []
    lines = _rows(section, f"PNG at {section['scale']:g}x")
    versus = section.get("int8_vs_fp32") or {}
    if versus:
        model = ", ".join(f"{v:.2f}x at batch {b}"
                          for b, v in versus.get("model_only_p50_speedup", {}).items())
        lines.append(f"\nINT8 over FP32: the model alone {model or '—'} (the run's benchmark, "
                     f"p50); end to end from PNG bytes "
                     f"{_times(versus.get('served_max_qps_ratio'))} in the highest steady rate "
                     f"and {_times(versus.get('served_p50_speedup_first_step'))} in p50 at the "
                     "first step (producer/consumer).")
    if "soak" in section:
        k = section["soak"]
        slopes = (f"; slopes per minute: p99 {_signed(k.get('p99_slope_ms_per_min'))} ms, "
                  f"RSS {_signed(k.get('rss_slope_mb_per_min'))} MB (the server's process tree)"
                  if "rss_slope_mb_per_min" in k else "")
        lines.append(f"\nSoak: {k['qps']:.1f} req/s for {k['seconds']:g} s, p99 {k['p99_ms']:.1f} "
                     f"ms, errors {k['errors'] or 0}, server RSS {k['rss_mb_before_after'][0]:.0f}"
                     f" -> {k['rss_mb_before_after'][1]:.0f} MB{slopes}.")
        if k.get("error_windows"):  # when the errors came: one burst, or spread over the soak
            spans = ", ".join(f"{n} at {t:g}-{t + k['window_s']:g} s" for t, n in k["error_windows"])
            lines.append(f"Errors by {k['window_s']:g} s window: {spans}; the worst window's p99 "
                         f"{k['window_p99_ms_max']:.0f} ms.")
    enc = section.get("encoder") or {}
    if "servers" in enc:
        lines += ["", f"Text encoder {enc['model']} ({enc['quant']} INT8; gate: {enc['verdict']})"
                      f"{_kept(enc)}:", ""] + _rows(enc, "UTF-8 sentences")
    elif "error" in enc:
        lines += ["", f"Text encoder: not measured ({enc['error']})"]
    dec = section.get("decoder") or {}
    return lines + [""] + ([f"Decoder{_kept(dec)}:", ""] if _kept(dec) else []) + \
        decoder_table(dec)


def _kept(part: dict) -> str:
    """Where a part was kept from an earlier bench run (``benchmarks.run --serve-parts``): its
    own time and CPU, else nothing."""
    if not part.get("measured_at"):
        return ""
    cpu = (part.get("cpu") or {}).get("model", "CPU not recorded")
    return f", kept from the run of {part['measured_at']} on {cpu}"


def _times(value) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "—"


def _share(row: dict) -> str:
    """The served rate as a share of the bound with the load generator's CPU counted, or —."""
    shared = row.get("bound_with_load_generator_qps")
    return f"{row['max_qps_within_slo'] / shared:.0%}" if shared else "—"


def _signed(value) -> str:
    return f"{value:+.2f}" if isinstance(value, (int, float)) else "—"


def _ms(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and value == value else "—"


def _rows(section: dict, bodies: str) -> list[str]:
    lines = []
    bounds = section["cpu_bound"]
    if "cores" in bounds:  # a section measured before the bound was the issue's
        lines.append(f"CPU bound, as measured before issue 36's definition (wall time): the model "
                     f"alone {bounds['model_ms_b1']:.2f} ms at batch 1, decoding + preprocessing "
                     f"{bounds['decode_preprocess_ms_1_core']:.2f} ms on one core: at most "
                     f"{bounds['bound_qps_serial']:.0f} requests/s one after the other.\n")
        bounds = {}
    for key, b in bounds.items():
        lines.append(
            f"CPU bound of the {key.upper()} model on {b['cores']} usable cores: "
            f"{b['bound_qps']:.0f} requests/s = {b['cores']} cores / "
            f"{b['cpu_ms_per_request']:.2f} CPU-ms a request (decode + preprocess "
            f"{b['decode_preprocess_cpu_ms']:.2f}, inference {b['inference_cpu_ms']:.2f} on "
            f"{b['threads']} thread(s) at {b['batches_from']}, HTTP {_ms(b['http_cpu_ms'])} "
            f"with its body; a GET /healthz: {_ms(b.get('http_get_cpu_ms'))}).\n")
    lines += [f"| server (p99 <= {section['slo_p99_ms']:g} ms, {bodies}) "
              "| highest steady rate | of the CPU bound | model busy | server CPU-ms a request "
              "| load generator CPU-ms a request | of the bound with the load generator's CPU "
              "| p50 / p99 there | decode | preprocess | queue "
              "| inference | postprocess | network |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in section["servers"].items():
        st = _best(s)
        if st is None:
            lines.append(f"| {name} | 0 | 0 % | | | | | — | | | | | | |")
            continue
        ms = st.get("stage_ms", {})
        cells = [_ms(ms.get(k)) for k in ("decode", "preprocess", "queue", "inference",
                                          "postprocess")]
        busy = s.get("inference_busy_share")
        lines.append(f"| {name} | {s['max_qps_within_slo']:.1f} req/s | "
                     + (f"{s['fraction_of_cpu_bound']:.0%}" if "fraction_of_cpu_bound" in s
                        else "—") + " | "
                     + (f"{busy:.0%}" if busy is not None and busy == busy else "—")
                     + f" | {_ms(s.get('server_cpu_ms_per_request'))}"
                     + (f" (main {_ms(s['server_main_cpu_ms_per_request'])})"
                        if s.get("server_main_cpu_ms_per_request") else "") + " "
                     f"| {_ms(s.get('client_cpu_ms_per_request'))} | {_share(s)} "
                     f"| {st['p50_ms']:.1f} / "
                     f"{st['p99_ms']:.1f} ms | " + " | ".join(cells)
                     + f" | {_ms(st['network_ms'])} |")
    full = {name: s["saturated"] for name, s in section["servers"].items() if "saturated" in s}
    if full:
        offered = max(k["offered_qps"] for k in full.values())
        lines.append(f"\nOffered {offered:.0f} req/s (the INT8 model's bound at batch 1 before "
                     "the HTTP part: more than any of them answers), whatever the latency: "
                     + "; ".join(
                         f"{name} answered {k['answered_qps']:.0f} req/s "
                         f"({k['fraction_of_cpu_bound']:.0%} of its bound"
                         + (f", cores {k['cores_busy_share']:.0%} busy with the load generator"
                            if k.get("cores_busy_share") else "") + ")"
                         + (f", at most {k['most_answered_qps']:.0f} in any step "
                            f"({k['most_answered_fraction']:.0%})"
                            if k.get("most_answered_qps") else "")
                         for name, k in full.items()) + ".")
    return lines
