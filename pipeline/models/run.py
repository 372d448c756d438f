"""The run's facts about its model, computed once by the command line and carried to the end.

In: the run's ``Config``. Out: a frozen ``Run``: the task key (a built-in task's name, or a
``Source`` whose digest is the one time this run hashes the user's file), the ``Task`` built from
it, the checkpoint's sha256, and the stamp of the user's ONNX files (size, mtime, inode: how the
import stage tells that the file it copies is the one hashed, without hashing it again). The
preflight, the recipe, the report and the bill read these; none rebuilds them from the config.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.core.artifact import sha256_file
from pipeline.core.errors import ConfigError
from pipeline.core.userfiles import stamp_of
from pipeline.models import task
from pipeline.models.sources import Source, task_key
from pipeline.task.contract import MetricsSpec, Task


@dataclass(frozen=True)
class Run:
    key: str | Source            # a built-in task's name, or the user's model with its digest
    task: Task                   # built from the key, once per process
    checkpoint_sha256: str | None  # of model.checkpoint (None: a seeded random network)
    stamp: tuple = ()            # model=onnx: (name, size, mtime_ns, inode) per file hashed

    @property
    def metrics(self) -> MetricsSpec:
        return self.task.metrics


def _files(model) -> dict:
    """model=onnx: the model file and its external data, by name; else nothing to stamp."""
    if model.source != "onnx" or not Path(model.path).is_file():
        return {}
    from pipeline.models.files import onnx_files

    return onnx_files(model.path)


def facts(cfg) -> Run:
    """The ``Run`` of ``cfg``: the user's files read and hashed here, and nowhere else."""
    m = cfg.model
    files = _files(m)
    before = stamp_of(files)
    key = task_key(m, cfg.data, cfg.metric, cfg.data_dir)
    if before != stamp_of(files):  # replaced while being hashed: the digest names neither version
        raise ConfigError(f"model.path={m.path}: changed while it was read; run again")
    if isinstance(key, Source) and key.kind == "torch":
        checkpoint = key.sha256 or None  # the key hashed it already
    elif m.checkpoint is not None:
        if not Path(m.checkpoint).is_file():
            raise ConfigError(f"model.checkpoint={m.checkpoint}: file not found")
        checkpoint = sha256_file(Path(m.checkpoint))
    else:
        checkpoint = None
    return Run(key, task(key), checkpoint, before)
