"""Sweeps and concurrent jobs: Hydra's multirun through the joblib launcher and a real local Ray
cluster, a cache key built once by two processes, timed stages that never overlap, and a killed
point whose locks die with it. The tiny network's cache from the shared run is copied in, so
only the stages a test is about are built."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, seeded, seeded_args

# Short timings: one batch size, no cold start (every other stage comes from the copied cache).
FAST = ["bench.batch_sizes=[8]", "bench.cold_start_repeats=0"]


def sweep_args(tiny_run, work: Path, *extra: str, fast=True) -> list[str]:
    """The shared tiny run's arguments on ``work``, FAST, then ``extra`` (which wins)."""
    fast = FAST if fast else []
    mine = {a.split("=", 1)[0] for a in (*fast, *extra)}
    args = [a for a in seeded_args(tiny_run, work) if a.split("=", 1)[0] not in mine]
    return ["-m", *args, *fast, *extra]


def summary_of(proc) -> dict:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("summary: "))
    return json.loads(Path(line.split(": ", 1)[1]).with_name("summary.json").read_text())


def reports(summary: dict) -> list[dict]:
    return [json.loads(Path(r["report"]).with_name("report.json").read_text())
            for r in summary["rows"]]


def timed_windows(reps: list[dict]) -> list[tuple]:
    """(start, end, host, label) of every timed stage these runs built, from their reports."""
    return [(s["slot"]["start"], s["slot"]["end"], s["slot"]["host"], s["label"])
            for rep in reps for s in rep["stages"]
            if s["stage"] in ("benchmark", "loadtest", "explain", "compare") and not s["reused"]]


def assert_alone(windows: list[tuple]) -> None:
    ordered = sorted(windows)
    for (s0, e0, h0, l0), (s1, e1, h1, l1) in zip(ordered, ordered[1:]):
        assert h0 != h1 or e0 <= s1, f"{l0} ({s0:.2f}-{e0:.2f}) overlapped {l1} ({s1:.2f}-{e1:.2f})"


def check_parallel_sweep(s: dict, nonce: str, nonces: str = "ab") -> list[dict]:
    """Two points per nonce (two gate settings), one new benchmark per nonce, wanted by its two
    points at once: each benchmark was built by one point and reused by the other, and no two
    timed stages overlapped."""
    n = 2 * len(nonces)
    assert [r["verdict"] for r in s["rows"]] == ["PASS"] * n
    swept = len(nonces) > 1  # a point names only the options that vary
    assert [r["point"] for r in s["rows"]] == [
        (f"bench.nonce={nonce}{x} " if swept else "") + f"gate.max_accuracy_drop={d}"
        for x in nonces for d in ("0.3", "0.5")]
    for r in s["rows"]:
        assert r["published"] and Path(r["report"]).is_file()
        assert r["speedup"] > 0 and len(r["speedup_ci95"]) == 2 and r["p99_ms"] > 0
        assert r["size_mb"] > 0 and r["accuracy_drop"] is not None
    assert s["pareto"] and s["best_per_model"]["ocr_tiny"]["num"] in range(n)
    sweep_dir = Path(s["sweep_dir"])
    assert (sweep_dir / "pareto.png").stat().st_size > 1000
    assert "Best gated point per model" in (sweep_dir / "summary.md").read_text()
    w = sorted((r["started"], r["ended"]) for r in s["rows"])
    assert any(a[1] > b[0] for a, b in zip(w, w[1:])), "no two points ran at the same time"
    reps = reports(s)
    for k in range(0, n, 2):  # the same benchmark key: built once, reused once
        bench = [st for rep in reps[k:k + 2] for st in rep["stages"] if st["stage"] == "benchmark"]
        assert len({st["path"] for st in bench}) == 1
        assert sorted(st["reused"] for st in bench) == [False, True]
    windows = timed_windows(reps)
    assert sum(lab == "benchmark" for *_, lab in windows) == len(nonces)
    assert_alone(windows)
    assert s["overlapping_timed_stages"] == []
    return reps


