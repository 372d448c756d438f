"""What one sweep point leaves in its folder (``point.json``), written by the launcher's worker
(``pipeline.cli.sweep.launch.run_point``) and read back by the summary.

In: the point's outcome as the worker saw it (its exit code, the lines ``report:``,
``published:`` and ``error:`` of its log, its times). Out: ``PointResult``, written whole or not at
all (a temporary file moved into place), and ``read``, which answers None for a point whose
process died before writing it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.json_record import from_json, to_json

FILE = "point.json"


@dataclass
class PointResult:
    num: int                             # Hydra's job number: the point's folder
    overrides: list[str]
    exit_code: int | None = None         # None: the process never ended (it could not start)
    report: str | None = None            # the run's report.md, once it wrote one
    published: str | None = None         # what it published, as its log line says
    error: str | None = None             # its one error line, or how it ended
    host: str = ""
    started: float | None = None         # time.time() at the start and the end
    ended: float | None = None
    seconds: float | None = None

    def write(self, folder: Path) -> None:
        tmp = folder / f".{FILE}.tmp"
        tmp.write_text(json.dumps(to_json(self), indent=2))
        tmp.replace(folder / FILE)


def read(folder: Path) -> PointResult | None:
    """The point's result, or None when it has none (killed before writing it, or damaged)."""
    try:
        return from_json(PointResult, json.loads((folder / FILE).read_text()), known_only=True)
    except (OSError, ValueError, TypeError):
        return None
