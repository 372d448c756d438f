"""Ctrl-C and SIGTERM end a run with one line, a report that says so, exit 130/143, and nothing
left behind: no temporary folder, no lock, no child process (pipeline.interrupt)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, one_line, tiny_args


def _start(workdir: Path) -> subprocess.Popen:
    # A session of its own: its id names every process the run starts, and a signal to its group
    # is what a terminal's Ctrl-C does (every process of the foreground group receives it).
    return subprocess.Popen([sys.executable, "-m", "pipeline", *tiny_args(workdir)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _in_a_stage(workdir: Path, proc: subprocess.Popen) -> None:
    """Until a stage's temporary folder exists: its child process is at work."""
    deadline = time.time() + 120
    while not list((workdir / "cache").glob("*/.tmp-*")):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no stage started"
        time.sleep(0.02)


def _in_session(sid: int) -> list[str]:
    """The command lines of the processes still alive in session ``sid``."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            state, _ppid, _pgrp, session = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
            if entry.name.isdigit() and int(session) == sid and state != "Z":
                alive.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except (OSError, ValueError, IndexError):
            continue
    return alive


@pytest.mark.parametrize("sig, everyone", [(signal.SIGINT, True), (signal.SIGTERM, False),
                                           (signal.SIGTERM, True)],
                         ids=["ctrl-c", "sigterm-to-the-run", "sigterm-to-every-process"])
def test_a_signal_ends_the_run_in_one_line_with_its_report_and_leaves_nothing(tmp_path, sig,
                                                                              everyone):
    proc = _start(tmp_path)
    _in_a_stage(tmp_path, proc)
    # everyone: a terminal's Ctrl-C, SLURM's SIGTERM; else what timeout and docker stop send
    (os.killpg if everyone else os.kill)(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    name = signal.Signals(sig).name
    one_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), 128 + sig, "interrupted in stage", f"({name})", "rerun to resume")
    run = tmp_path / "runs" / os.readlink(tmp_path / "runs" / "latest")
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "interrupted" and report["interrupted"]["signal"] == name
    assert report["verdict"]["passed"] is False
    assert f"report {run / 'report.md'}" in err
    assert "interrupted in stage" in (run / "report.md").read_text()
    assert not list(tmp_path.rglob(".tmp-*")) and not list(tmp_path.rglob(".lock-*"))
    deadline = time.time() + 10  # the forkserver and the stage's child die with the run
    while _in_session(proc.pid):
        assert time.time() < deadline, _in_session(proc.pid)
        time.sleep(0.1)