@pytest.mark.slow
def test_joblib_sweep_of_four_points(tiny_run, tmp_path):
    work = seeded(tiny_run, tmp_path / "work")
    nonce = uuid.uuid4().hex[:6]
    proc = run_cli(*sweep_args(tiny_run, work, f"bench.nonce={nonce}a,{nonce}b",
                               "gate.max_accuracy_drop=0.3,0.5",
                               "hydra/launcher=joblib", "hydra.launcher.n_jobs=4"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_parallel_sweep(summary_of(proc), nonce)


@pytest.mark.slow
def test_failed_points_are_rows(tiny_run, tmp_path):
    """A failed gate and a point that cannot start are rows; the sweep goes on and exits 3."""
    work = seeded(tiny_run, tmp_path / "work")
    proc = run_cli(*sweep_args(tiny_run, work, "gate.min_speedup=100",
                               "hardware.provider=CPUExecutionProvider,NoSuchExecutionProvider",
                               fast=False))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = summary_of(proc)["rows"]
    assert [r["verdict"] for r in rows] == ["FAIL", "ERROR"]
    assert rows[0]["error"].startswith("FAIL:") and "95% CI" in rows[0]["error"]
    assert rows[0]["published"] is None
    assert rows[0]["speedup"] is not None and Path(rows[0]["report"]).is_file()
    assert "NoSuchExecutionProvider" in rows[1]["error"] and rows[1]["exit_code"] == 2


def test_a_bad_value_in_any_point_ends_the_sweep_before_it_runs(tmp_path):
    proc = run_cli("-m", "model=ocr_tiny", f"workdir={tmp_path}", "quant=int8,nosuch")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: quant=nosuch: no such option")
    assert not (tmp_path / "cache").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_cluster():
    """A real one-node Ray cluster on 127.0.0.1 carrying the ``hardware_cpu`` label; killed (its
    whole process group) afterwards."""
    pytest.importorskip("ray")
    port = _free_port()
    temp = Path(tempfile.mkdtemp(prefix="ray-"))  # short: Ray's socket paths must fit 107 bytes
    # TMPDIR: the runs' forkservers in Ray's workers die with the cluster (SIGKILL, below), and
    # their scratch folders go with this folder
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
           "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
         "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=4",
         '--resources={"hardware_cpu": 1}', "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        seen = []
        for line in proc.stdout:  # ready once it says it blocks
            seen.append(line)
            if "will now block" in line:
                break
        else:
            pytest.fail("ray start did not come up: " + "".join(seen[-20:]))
        yield f"127.0.0.1:{port}"
    finally:
        # not SIGTERM first: `ray start --block` and its GCS server outlive it by 30 s and more
        # (measured), so a grace period only idled the worker before this same SIGKILL
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        # The group's other processes die in their own time and write logs as they go: remove
        # the folder once none is left (a killed group is gone within a second or two).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_ray_sweep_on_a_local_cluster(tiny_run, tmp_path, ray_cluster):
    work = seeded(tiny_run, tmp_path / "work")
    nonce = uuid.uuid4().hex[:6]
    # two points (the four-point case is the joblib test's): the cluster's part is the same
    proc = run_cli(*sweep_args(tiny_run, work, f"bench.nonce={nonce}a",
                               "gate.max_accuracy_drop=0.3,0.5", "hydra/launcher=ray",
                               f"hydra.launcher.address={ray_cluster}"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reps = check_parallel_sweep(summary_of(proc), nonce, nonces="a")
    built = [st for rep in reps for st in rep["stages"]
             if st["stage"] == "benchmark" and not st["reused"]]
    assert built and all(st.get("node") == socket.gethostname() for st in built)
    for rep in reps:  # the environment the gate checked is the one the benchmark ran in
        same = next(c for c in rep["verdict"]["checks"] if c["check"] == "same_environment")
        assert same["passed"]


def _slow(work: Path, seconds: float, tag: str) -> subprocess.Popen:
    # a killed job's scratch folders (its forkserver's) stay in the test's folder, not in /tmp
    scratch = work / "tmp"
    scratch.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "tests.slow_stage", str(work), str(seconds), tag],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                           "TMPDIR": str(scratch)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_two_processes_needing_one_stage_build_it_once(tmp_path):
    first, second = _slow(tmp_path, 3, "x"), _slow(tmp_path, 3, "x")
    outs = [p.communicate(timeout=120)[0] for p in (first, second)]
    results = sorted(ln.split()[1] for o in outs for ln in o.splitlines() if ln.startswith("RESULT"))
    assert results == ["built", "reused"], outs
    assert len({ln.split()[2] for o in outs for ln in o.splitlines() if ln.startswith("RESULT")}) == 1
    assert any("waiting: another job is building benchmark" in o for o in outs), outs


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_a_killed_job_leaves_no_lock_behind(tmp_path):
    job = _slow(tmp_path, 600, "y")  # holds the key lock and the machine-wide lock while it sleeps
    stage_dir = tmp_path / "cache" / "benchmark"
    deadline = time.time() + 60
    while not list(stage_dir.glob(".tmp-*/pid")):
        assert time.time() < deadline and job.poll() is None, "the stage never started"
        time.sleep(0.1)
    os.killpg(job.pid, signal.SIGKILL)  # the job and its forkserver (the stage's child follows)
    job.wait()
    t0 = time.time()
    again = _slow(tmp_path, 0.1, "y")
    out = again.communicate(timeout=180)[0]
    assert again.returncode == 0 and "RESULT built" in out, out
    # The dead job's key lock went with it: no wait for it. (A wait for the machine-wide timing
    # lock is legitimate when other jobs measure on this machine, e.g. a parallel test worker;
    # the dead job's own sleep would have held everything for ten minutes; a busy machine takes
    # its time to start the second job, not minutes.)
    assert "another job is building" not in out, out
    assert time.time() - t0 < 120, out


def test_pareto_front_and_best_point_per_model():
    from pipeline.cli.sweep.summary import (Overlap, PointRow, TimedWindow, best_per_model,
                                            overlaps, pareto)

    def row(num, model, verdict, drop, speedup, mb):
        return PointRow(num=num, point=str(num), model=model, quant="int8", calibration="minmax",
                        verdict=verdict, accuracy_drop=drop, speedup=speedup, size_mb=mb)

    rows = [row(0, "a", "PASS", 0.0, 2.0, 1.0),   # front
            row(1, "a", "PASS", 0.1, 1.5, 1.0),   # dominated by 0
            row(2, "a", "FAIL", 0.5, 3.0, 1.0),   # front (fastest), but failed its gate
            row(3, "b", "PASS", 0.0, 1.2, 0.5),   # front (smallest)
            row(4, "b", "ERROR", None, None, None)]
    assert pareto(rows) == [0, 2, 3]
    best = best_per_model(rows)
    assert best["a"].num == 0 and best["b"].num == 3
    rows[0].timed = [TimedWindow("benchmark", "h", 0.0, 2.0)]
    rows[1].timed = [TimedWindow("benchmark", "h", 2.0, 3.0)]
    assert overlaps(rows) == []
    rows[3].timed = [TimedWindow("explain", "h", 2.5, 4.0)]
    assert overlaps(rows) == [Overlap("#1 benchmark", "#3 explain")]


def test_summary_json_reads_back_as_its_records_key_for_key():
    """summary.json is written by field: a finished point's row has the keys sweeps have always
    written (no more, no fewer), and the whole summary reads back into equal records."""
    import json

    from pipeline.cli.sweep.summary import Best, PointRow, SweepSummary, TimedWindow
    from pipeline.core.json_record import from_json, to_json

    row = PointRow(num=0, point="quant=int8", model="ocr_tiny", quant="int8",
                   calibration="minmax", verdict="PASS", accuracy_drop=0.1, speedup=1.7,
                   speedup_ci95=(1.6, 1.8), p99_ms=3.2, size_mb=0.4, published="ocr_tiny:int8",
                   report="/r/report.md", exit_code=0, seconds=12.5,
                   timed=[TimedWindow("benchmark", "h", 1.0, 2.0, 0.0)], started=0.5, ended=13.0,
                   batch=8, stages_built=9, stages=12, overrides=["quant=int8"], pareto=True)
    died = PointRow(num=1, point="quant=mixed", model="ocr_tiny", quant="mixed",
                    calibration="minmax", error="no result")
    summary = SweepSummary(sweep_dir="/s", points=2, rows=[row, died], pareto=[0],
                           best_per_model={"ocr_tiny": Best(0, "quant=int8", 1.7, 0.1, 0.4,
                                                            "ocr_tiny:int8")},
                           overlapping_timed_stages=[], wall_s=20.0, timed_s=1.0,
                           compile_wall_s=19.0, exit_code=3, figure="pareto.png")
    written = json.loads(json.dumps(to_json(summary)))
    assert list(written["rows"][0]) == [
        "num", "point", "model", "quant", "calibration", "verdict", "error", "accuracy_drop",
        "speedup", "speedup_ci95", "p99_ms", "size_mb", "published", "report", "exit_code",
        "seconds", "timed", "started", "ended", "batch", "stages_built", "stages", "overrides",
        "pareto"]
    assert written["rows"][0]["timed"] == [{"label": "benchmark", "host": "h", "start": 1.0,
                                            "end": 2.0, "waited_s": 0.0}]
    assert "started" not in written["rows"][1] and written["rows"][1]["verdict"] == "ERROR"
    assert written["best_per_model"]["ocr_tiny"]["num"] == 0
    assert from_json(SweepSummary, written) == summary
