"""``slo.mode=serve``: at the end of a run the candidate is served by the real server and its p99,
measured by the load generator from raw PNG bytes, is judged against ``slo.p99_ms``.

The tiny OCR run twice in one workdir seeded with the shared tiny run's cache (every stage is
reused; the served check is not a stage: only the gate and the served load test run): with a
generous target the served check passes and the run publishes, with an impossible one (a
microsecond) it fails and the run exits 1. No timing is asserted beyond "a real, finite p99 was
measured and compared with the target given".
"""
from __future__ import annotations

import json
import math

import pytest

from tests.conftest import run_cli, run_folder, seeded, seeded_args

SERVE = ["slo.mode=serve", "slo.serve_qps=5", "slo.serve_seconds=2"]


@pytest.fixture(scope="module")
def workdir(tiny_run, tmp_path_factory):
    return seeded(tiny_run, tmp_path_factory.mktemp("slo_serve"))


def _served(proc) -> tuple[dict, dict]:
    report = json.loads((run_folder(proc) / "report.json").read_text())
    check = next(c for c in report["verdict"]["checks"] if c["check"] == "served_p99_ms")
    return report, check


def test_a_generous_target_passes_with_the_served_p99_in_the_report(tiny_run, workdir):
    proc = run_cli(*seeded_args(tiny_run, workdir, *SERVE, "slo.p99_ms=60000"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report, check = _served(proc)
    served = report["verdict"]["served"]
    assert check["passed"] and check["limit"] == 60000
    assert math.isfinite(check["value"]) and 0 < check["value"] <= 60000
    assert served["ok"] == served["sent"] > 0 and not served["errors"], served
    assert {"decode", "preprocess", "inference"} <= set(served["stage_ms"])
    assert served["server_exit"] == 0 and served["server"]["mode"] == "pipeline"
    assert report["publish"]["status"] == "published"
    assert all(s["reused"] for s in report["stages"])  # the served check is no stage


def test_an_impossible_target_fails_the_gate(tiny_run, workdir):
    proc = run_cli(*seeded_args(tiny_run, workdir, *SERVE, "slo.p99_ms=0.001"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report, check = _served(proc)
    assert not check["passed"] and check["limit"] == 0.001
    assert math.isfinite(check["value"]) and check["value"] > 0.001
    assert "served p99" in check["detail"] and "served p99" in report["verdict"]["summary"]
    assert not report["verdict"]["passed"] and "published" not in report
