"""``--follow S``: a server started on a registry alias (``ocr:production``) serves what the alias
names now, not only what it named at start-up.

In: the alias as given, the registry, a ``Server`` that is serving. Every S seconds the registry
is asked which version the alias names (its manifest's digest, no download). When that is another
version than the one serving, it is pulled by that digest into a new folder (every blob
re-hashed, as at start-up), read as start-up reads it, loaded on the server's threads and run on
the warm-up request, off the serving path, while the current version goes on answering; then the
server swaps (``Server.swap``): the next batch runs on the new version, a batch already running
finishes on the old one, and every answer names the version that computed it. No request is
refused or held for the swap.

A version the server cannot serve as it runs is refused, said once, and not tried again: one
whose inputs are read differently (the workers read every request as the first version's
evaluation did; another reading is another server, so a restart), a decoder, one whose graph
runs batches of 1 where the server batches more, a blob that is not what its manifest says, a
record the server cannot read, or a model the runtime does not load. A registry that does not
answer, or a pull that fails on the way, is said once and tried again at the next look. Either way the version
serving goes on. ``serve_model_updates_total{outcome}`` counts them; ``serve_model_info``,
``/readyz`` and the answers name the version serving.
"""
from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from pipeline.serve.readers import TextKey


def unservable(now, new, max_batch: int) -> str | None:
    """Why this server, serving ``now`` with batches of up to ``max_batch``, cannot serve the
    version ``new`` in its place (None: it can)."""
    if new.kind != "predict":
        return "it is a decoder, which another server serves (python -m pipeline.serve REF)"
    if new.max_batch is not None and new.max_batch < max_batch:
        return (f"its graph runs {new.max_batch} sample(s) at a time and this server batches "
                f"up to {max_batch}")
    if _reading(now.reader_key) != _reading(new.reader_key):
        return ("its evaluation read inputs differently from the version serving (another "
                "task or preprocessing), and this server's workers read them as that one's")
    return None


def _reading(key):
    """What a reader key says about how inputs are read: a text model's tokenizer by its spec
    (the files' digests, the length), not the folder they were pulled into."""
    return key.spec if isinstance(key, TextKey) else key


@dataclass
class Follower:
    ref: str              # the alias, as the user gave it
    backend: object       # the registry (pipeline.serve.artifact.registry)
    every_s: float
    root: Path            # where each version is pulled: a new folder each
    server: object        # pipeline.serve.app.Server
    refused: dict = field(default_factory=dict)  # version -> why it is not served
    said: str | None = None                      # the last failure said (not said again)
    pulls: int = 0
    # the folder of the version this follower swapped in, removed when another replaces it
    # (the first version's, pulled at start-up, stays: a text model's workers read their
    # tokenizer files there)
    folder: Path | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.look()
            except Exception as e:  # noqa: BLE001 - a look that failed here must not end them
                self._failed(f"a look failed ({_line(e)})")

    async def look(self) -> str | None:
        """Ask the registry once and act on it; the outcome (``UPDATES``), None when nothing
        moved."""
        from pipeline.registry.names import parse_ref

        try:
            entry = await run_in_threadpool(self.backend.resolve, *parse_ref(self.ref))
        except Exception as e:  # noqa: BLE001 - any failure of the registry: asked again later
            return self._failed(f"looking it up in the registry failed ({_line(e)})")
        exact = f"{entry.name}:{entry.version}@{entry.digest}"
        if exact == self.server.served.version or exact in self.refused:
            self.said = None
            return None
        self.pulls += 1
        folder = self.root / f"follow-{self.pulls}"
        try:
            served = await run_in_threadpool(self._read, entry.digest, folder)
        except Exception as e:  # noqa: BLE001 - sorted below: the version's fault or the way's
            shutil.rmtree(folder, ignore_errors=True)
            if _its_own(e):
                return self._refuse(exact, f"it cannot be served ({_line(e)})")
            return self._failed(f"pulling {exact} failed ({_line(e)})")
        why = unservable(self.server.served, served, self.server.cfg.max_batch)
        if why is None:
            try:
                model = await run_in_threadpool(self.server.load_warm, served)
            except Exception as e:  # noqa: BLE001 - any runtime's refusal of this model
                why = f"it did not load and run here ({_line(e)})"
        if why is not None:
            shutil.rmtree(folder, ignore_errors=True)
            return self._refuse(exact, why)
        if self.server.stopping:  # the swap would answer no one
            return None
        was, waited = self.server.served, self.server.cfg.max_queue_ms
        self.server.swap(served, model)
        self.server.metrics.updates.labels("swapped").inc()
        print(f"serve: {self.ref} moved to {exact}: now serving it (was {was.version})"
              + _wait_line(waited, self.server.cfg.max_queue_ms), flush=True)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = folder
        self.said = None
        return "swapped"

    def _read(self, digest: str, folder: Path):
        from pipeline.serve.artifact import pulled

        return pulled(self.ref, folder, self.backend, digest)

    def _refuse(self, exact: str, why: str) -> str:
        self.refused[exact] = why
        self.server.metrics.updates.labels("refused").inc()
        print(f"serve: {self.ref} moved to {exact}, which this server does not serve: {why}; "
              f"still serving {self.server.served.version}", flush=True)
        return "refused"

    def _failed(self, why: str) -> str:
        self.server.metrics.updates.labels("failed").inc()
        if why != self.said:
            print(f"serve: following {self.ref}: {why}; still serving "
                  f"{self.server.served.version}, asking again in {self.every_s:g} s",
                  flush=True)
            self.said = why
        return "failed"


def _its_own(e: BaseException) -> bool:
    """A failure of the version itself (a blob that is not what its manifest says, a record
    this server cannot serve), not of the way to it (a registry or network that failed)."""
    from pipeline.core.errors import CorruptBlob, PipelineError, RegistryError

    return isinstance(e, CorruptBlob) or (isinstance(e, PipelineError)
                                          and not isinstance(e, RegistryError))


def _wait_line(was: float | None, now: float | None) -> str:
    """What the swap did to the longest queue wait admitted (the version's p99 target where no
    --max-queue-ms was given); nothing when it stayed the same."""
    if was == now:
        return ""
    before = f"{was:g} ms" if was else "none"
    after = f"{now:g} ms, its p99 target" if now else "none (its gate judged no p99 target)"
    return f"; longest queue wait admitted: {after} (was {before})"


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
