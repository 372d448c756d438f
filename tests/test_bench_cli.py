"""The benchmarks' command-line runner reads the report of the run it started, never an older one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_a_refused_run_reads_no_report_not_the_previous_runs(tmp_path, monkeypatch):
    """A run refused before any stage (exit 2) leaves runs/latest on the run before; the bench
    once reported that run's numbers as this one's (benchmarks.byo._run)."""
    from benchmarks import byo
    from benchmarks.common import cli

    old = tmp_path / "artifacts" / "runs" / "20260101-000000"
    old.mkdir(parents=True)
    (old / "report.json").write_text(json.dumps({"rows": [], "verdict": {"summary": "PASS"}}))
    (old.parent / "latest").symlink_to(old.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # this checkout's pipeline, from another cwd
    args = ["model=onnx", "model.path=missing.onnx", "registry=null"]  # refused: no data set
    code, _, rep = cli(args)
    assert code == 2 and rep == {}
    with pytest.raises(RuntimeError, match=r"wrote no report \(exit 2\)"):
        byo._run(cli, args)


def test_zoo_entries_take_a_subset_of_their_quant_modes(monkeypatch):
    """``--zoo mpnet:dynamic+auto`` hands the entry those modes; a bare name, its own."""
    import sys
    import types

    from benchmarks.zoo import section

    seen = []
    fake = types.ModuleType("benchmarks.zoo.fake")
    fake.measure = lambda cli, quick, quants=None: (seen.append(quants) or
                                                    {"targets": {"ran": [quants, True]}})
    monkeypatch.setitem(sys.modules, "benchmarks.zoo.fake", fake)
    out = section(None, False, ("fake:dynamic+auto", "fake"))
    assert seen == [("dynamic", "auto"), None]
    assert out["targets"] == {"fake: ran": [None, True]}  # the later run of the entry replaces it
