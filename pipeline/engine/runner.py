"""The runner: runs a stage once per distinct input, caches the result, records lineage.

In: a stage (a small dataclass with ``name``, ``version``, ``hardware_dependent`` and
``run(parent, out_dir, **refs) -> dict``), its parent artifact and any reference artifacts.
Out: an ``Artifact`` under ``<workdir>/cache/<stage>/<key>``. The key is a full sha256 over the
parent's and references' digests, the stage name and version, the stage's resolved config, the
tool versions and, for stages that measure or depend on the machine, the hardware fingerprint.
The stage writes into a temporary sibling folder inside a child process; only a completed folder is
renamed into place, so a killed run leaves nothing that a later run would trust. Every entry's
manifest is sealed with the cache's secret key (``pipeline.core.seal``); an entry is reused only when
its seal verifies and its files and metadata match their digests, else it is set aside and
rebuilt. Scratch files
(profiles, augmented models, anything a library puts in ``tempfile``'s folder) go to ``.scratch``
inside that temporary folder: the child's ``tempfile.gettempdir()`` and ``TMPDIR`` point there, so
nothing is written beside a parent's artifact, a full disk hits the stage's own folder, and the
runner removes the scratch before hashing the output. Concurrent jobs share the cache: one builds
a key while the others wait and reuse it, and timed stages run alone on the machine
(``pipeline.core.locks``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import ClassVar, Protocol

from pipeline.core import interrupt, isolate, leftovers, locks, seal
from pipeline.core.artifact import (FORMAT, Artifact, SealMismatch, canonical_meta,
                                    content_digest, digest_files, plain)
from pipeline.core.env import hardware_fingerprint, tool_versions
from pipeline.core.errors import StageError, describe_os_error


class Stage(Protocol):
    """What the runner runs. A stage is a frozen dataclass whose fields are exactly what shapes
    its output: they are its cache key, with its name and version, its inputs' digests and, when
    ``hardware_dependent``, the machine's fingerprint. ``run`` writes its files under ``out_dir``
    (scratch under ``out_dir/.scratch``) and returns the metadata recorded with them."""
    name: ClassVar[str]
    version: ClassVar[int]
    hardware_dependent: ClassVar[bool]  # measures, or its output depends on, the machine

    def run(self, parent: Artifact | None, out_dir: Path, **refs: Artifact) -> dict: ...


# The metadata of a stage field that only runs the stage's checks (the target a parity check's
# session runs on, say) and so does not shape its output: the field stays out of the key.
CHECKS_ONLY = {"in_key": False}

SCRATCH = ".scratch"  # inside the stage's temporary folder; removed before it is hashed


def _with_scratch(scratch: Path, fn, *args, **kwargs):
    """Run a stage (in its child) with every temporary file under ``scratch``."""
    import multiprocessing.util

    # Except multiprocessing's own folder: it holds the Unix sockets of listeners and the
    # forkserver, whose paths must fit 107 bytes, and a cache folder's path is far longer.
    # Created now, in the system's temp folder, it is cached for the rest of the child.
    multiprocessing.util.get_temp_dir()
    scratch = scratch.resolve()  # absolute: a stage may change its current directory (prepare)
    os.environ["TMPDIR"] = str(scratch)  # for libraries and subprocesses that read it
    tempfile.tempdir = str(scratch)
    return fn(*args, **kwargs)


class Runner:
    def __init__(self, workdir: str | Path, hardware, log=print, remote: str | None = None):
        self.cache = Path(workdir) / "cache"
        # A Ray cluster's address (set by the ray launcher): timed stages then run there.
        self.remote = os.environ.get("PIPELINE_RAY_ADDRESS") if remote is None else remote
        self.hardware = hardware
        self.log = log
        self.record: list[dict] = []  # one row per stage call: label, stage, reused, seconds
        isolate.preload(isolate.STAGE_IMPORTS)
        self.sweep(Path(workdir))

    @functools.cached_property
    def secret(self) -> bytes:
        """The cache's key: entries are sealed with it and reused only if their seal verifies
        (``pipeline.core.seal``). Ray nodes share the workdir, so they read the same key."""
        self.new_key = not (self.cache / seal.KEY_FILE).exists() and \
            not (self.cache / seal.KEY_FILE).is_symlink()
        return seal.store_key(self.cache)

    new_key = False  # the key was made by this run: entries already there were sealed without it
    _said_new_key = False

    def sweep(self, workdir: Path) -> None:
        """Temporary folders of killed runs (their pid dead) and week-old corrupt entries."""
        folders = [workdir / "runs", self.cache, *(p for p in self.cache.glob("*") if p.is_dir())]
        removed = sum(leftovers.sweep(f) for f in folders)
        if removed:
            self.log(f"  removed {removed} temporary or corrupt folder(s) left by killed runs")

    def key(self, stage: Stage, parent: Artifact | None, refs: dict[str, Artifact]) -> str:
        skip = {f.name for f in dataclasses.fields(stage) if f.metadata.get("in_key") is False}
        config = {k: v for k, v in plain(stage).items() if k not in skip}
        blob = {
            "stage": stage.name, "version": stage.version, "config": config,
            "format": FORMAT,  # how digests are made: entries made another way are never read
            "parent": parent.digest if parent else None,
            "refs": {k: v.digest for k, v in sorted(refs.items())},
            "tools": tool_versions(),
            # The stage's own target when it has one: one run measures several runtimes.
            "hardware": hardware_fingerprint(getattr(stage, "hardware", None) or self.hardware)
            if stage.hardware_dependent else None,
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()

    def run(self, stage: Stage, parent: Artifact | None = None, label: str | None = None,
            **refs: Artifact) -> Artifact:
        label = label or stage.name
        try:
            if self.remote and locks.is_timed(stage):  # a Ray cluster: on a node labelled for it
                from pipeline.engine import cluster

                return cluster.run_timed(self, stage, parent, label, refs)
            key = self.key(stage, parent, refs)
            final = self.cache / stage.name / key
            with contextlib.ExitStack() as held:
                try:
                    seal.folders(final.parent)
                    # one builder per key: the others wait, then reuse
                    held.enter_context(locks.key_lock(final, self.log))
                except OSError as e:
                    if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                        raise
                    raise StageError(f"workdir={self.cache.parent} is not writable (stage "
                                     f"{label}: {describe_os_error(e)})") from None
                return self._run(stage, parent, label, key, final, refs)
        except interrupt.Interrupted as e:  # its temp folder and lock are gone: say where
            raise e.at(f"in stage {label}")

    def _run(self, stage, parent, label, key, final, refs) -> Artifact:
        if final.exists():
            try:
                art = Artifact.read(final, self.secret)
                self._note(label, stage.name, True, 0.0, art)
                return art
            except SealMismatch as e:
                if not self.new_key:
                    self._set_aside(label, key, final, e)
                else:  # sealed with the key that was deleted: not forged, only unverifiable
                    if not self._said_new_key:
                        self._said_new_key = True
                        self.log(f"  ! cache key {self.cache / seal.KEY_FILE} was made by this "
                                 "run (the old one was deleted or replaced): entries sealed "
                                 "with the old key cannot be verified and are rebuilt")
                    shutil.rmtree(final)
            except StageError as e:
                self._set_aside(label, key, final, e)
        seal.folders(final.parent)
        tmp = final.with_name(leftovers.temp_name(key[:16]))
        seal.folders(tmp)  # becomes the entry: not writable by every user either
        t0 = time.time()
        try:
            scratch = tmp / SCRATCH
            scratch.mkdir()
            # Compile work shares the machine; a timed stage has it to itself (pipeline.core.locks).
            with locks.machine_slot(locks.is_timed(stage), self.log) as slot:
                meta = isolate.call(f"stage {label}", _with_scratch, scratch, stage.run, parent,
                                    tmp, **refs)
            shutil.rmtree(scratch)
            if locks.is_timed(stage):
                meta = {**(meta or {}), "ran_alone": slot}
            files = digest_files(tmp)
            meta = canonical_meta(meta)  # as a later run reads it back, digest included
            art = Artifact(path=final, stage=stage.name, key=key, digest=content_digest(files, meta),
                           files=files, meta=meta, parent=parent.digest if parent else None,
                           refs={k: v.digest for k, v in refs.items()}, config=plain(stage),
                           seconds=round(time.time() - t0, 3))
            art.path = tmp
            art.write(self.secret)
            try:
                tmp.rename(final)
            except OSError:  # an identical concurrent run finished first: use its result
                shutil.rmtree(tmp, ignore_errors=True)
                return Artifact.read(final, self.secret)
            art.path = final
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._note(label, stage.name, False, art.seconds, art, slot)
        return art

    def _set_aside(self, label, key, final, e) -> None:
        aside = leftovers.set_aside(final, key)
        self.log(f"  ! {label}: {e}; rebuilding (kept a week at {aside.name})")

    def _note(self, label, stage, reused, seconds, art, slot=None):
        self.record.append({"label": label, "stage": stage, "reused": reused,
                            "seconds": seconds, "digest": art.digest, "path": str(art.path),
                            **({"slot": slot} if slot else {})})
        # 26: the longest label of a default run ("compare[int8 vs fp32, b8]") and one more
        self.log(f"  {'reused' if reused else 'built '} {label:<26} {seconds:7.1f} s  "
                 f"{art.digest[:12]}")
