"""``zoo`` section of ``make bench``: real models made by others, run as a user would.

Each entry is a module of this package with ``measure(cli, quick) -> dict`` that fetches its
package at bench time (``benchmarks.zoo.fetch``), checks FP32 parity with the model's own
inference code, then runs the documented command line. The section gathers the entries; an
entry that fails records its error and the others still run. Its ``targets`` are the entries'
targets, prefixed with the entry's name.
"""
from __future__ import annotations

import importlib
import traceback

ENTRIES = ("ddddocr", "mpnet")  # modules of this package, in the order they run


def section(cli, quick: bool = False, only: tuple[str, ...] = ENTRIES) -> dict:
    out: dict = {"entries": {}, "targets": {}}
    for name in only:
        try:
            res = importlib.import_module(f"benchmarks.zoo.{name}").measure(cli, quick)
        except Exception as e:  # noqa: BLE001 - recorded in the JSON; other entries still run
            res = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        out["entries"][name] = res
        out["targets"].update({f"{name}: {k}": v for k, v in res.get("targets", {}).items()})
    return out
