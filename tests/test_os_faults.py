"""Faults of the machine (a file where a folder should be, a read-only folder, a full disk) end in
one line naming the path and the cause, exit code 3, never a traceback (exit 1 means the gate
failed)."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.config import HardwareConfig
from pipeline.core.errors import StageError
from pipeline.engine.runner import Runner
from tests.conftest import run_cli
from tests.faults import args_with, copy_of_tiny_run, tmpfs


def one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_workdir_that_is_a_file(tmp_path):
    workdir = tmp_path / "file"
    workdir.write_text("not a folder")
    one_line(run_cli(*args_with(workdir)), 3, str(workdir), "Not a directory")
    assert workdir.read_text() == "not a folder"


def test_read_only_workdir(tmp_path):
    with tmpfs(tmp_path / "ro", read_only=True) as workdir:
        one_line(run_cli(*args_with(workdir, data_dir=str(tmp_path / "data"))), 3, str(workdir),
                 "Read-only file system")


def test_a_workdir_without_write_permission_is_named_as_not_writable(tiny_run, tmp_path):
    """Permission denied (not a read-only mount): the lock file could not be created, was then
    opened read-only as another user's, and the line said ENOENT on the lock file. Root bypasses
    permissions, so as root the run drops that capability (setpriv)."""
    import os
    import shutil
    import sys

    args = copy_of_tiny_run(tiny_run, tmp_path / "w")
    for folder in [tmp_path / "w", *(p for p in (tmp_path / "w").rglob("*") if p.is_dir())]:
        folder.chmod(0o555)
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root bypasses permissions, and setpriv (to drop that) is missing")
        caps = "-dac_override,-dac_read_search"
        prefix = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]
    try:
        proc = subprocess.run([*prefix, sys.executable, "-m", "pipeline", *args],
                              cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                              text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    finally:
        for folder in [tmp_path / "w", *(p for p in (tmp_path / "w").rglob("*") if p.is_dir())]:
            folder.chmod(0o755)
    line = one_line(proc, 3, f"workdir={tmp_path / 'w'} is not writable", "Permission denied")
    assert "ENOENT" not in line


def test_registry_root_that_is_a_file(tiny_run, tmp_path):
    root = tmp_path / "registry-file"
    root.write_text("not a folder")
    args = copy_of_tiny_run(tiny_run, tmp_path / "w", registry_root=str(root))
    one_line(run_cli(*args), 3, str(root), "Not a directory")


def test_full_disk_while_publishing(tiny_run, tmp_path):
    with tmpfs(tmp_path / "full", size="256k", fill_to_bytes=4096) as root:
        args = copy_of_tiny_run(tiny_run, tmp_path / "w", registry_root=str(root / "registry"))
        line = one_line(run_cli(*args), 3, "No space left on device")
        assert str(root) in line


@pytest.mark.slow
def test_os_error_inside_a_stage_is_one_line_naming_the_path(tmp_path):
    with pytest.raises(StageError) as e:
        Runner(tmp_path, HardwareConfig(), log=lambda m: None).run(WriteInto(str(tmp_path / "f")))
    assert str(e.value) == f"stage write: {tmp_path / 'f' / 'x'}: Not a directory (ENOTDIR)"


@dataclass(frozen=True)
class WriteInto:
    where: str
    name = "write"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir):
        Path(self.where).write_text("a file")
        (Path(self.where) / "x").write_text("a file inside a file")
        return {}


def test_a_failed_publish_keeps_the_report_with_the_error(tiny_run, tmp_path):
    import json
    import socket

    with socket.socket() as s:  # a port nothing listens on: the registry is unreachable
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = copy_of_tiny_run(tiny_run, tmp_path / "w", registry="oci",
                            **{"registry.url": f"http://127.0.0.1:{port}"})
    proc = run_cli(*args)
    one_line(proc, 3, f"127.0.0.1:{port}")
    run = tmp_path / "w" / "runs" / "latest"
    report = json.loads((run / "report.json").read_text())
    assert report["verdict"]["passed"] and "published" not in report
    assert report["publish"]["status"] == "failed" and str(port) in report["publish"]["error"]
    assert "Publishing failed" in (run / "report.md").read_text()
    assert json.loads((run / "verdict.json").read_text())["passed"]


def test_a_failed_write_is_named_by_the_file_written_not_the_one_read(tmp_path):
    """``write`` raises ENOSPC without a file name; the line names the file being written, not a
    source open for reading in the same frame (a copy)."""
    import errno

    from pipeline.core.errors import describe_os_error

    source, target = tmp_path / "model.onnx", tmp_path / "blob"
    source.write_bytes(b"model")

    def copy(stream):
        with open(target, "wb") as f:
            f.write(stream.read())
            raise OSError(errno.ENOSPC, "No space left on device")

    with open(source, "rb") as src:
        try:
            copy(src)
        except OSError as e:
            assert describe_os_error(e) == f"{target}: No space left on device (ENOSPC)"


def test_a_bug_keeps_its_traceback_and_never_exits_1(capsys):
    """Exit 1 means "the gate failed" to scripts and to the sweep; a bug must not read as one."""
    from pipeline.core.errors import BUG_EXIT, GateFailed, cli

    def bug(argv):
        raise KeyError("sequence_accuracy")

    def gate_failed(argv):
        raise GateFailed("0.9x < 1.0x")

    assert cli(bug, [], "doc") == BUG_EXIT != 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'sequence_accuracy'" in err and "a bug" in err
    assert cli(gate_failed, [], "doc") == 1


def _profile_in(model: Path, tempdir: str | None):
    """``executed`` (evaluate's profiled run) with temporary files in ``tempdir``: (the kernels'
    precisions, or None; the error's errno and line, or None). Run in a child process: creating
    the session sets onnxruntime's process-wide thread pool, which later tests' plain sessions
    in this worker must not inherit."""
    import tempfile

    import numpy as np

    from pipeline.core.errors import describe_os_error
    from pipeline.runtimes.onnxruntime import executed

    tempfile.tempdir = tempdir
    try:
        got = executed(model, HardwareConfig().target(),
                       {"image": np.zeros((1, 3, 8, 8), np.float32)})
    except OSError as e:
        return None, (e.errno, describe_os_error(e))
    return bool(got), None


def test_a_disk_that_fills_under_onnxruntimes_profile_is_named_not_read_half_written(tmp_path):
    """evaluate profiles one run to record the precision each kernel ran in; onnxruntime's
    profiler writes its JSON without reporting a failed write, so a full disk left a cut-off
    file and a JSONDecodeError. Now: ENOSPC and the folder, nothing read from the file."""
    import errno
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from tests.test_messages import _classifier

    model = _classifier(tmp_path / "m.onnx")
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as child:
        assert child.submit(_profile_in, model, None).result() == (True, None)  # disk with room
        with tmpfs(tmp_path / "full", size="256k", fill_to_bytes=512) as root:
            got, error = child.submit(_profile_in, model, str(root)).result()
            assert got is None and error is not None
            code, line = error
            assert code == errno.ENOSPC
            assert line.startswith(f"{root}/ort-profile-") and line.endswith(
                "No space left on device (ENOSPC)")
            assert sorted(p.name for p in root.iterdir()) == ["filler"]  # nothing left behind
