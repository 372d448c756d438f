"""The load generator (``python -m pipeline.serve load``) against the real server on 127.0.0.1:
2 s of open-loop arrivals at a low rate and a 1 s concurrency step, over real encoded files, some
of them not images. What is checked is the report's structure and its counting (every request
sent is answered or counted as an error, and the errors and successes it counts are the ones the
server's own /metrics counted, the batches it formed answered the step's good requests), never
how fast anything was.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import requests

from tests.conftest import ROOT, one_line, run_folder
from tests.serve_helpers import line_png, metrics, start


@pytest.fixture(scope="module")
def server(tiny_run, tmp_path_factory):
    _, proc = tiny_run
    running = start(str(run_folder(proc)), tmp_path_factory.mktemp("serve"),
                    "--workers", "1", "--threads", "1")
    yield running
    assert running.stop() == 0, running.log.read_text()


def test_a_runs_folder_is_served_as_the_version_it_published(server, tiny_run, monkeypatch):
    from pipeline.serve import load

    report = json.loads((run_folder(tiny_run[1]) / "report.json").read_text())
    exact = report["published"].split(" ")[0]
    assert "@sha256:" in exact
    assert requests.get(f"{server.url}/readyz", timeout=30).json()["version"] == exact
    # what the load report records, read as the load's own requests go: past any proxy the
    # environment names (nothing listens at this one)
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert load.ready(server.url)["version"] == exact


def test_open_loop_and_concurrency_report_counts_what_was_sent(server, tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    for k in range(2):
        (folder / f"line{k}.png").write_bytes(line_png(width=80 + 8 * k, seed=k))
        (folder / f"notes{k}.txt").write_bytes(b"not an image, " * (k + 1))
    out = tmp_path / "load.json"
    before = metrics(server.url)
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", "load", server.url,
                           "--files", str(folder), "--rates", "6", "--seconds", "2",
                           # 6 req/s is far too few for a p99 interval: the step runs to 3 s
                           "--max-seconds", "3",
                           "--window", "0.5", "--slo-ms", "10000", "--concurrency", "2",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = metrics(server.url)
    report = json.loads(out.read_text())
    assert report["url"] == server.url and report["bodies"] == 4
    # what the numbers belong to: the server's /readyz (its version and settings) as it was
    assert report["server"] == requests.get(f"{server.url}/readyz", timeout=30).json()
    assert f"load: {server.url} serves {report['server']['version']}" in proc.stdout
    (step,) = report["steps"]
    assert step["offered_qps"] == 6 and step["sent"] > 0
    assert step["ok"] + sum(step["errors"].values()) == step["sent"]
    assert step["ok"] > 0 and step["errors"].get("415", 0) > 0, step
    assert set(step) >= {"p50_ms", "p99_ms", "p999_ms", "achieved_qps", "window_p50_ms", "window_p99_ms",
                         "steady", "meets_slo", "network_ms"}
    assert step["client_cpu_s"] > 0  # the generator's own CPU over the step, measured
    assert set(step["stage_ms"]) == {"decode", "preprocess", "queue", "inference",
                                     "postprocess", "server_total"}
    assert step["seconds"] == 3 and len(step["window_p99_ms"]) == 6  # 3 s in windows of 0.5 s
    (conc,) = report["concurrency"]
    assert conc["concurrency"] == 2 and conc["ok"] > 0 and conc["errors"].get("415", 0) > 0

    def delta(*key):
        return after.get(key, 0.0) - before.get(key, 0.0)

    # the server saw exactly what the client counted
    assert delta("serve_requests_total", ("outcome", "ok")) == step["ok"] + conc["ok"]
    assert delta("serve_errors_total", ("status", "415")) == \
        step["errors"]["415"] + conc["errors"]["415"]
    # the batches the server formed in the open-loop step answered exactly its good requests (the
    # 415s never reached the model), and its one model thread was busy part of the step
    assert sum(int(size) * runs for size, runs in step["batch_sizes"].items()) == step["ok"]
    assert 0 < step["inference_busy_share"] <= 1, step["inference_busy_share"]
    assert delta("serve_inference_busy_seconds_total") > 0
    assert "highest rate with p99" in proc.stdout


def test_the_generator_keeps_no_python_object_per_request(server, tmp_path, monkeypatch):
    """A soak sends hundreds of thousands of requests: what the generator keeps of each must not
    be a Python object, or the collector's full passes grow with the step until one stalls the
    sends for longer than the server's queue absorbs (a soak's 503s were that). Counted where
    the step's sending ends, for a short step and one five times longer, against the real
    server."""
    import asyncio
    import gc

    from pipeline.serve import load

    bodies = [line_png(width=80, seed=0)]
    cfg = load.LoadConfig(step_seconds=1.0, slo_p99_ms=10000.0)
    grown = {}
    summarize = load._summarize

    def counting(step, records, elapsed, cfg):
        gc.collect()
        grown[step.offered_qps] = (len(gc.get_objects()) - start, step.sent)
        return summarize(step, records, elapsed, cfg)

    monkeypatch.setattr(load, "_summarize", counting)
    for qps in (20.0, 40.0, 200.0):  # the first imports aiohttp and opens its first connections
        gc.collect()
        start = len(gc.get_objects())
        step = asyncio.run(load.open_loop(server.url, bodies, qps, cfg))
        assert step.ok == step.sent, step.errors
    (few, sent_few), (many, sent_many) = grown[40.0], grown[200.0]
    assert sent_many - sent_few > 100
    # a tuple, a timings dict and a finished task per request would be 3 objects each
    assert many - few < 0.25 * (sent_many - sent_few), grown


def test_load_goes_to_this_machine_only_and_a_negative_step_cap_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", "load",
                           "http://192.0.2.1:8000", "--rates", "1", "--seconds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    one_line(proc, 2, "192.0.2.1", "--allow-remote")
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", "load",
                           "http://127.0.0.1:9", "--max-seconds", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    one_line(proc, 2, "--max-seconds >= 0")


def test_load_numbers_and_targets_that_cannot_work_are_one_line_before_any_request(tmp_path):
    base = [sys.executable, "-m", "pipeline.serve", "load"]
    for args, words in ((["http://127.0.0.1:9", "--scale", "nan"], "--scale"),
                        (["http://127.0.0.1:9", "--start-qps", "nan"], "--start-qps"),
                        (["http://127.0.0.1:9", "--scale", "0"], "--scale"),
                        (["http://127.0.0.1:9", "--max-in-flight", "0"], "--max-in-flight"),
                        (["http://127.0.0.1:9", "--ocr-lines", "0"], "--ocr-lines"),
                        (["127.0.0.1:9"], "http://"),
                        (["http://127.0.0.1:9", "--out", str(tmp_path)], "a folder"),
                        (["http://127.0.0.1:9", "--out", str(tmp_path / "no" / "x.json")],
                         "does not exist")):
        proc = subprocess.run(base + args, cwd=ROOT, capture_output=True, text=True, timeout=60)
        one_line(proc, 2, words)
    assert list(tmp_path.iterdir()) == []  # no report, no half-written .tmp


def test_a_load_run_that_no_server_answered_fails_and_its_report_is_strict_json(tmp_path):
    """Nothing listens on the discard port: every request fails to connect. That is no rate of
    0 req/s: exit 3 in one line, naming the URL; the report still says what was sent, as JSON a
    strict parser reads (the latencies it could not measure are null, not NaN)."""
    out = tmp_path / "load.json"
    proc = subprocess.run([sys.executable, "-m", "pipeline.serve", "load", "http://127.0.0.1:9",
                           "--rates", "5", "--seconds", "1", "--ocr-lines", "4", "--out",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    one_line(proc, 3, "http://127.0.0.1:9", "no request was answered")
    report = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    (step,) = report["steps"]
    assert step["sent"] > 0 and step["ok"] == 0 and step["p99_ms"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["load.json"]


def test_refinement_bisects_between_the_last_rate_that_met_the_target_and_the_first_above():
    """The outcomes are injected (a server that meets the target up to 140 req/s): each refined
    rate is the geometric middle of the bracket, and the bracket narrows with every outcome."""
    from pipeline.serve.load import Step, refined

    def step(qps: float) -> Step:
        return Step(qps, 1.0, steady=True, meets_slo=qps <= 140.0)

    steps = [step(q) for q in (100.0, 150.0)]
    tried = []
    for qps in refined(steps, 3):
        tried.append(qps)
        steps.append(step(qps))
    assert tried[0] == pytest.approx((100.0 * 150.0) ** 0.5)  # 122.5: meets, so lo rises
    assert tried[1] == pytest.approx((tried[0] * 150.0) ** 0.5)  # 135.6: meets
    assert tried[2] == pytest.approx((tried[1] * 150.0) ** 0.5)  # 142.6: misses
    assert max(s.offered_qps for s in steps if s.meets_slo) == pytest.approx(tried[1])
    # a step that met the target but never steadied bounds the bracket from above like a miss
    unsteady = [Step(100.0, 1.0, steady=True, meets_slo=True), Step(150.0, 1.0, steady=False)]
    assert list(refined(unsteady, 1)) == [pytest.approx(122.47, rel=1e-3)]
    assert list(refined([step(100.0)], 3)) == []  # nothing above missed: nothing to refine
    assert list(refined([step(200.0)], 3)) == []  # nothing met the target


def test_a_sweep_whose_first_rate_misses_steps_down_until_one_holds_then_refines(monkeypatch):
    """The outcomes are injected (a server that meets the target up to 7 req/s, swept from 20):
    the sweep goes down by its growth factor until a rate holds, then bisects the bracket above
    it, and reports that rate, not 0."""
    from pipeline.serve import load

    sent = []

    async def open_loop(url, bodies, qps, cfg, seed=0, probe=None):
        sent.append(qps)
        ok = qps <= 7.0
        return load.Step(qps, 1.0, sent=10, p99_ms=50.0 if ok else 500.0, steady=True,
                         meets_slo=ok)

    monkeypatch.setattr(load, "open_loop", open_loop)
    report = load.run("http://127.0.0.1:1", [b"x"], load.LoadConfig(slo_p99_ms=100.0),
                      start_qps=20.0, growth=2.0, max_steps=6, refine=2)
    assert sent[:4] == [20.0, 10.0, 5.0, pytest.approx((5.0 * 10.0) ** 0.5)]
    assert report.max_qps_within_slo == max(q for q in sent if q <= 7.0)
    assert report.max_qps_within_slo > 5.0  # refined above the first rate that held
    assert list(load.lower([load.Step(20.0, 1.0, steady=True, meets_slo=True)], 20.0, 2.0,
                           6)) == []  # a rate held: nothing to go down to


def test_medians_within_a_small_share_of_the_target_are_steady_and_a_climbing_queue_is_not():
    """Window medians of 12-19 ms against a 200 ms target (a shared host's noise) are steady; the
    same relative spread at 100-180 ms, or medians that climb, are not."""
    from pipeline.serve.load import LoadConfig, _steady

    cfg = LoadConfig(slo_p99_ms=200.0)
    assert _steady([15.2, 15.5, 12.6, 12.2, 19.3], cfg)
    assert not _steady([80.0, 120.0, 100.0, 100.0, 180.0], cfg)
    assert not _steady([10.0, 40.0, 90.0, 160.0, 250.0], cfg)
    # the floor is a share of the target: without it the first case reads unsteady
    assert not _steady([15.2, 15.5, 12.6, 12.2, 19.3], LoadConfig(slo_p99_ms=200.0,
                                                                  steady_floor=0.0))


def test_the_p99_interval_covers_the_true_p99_at_about_its_level_and_is_open_when_too_few():
    """Drawn from a known distribution (exponential, p99 = ln 100): the interval holds the true
    value in about 95 % of 400 samples of 2,000, and has no upper end with 50 values."""
    import numpy as np

    from pipeline.serve.load import quantile_interval

    rng, true = np.random.default_rng(0), float(np.log(100.0))
    hits = 0
    for _ in range(400):
        lo, hi = quantile_interval(rng.exponential(size=2000), 0.99, 0.95)
        hits += lo <= true <= hi
    assert 0.90 <= hits / 400 <= 0.99
    lo, hi = quantile_interval(rng.exponential(size=50), 0.99, 0.95)
    assert hi is None and lo is not None


def test_a_step_runs_long_enough_for_its_p99_interval_to_close_up_to_its_cap():
    """``interval_requests`` is the fewest values whose p99 interval has both ends (one fewer
    leaves it open); a step at a rate that would send fewer in ``step_seconds`` runs longer, a
    tenth past that count, up to ``max_step_seconds``; without a cap every step is as long."""
    import numpy as np

    from pipeline.serve import load

    for level in (0.95, 1 - 0.05 / 4):
        n = load.interval_requests(0.99, level)
        assert None not in load.quantile_interval(np.arange(n), 0.99, level)
        assert load.quantile_interval(np.arange(n - 1), 0.99, level)[1] is None
    need = load.interval_requests(0.99, 0.95)
    capped = load.LoadConfig(step_seconds=5.0, max_step_seconds=30.0)
    assert load.step_length(1000.0, capped) == 5.0          # plenty in 5 s
    assert load.step_length(need / 10, capped) == pytest.approx(11.0)
    assert load.step_length(1.0, capped) == 30.0            # the cap
    assert load.step_length(1.0, load.LoadConfig(step_seconds=5.0)) == 5.0


def test_a_window_whose_p99_falls_on_failed_requests_reads_infinitely_late_not_nan():
    from pipeline.serve.load import LoadConfig, Records, Step, _summarize

    ok = [(k / 100.0, 5.0, 200, {"total": 4.0}) for k in range(98)]
    failed = [(0.985, float("inf"), "503", None), (0.99, float("inf"), "503", None)]
    step = _summarize(Step(100.0, 1.0), Records.of(ok + failed), 1.0, LoadConfig(slo_p99_ms=100.0))
    assert step.window_p99_ms == [float("inf")] and step.window_p50_ms == [5.0]
    assert step.errors == {"503": 2} and not step.meets_slo


def test_errors_are_counted_in_the_window_they_were_sent_in():
    from pipeline.serve.load import LoadConfig, Records, Step, _summarize

    ok = [(k / 100.0, 5.0, 200, {"total": 4.0}) for k in range(300)]  # 3 s at 100 req/s
    shed = [(1.2, 40.0, "503", None), (1.3, 41.0, "503", None), (2.5, float("inf"), "dropped", None)]
    step = _summarize(Step(100.0, 3.0), Records.of(ok + shed), 3.0, LoadConfig(slo_p99_ms=100.0))
    assert step.window_errors == [0, 2, 1]
    assert step.errors == {"503": 2, "dropped": 1}


def test_each_body_is_declared_as_a_client_would_declare_it():
    """Images by their magic bytes, a JSON object (a model of arrays' one sample, or a text
    model's {"text": ...}) as JSON, any other UTF-8 as text, the rest as bytes."""
    from pipeline.serve.load import _content_type

    assert _content_type(line_png()) == "image/png"
    assert _content_type(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert _content_type(b' {"inputs": {"x": [1.5, 2]}}') == "application/json"
    assert _content_type(json.dumps({"text": "a sentence"}).encode()) == "application/json"
    for sentence in (b"a sentence", b"{braces} open this sentence", b"[1, 2]", b"{" * 5000):
        assert _content_type(sentence) == "text/plain; charset=utf-8", sentence[:20]
    assert _content_type(b"\xff\xfe\x00") == "application/octet-stream"
