"""Ctrl-C and SIGTERM end a run with one line, a report that says so, exit 130/143, and nothing
left behind: no temporary folder, no lock, no child process (pipeline.core.interrupt)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.core import interrupt
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
    one_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), 128 + sig,
             f"({name}); cached stages are kept, rerun to resume")
    # in a stage (or, should it end just before the signal lands, after it)
    assert re.match(rf"interrupted (in|after) stage .+ \({name}\)", err), err
    run = tmp_path / "runs" / os.readlink(tmp_path / "runs" / "latest")
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "interrupted" and report["interrupted"]["signal"] == name
    assert report["verdict"]["passed"] is False
    assert f"report {run / 'report.md'}" in err
    assert report["interrupted"]["where"] in (run / "report.md").read_text()
    assert not list(tmp_path.rglob(".tmp-*")) and not list(tmp_path.rglob(".lock-*"))
    deadline = time.time() + 10  # the forkserver and the stage's child die with the run
    while _in_session(proc.pid):
        assert time.time() < deadline, _in_session(proc.pid)
        time.sleep(0.1)


def test_a_signal_waits_for_a_child_to_have_started_even_when_another_thread_takes_it():
    """Blocking a signal is per thread: with a runtime's thread pool alive, the kernel hands the
    signal to one of its threads and Python runs the handler in the main thread at once, which
    raised half-way through starting a child (the child then outlived the run and printed its
    own traceback). ``deferred`` holds it until the start is done."""
    idle = threading.Event()
    pool = threading.Thread(target=idle.wait)  # a thread that does not block signals
    pool.start()
    started = []
    try:
        with pytest.raises(interrupt.Interrupted) as e, interrupt.handled():
            with interrupt.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # the other thread took it; the main thread checks signals now
                started.append(True)
    finally:
        idle.set()
        pool.join()
    assert started and e.value.exit_code == 143


def holds_a_semaphore(ready: str) -> None:
    """A stage whose library made a semaphore (as a runtime's may), then works on."""
    import multiprocessing

    globals()["lock"] = multiprocessing.get_context("forkserver").Lock()
    Path(ready).write_text("")
    time.sleep(60)


INTERRUPTED_WITH_A_SEMAPHORE = """
import os, signal, sys, threading, time
from pathlib import Path
from pipeline.core import interrupt, isolate
from tests.test_signals import holds_a_semaphore

def kill_when_ready():
    while not Path(sys.argv[1]).exists():
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGTERM)

if __name__ == "__main__":
    with interrupt.handled():
        threading.Thread(target=kill_when_ready, daemon=True).start()
        try:
            isolate.call("stage x", holds_a_semaphore, sys.argv[1])
        except interrupt.Interrupted as e:
            print(e.line(), file=sys.stderr)
"""


def test_a_signal_handled_inside_a_finalizer_still_interrupts_the_run(capfd):
    """Python drops an exception raised in ``__del__`` (or a weakref callback) after printing
    it; the run went on and ignored every later signal."""
    class Collected:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # the handler runs here, inside __del__

    with pytest.raises(interrupt.Interrupted) as e, interrupt.handled():
        Collected()  # dropped at once: __del__ runs
        deadline = time.time() + 60
        while time.time() < deadline:  # ordinary code, where the signal is raised again
            time.sleep(0.01)
    assert e.value.signum == signal.SIGTERM
    assert "Exception ignored" not in capfd.readouterr().err  # nothing but the run's one line


def test_a_killed_childs_semaphores_are_cleaned_up_without_a_word(tmp_path):
    """multiprocessing's resource tracker removes what a killed child left, and warned about it
    on stderr after the run's one line."""
    script = tmp_path / "run.py"
    script.write_text(INTERRUPTED_WITH_A_SEMAPHORE)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "ready")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.stderr.splitlines() == [
        "interrupted (SIGTERM); cached stages are kept, rerun to resume"], proc.stderr


def test_a_signal_while_publishing_leaves_a_report_that_says_interrupted(tmp_path):
    """The report is written (publish pending) before publishing; a SIGTERM while the registry
    is written rewrites it as interrupted, and the run's one line names it."""
    from pipeline.report import decoder
    from pipeline.report import run as rep

    body = {"status": "complete", "model": "m", "quant": "int8", "settings": {}, "rows": [],
            "verdict": {"passed": True, "checks": [], "summary": "PASS"},
            "publish": {"status": "pending", "backend": "local"}}
    path = rep.write(str(tmp_path), body, render=decoder.markdown)
    with pytest.raises(interrupt.Interrupted) as e, interrupt.handled():
        with rep.publishing(path, body, render=decoder.markdown):
            os.kill(os.getpid(), signal.SIGTERM)  # the real handler raises, as in a registry write
            time.sleep(10)
    report = json.loads((path.parent / "report.json").read_text())
    assert report["status"] == "interrupted" and report["publish"]["status"] == "interrupted"
    assert report["interrupted"] == {"signal": "SIGTERM", "where": "while publishing",
                                     "exit_code": 143}
    assert "Interrupted while publishing (SIGTERM): nothing was published" in \
        (path.parent / "report.md").read_text()
    assert e.value.exit_code == 143 and e.value.line().endswith(f"; report {path}")
    assert "interrupted while publishing (SIGTERM)" in e.value.line()


def test_sigterm_while_publishing_through_the_command_line(tiny_run, tmp_path):
    """The gate passed and the report says publish pending; the registry (a port that takes the
    connection and never answers) holds the run in publishing when SIGTERM comes: exit 143, the
    one line names the report, and the report says interrupted, not complete."""
    import socket

    from tests.faults import copy_of_tiny_run

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections wait in the backlog: a request is sent, never answered
        port = silent.getsockname()[1]
        args = copy_of_tiny_run(tiny_run, tmp_path / "w", registry="oci",
                                **{"registry.url": f"http://127.0.0.1:{port}"})
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        latest = tmp_path / "w" / "runs" / "latest" / "report.json"
        deadline = time.time() + 300
        while not (latest.exists() and '"pending"' in latest.read_text()):
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "the report was not written"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    run = latest.parent.resolve()
    one_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), 143,
             "interrupted while publishing (SIGTERM)", f"report {run / 'report.md'}")
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "interrupted" and report["publish"]["status"] == "interrupted"
    assert report["verdict"]["passed"] and "published" not in report
    assert "Interrupted while publishing (SIGTERM): nothing was published" in \
        (run / "report.md").read_text()
