"""Helpers for fault tests: a small tmpfs to fill up or make read-only (needs root and mount;
tests skip with the reason when mounting is not permitted), and a copy of the tiny run's cache so
a test can re-run the whole pipeline in seconds without touching the shared workdir."""
from __future__ import annotations

import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import seeded, tiny_args


@contextmanager
def tmpfs(path: Path, size: str = "1m", fill_to_bytes: int | None = None,
          read_only: bool = False):
    """A tmpfs of ``size`` at ``path``; filled until ``fill_to_bytes`` remain free, or read-only."""
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode})")
    try:
        if fill_to_bytes is not None:
            free = shutil.disk_usage(path).free
            with open(path / "filler", "wb") as f:
                f.write(b"\0" * max(0, free - fill_to_bytes))
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def copy_of_tiny_run(tiny_run, dest: Path, **overrides: str) -> list[str]:
    """Arguments for a run in ``dest``, a workdir holding a copy of the tiny run's cache; the data
    folder stays the tiny run's (it is part of stage keys), so a re-run reuses every stage."""
    seeded(tiny_run, dest)
    return args_with(dest, data_dir=str(tiny_run[0] / "data"), **overrides)


def args_with(workdir: Path, **overrides: str) -> list[str]:
    """``tiny_args(workdir)`` with some of its keys replaced (``registry_root=`` for
    ``registry.root``), so no key is given twice."""
    args = tiny_args(workdir)
    wanted = {k.replace("_", ".", 1) if k.startswith("registry_") else k: v
              for k, v in overrides.items()}
    out = [a for a in args if a.split("=", 1)[0] not in wanted]
    return out + [f"{k}={v}" for k, v in wanted.items()]
