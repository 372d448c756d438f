"""Temporary folders of killed runs are removed once their owner is dead (and they are old enough
that a reused pid or another machine cannot matter); a live run's are never touched; corrupt
entries set aside are kept a week."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline.config import HardwareConfig
from pipeline.core.leftovers import CORRUPT_KEPT_S, STALE_AFTER_S
from pipeline.engine.runner import Runner


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def leftover(folder: Path, name: str, age_s: float) -> Path:
    path = folder / name
    path.mkdir(parents=True)
    (path / "model.onnx").write_bytes(b"half")
    then = time.time() - age_s
    for p in (path / "model.onnx", path):
        os.utime(p, (then, then))
    return path


def test_dead_runs_temp_folders_are_removed_live_ones_kept(tmp_path):
    old = STALE_AFTER_S + 60
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cache, runs = tmp_path / "cache" / "export", tmp_path / "runs"
        gone = [leftover(cache, f".tmp-0123456789abcdef-{dead}-a1b2c3", old),
                leftover(runs, f".tmp-20261130-120000-abcdef-{dead}-d4e5f6", old),
                leftover(cache, f".corrupt-{'f' * 64}-0a0b0c", CORRUPT_KEPT_S + 60)]
        kept = [leftover(cache, f".tmp-0123456789abcdef-{live.pid}-a1b2c3", old),  # alive
                leftover(cache, f".tmp-0123456789abcdef-{os.getpid()}-b1b2c3", old),  # this one
                leftover(cache, f".tmp-fedcba9876543210-{dead}-c1c2c3", 60),  # dead, but recent
                leftover(cache, f".corrupt-{'e' * 64}-0d0e0f", 3600),  # set aside an hour ago
                leftover(runs, "20261130-120000-abcdef", old)]  # a finished run, not a leftover
        logs = []
        Runner(tmp_path, HardwareConfig(), log=logs.append)
        assert [p.exists() for p in gone] == [False] * len(gone)
        assert [p.exists() for p in kept] == [True] * len(kept)
        assert any("removed 3" in m for m in logs), logs
    finally:
        live.kill()
        live.wait()


def test_temp_folders_carry_the_owners_pid(tmp_path):
    from pipeline.core.leftovers import temp_name

    name = temp_name("0123456789abcdef")
    assert name.startswith(".tmp-0123456789abcdef-") and f"-{os.getpid()}-" in name
