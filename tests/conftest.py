"""Shared fixtures: a tiny OCR-shaped pipeline run once per test session and reused."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def tiny_args(workdir: Path, *extra: str) -> list[str]:
    """A fast run of the whole recipe on the random tiny network. Its speed gate is off (a random
    network's INT8 is not expected to be faster) and its A/A tolerance wide (sub-millisecond
    timings of a few rounds); everything else is the real pipeline."""
    return ["model=ocr_tiny", f"workdir={workdir}", f"data_dir={workdir / 'data'}",
            f"registry.root={workdir / 'registry'}", "bench.min_rounds=20", "bench.min_seconds=0", "bench.max_seconds=1",
            "bench.warmup_max_runs=20", "bench.width_buckets=2", "bench.cold_start_repeats=1",
            "bench.aa_tolerance=0.5",
            "gate.min_speedup=0", *extra]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """The first full run of the tiny pipeline: (workdir, CompletedProcess)."""
    workdir = tmp_path_factory.mktemp("tiny")
    proc = run_cli(*tiny_args(workdir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return workdir, proc
