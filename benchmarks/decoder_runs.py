"""What the decoder benches share: the process tree's resident memory and CPU time sampled over a
run (``TreeRss``), a stage's own recorded peak, and a result added to ``bench.json``'s ``llm``
section. Imports nothing of ``benchmarks`` (``benchmarks.results`` reaches the decoder benches
through the ``llm`` section, so they may not import it back through here).
"""
from __future__ import annotations

import json
import os
from pathlib import Path


def tree_sample(root: int) -> tuple[int, dict[tuple[int, float], float]]:
    """``root``'s descendants now (psutil): their resident bytes summed, and each one's CPU
    seconds so far (user + system), keyed by (pid, start time) so that a reused pid is another
    process."""
    import psutil

    rss, cpu = 0, {}
    for proc in psutil.Process(root).children(recursive=True):
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                t = proc.cpu_times()
                cpu[(proc.pid, proc.create_time())] = t.user + t.system
        except psutil.Error:  # ended meanwhile
            pass
    return rss, cpu


class TreeRss:
    """The resident memory of this process's descendants summed, sampled every ``interval``
    seconds; ``peak`` its largest sum. A sampler, because the kernel's own high-water marks do
    not reach it: the pipeline's stage children hang under a forkserver that is not waited for
    when the run ends (``RUSAGE_CHILDREN`` then sees the parent alone), and they would give the
    largest process, not the sum of the parent's and a stage child's at one moment, which is
    what the machine runs out of. A spike shorter than ``interval`` can be missed.
    ``cpu_seconds``: the CPU time the descendants used, each one's last sample summed (what a
    process used after its last sample, at most ``interval`` of it, is missed): on a machine
    shared with other work the wall time stretches with the load, the CPU time much less."""

    def __init__(self, interval: float = 0.2):
        import threading

        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._cpu: dict[tuple[int, float], float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def cpu_seconds(self) -> float:
        return sum(self._cpu.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, cpu = tree_sample(os.getpid())
            self.peak = max(self.peak, rss)
            self._cpu.update(cpu)
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def stage_peak(path: str | None) -> float | None:
    """A stage folder's own peak RSS (MB) as its artifact.json recorded it, None if absent."""
    try:
        return json.loads((Path(path) / "artifact.json").read_text())["meta"].get("peak_rss_mb")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def add_to_llm_section(bench_json: Path, key: str, out: dict, targets: dict) -> None:
    """``out`` into ``bench_json``'s ``llm`` section as ``key`` with its own time and CPU (the
    section's others may come from another run), ``targets`` among the section's. The caller
    renders the results page (``benchmarks.results`` imports the sections that import this)."""
    import time as _time

    from pipeline.core.env import cpu_info

    results = json.loads(bench_json.read_text()) if bench_json.exists() else {}
    llm = results.setdefault("llm", {})
    llm[key] = {**out, "measured_at": _time.strftime("%Y-%m-%d %H:%M %Z"), "cpu": cpu_info()}
    llm.setdefault("targets", {}).update(targets)
    bench_json.write_text(json.dumps(results, indent=2, default=str))
