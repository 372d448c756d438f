"""The sweep's summary: a row per point, the Pareto front, the best gated point per model.

In: the sweep folder (one Hydra job folder per point with ``point.json``, written by
``pipeline.cli.sweep.launch.run_point``), the points' overrides and composed configs. Out: ``summary.json``,
``summary.md`` and ``pareto.png`` in the sweep folder. A row holds the point's verdict (PASS,
FAIL for a failed gate, ERROR with the error line when it did not finish), the accuracy drop
against FP16, the speedup against the fastest float baseline with its 95 % CI and the p99 at the
gate's batch size, the shipped size, and the published ref. The Pareto front is over accuracy
drop (lower), speedup (higher) and size (smaller), among points that were measured; the best
point per model is the fastest that passed its gate (the gate's limits are applied by each run).
Timed stages' windows (start, end, host) are collected from the reports, so overlaps show.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.locks import TIMED


def _row(num: int, point: list[str], cfg, job: Path) -> dict:
    option = next((o.split("=", 1)[1] for o in point if o.startswith("model=")), cfg.model.name)
    row = {"num": num, "point": " ".join(point), "model": option,
           "quant": cfg.quant.mode.value, "calibration": cfg.quant.calibration.value,
           "verdict": "ERROR", "error": None, "accuracy_drop": None, "speedup": None,
           "speedup_ci95": None, "p99_ms": None, "size_mb": None, "published": None,
           "report": None, "exit_code": None, "seconds": None, "timed": []}
    try:
        res = json.loads((job / "point.json").read_text())
    except (OSError, ValueError):
        row["error"] = "no result: the point's process died before writing it"
        return row
    row.update(exit_code=res["exit_code"], error=res["error"], published=res["published"],
               seconds=res.get("seconds"), started=res.get("started"), ended=res.get("ended"))
    if not res.get("report"):
        return row
    report_md = Path(res["report"])
    row["report"] = str(report_md)
    try:
        rep = json.loads(report_md.with_name("report.json").read_text())
    except (OSError, ValueError) as e:
        row["error"] = row["error"] or f"report unreadable: {e}"
        return row
    verdict = rep["verdict"]
    row["verdict"] = "PASS" if verdict["passed"] else "FAIL"
    if res["exit_code"] not in (0, 1):  # reported, then failed (publishing): still an error
        row["verdict"] = "ERROR"
    if not verdict["passed"]:
        row["error"] = verdict["summary"]  # the checks that failed, not "gate failed"
    checks = {c["check"]: c for c in verdict["checks"]}
    row["accuracy_drop"] = checks.get("accuracy_drop", {}).get("value")
    batch = str(rep["config"]["gate"]["speedup_batch_size"])
    cand = next(r for r in rep["rows"] if r["role"] == "candidate")
    lat = cand["latency"].get(batch, {})
    row.update(speedup=lat.get("speedup_vs_fastest_float"), speedup_ci95=lat.get("speedup_ci95"),
               p99_ms=lat.get("p99"), size_mb=cand["size_mb"], batch=int(batch))
    row["timed"] = [{"label": s["label"], **{k: s["slot"][k] for k in
                                             ("host", "start", "end", "waited_s")}}
                    for s in rep["stages"] if s["stage"] in TIMED and s.get("slot")]
    row["stages_built"] = sum(not s["reused"] for s in rep["stages"])
    row["stages"] = len(rep["stages"])
    return row


def _measured(r: dict) -> bool:
    return all(r[k] is not None for k in ("accuracy_drop", "speedup", "size_mb"))


def dominates(a: dict, b: dict) -> bool:
    ge = (a["accuracy_drop"] <= b["accuracy_drop"] and a["speedup"] >= b["speedup"]
          and a["size_mb"] <= b["size_mb"])
    gt = (a["accuracy_drop"] < b["accuracy_drop"] or a["speedup"] > b["speedup"]
          or a["size_mb"] < b["size_mb"])
    return ge and gt


def pareto(rows: list[dict]) -> list[int]:
    pts = [r for r in rows if _measured(r)]
    return [r["num"] for r in pts if not any(dominates(o, r) for o in pts if o is not r)]


def best_per_model(rows: list[dict]) -> dict:
    best = {}
    for r in rows:
        if r["verdict"] != "PASS" or not _measured(r):
            continue
        cur = best.get(r["model"])
        rank = (r["speedup"], -r["accuracy_drop"], -r["size_mb"])
        if cur is None or rank > (cur["speedup"], -cur["accuracy_drop"], -cur["size_mb"]):
            best[r["model"]] = r
    return {m: {"num": r["num"], "point": r["point"], "speedup": r["speedup"],
                "accuracy_drop": r["accuracy_drop"], "size_mb": r["size_mb"],
                "published": r["published"]} for m, r in best.items()}


def overlaps(rows: list[dict]) -> list[dict]:
    """Pairs of timed stages that ran at the same time on one host (there should be none)."""
    windows = [(r["num"], t) for r in rows for t in r["timed"]]
    out = []
    for i, (na, a) in enumerate(windows):
        for nb, b in windows[i + 1:]:
            if a["host"] == b["host"] and a["start"] < b["end"] and b["start"] < a["end"]:
                out.append({"a": f"#{na} {a['label']}", "b": f"#{nb} {b['label']}"})
    return out


def write(sweep_dir: Path, points: list[list[str]], cfgs: list, wall_s: float) -> dict:
    rows = [_row(i, p, c, sweep_dir / str(i)) for i, (p, c) in enumerate(zip(points, cfgs))]
    varying = [k for k in dict.fromkeys(o.split("=", 1)[0] for p in points for o in p)
               if len({tuple(o for o in p if o.split("=", 1)[0] == k) for p in points}) > 1]
    for r, p in zip(rows, points):  # shown: what differs between the points
        r["point"] = " ".join(o for o in p if o.split("=", 1)[0] in varying) or r["point"]
        r["overrides"] = p
    front = pareto(rows)
    for r in rows:
        r["pareto"] = r["num"] in front
    timed_s = sum(t["end"] - t["start"] for r in rows for t in r["timed"])
    exit_code = (3 if any(r["verdict"] == "ERROR" for r in rows)
                 else 1 if any(r["verdict"] == "FAIL" for r in rows) else 0)
    summary = {"sweep_dir": str(sweep_dir), "points": len(rows), "rows": rows, "pareto": front,
               "best_per_model": best_per_model(rows), "overlapping_timed_stages": overlaps(rows),
               # Timed stages run alone, so the rest of the wall time is the compile phase.
               "wall_s": round(wall_s, 1), "timed_s": round(timed_s, 1),
               "compile_wall_s": round(wall_s - timed_s, 1), "exit_code": exit_code}
    try:
        plot(rows, sweep_dir / "pareto.png")
        summary["figure"] = "pareto.png"
    except Exception as e:  # noqa: BLE001 - a picture must not cost the summary
        summary["figure"] = f"failed: {type(e).__name__}: {e}"
    (sweep_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (sweep_dir / "summary.md").write_text(markdown(summary))
    return summary


def _fmt(v, spec=".2f", none="–"):
    return none if v is None else format(v, spec)


def markdown(s: dict) -> str:
    lines = [f"# Sweep: {s['points']} points", "",
             f"Wall time {s['wall_s']:.0f} s: timed stages {s['timed_s']:.0f} s (alone on the "
             f"machine), compile phase {s['compile_wall_s']:.0f} s. Overlapping timed stages: "
             f"{len(s['overlapping_timed_stages']) or 'none'}.", "",
             "| # | point | verdict | acc drop | speedup (95 % CI) | p99 ms | MB | Pareto | "
             "published / error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in s["rows"]:
        ci = r["speedup_ci95"]
        sp = "–" if r["speedup"] is None else (
            f"{r['speedup']:.2f}x" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else ""))
        tail = (r["published"] or "").split(" ")[0] if r["verdict"] == "PASS" else (r["error"] or "")
        lines.append(f"| {r['num']} | `{r['point']}` | {r['verdict']} | {_fmt(r['accuracy_drop'])} "
                     f"| {sp} | {_fmt(r['p99_ms'])} | {_fmt(r['size_mb'])} | "
                     f"{'yes' if r['pareto'] else ''} | {tail} |")
    lines += ["", "## Best gated point per model", ""]
    if not s["best_per_model"]:
        lines.append("No point passed its gate.")
    for m, b in s["best_per_model"].items():
        lines.append(f"- {m}: #{b['num']} `{b['point']}`, {b['speedup']:.2f}x, drop "
                     f"{b['accuracy_drop']:.2f} points, {b['size_mb']:.2f} MB"
                     + (f", published {b['published'].split(' ')[0]}" if b["published"] else ""))
    if s.get("figure") == "pareto.png":
        lines += ["", "![Pareto front](pareto.png)"]
    lines += ["", "Speedup: candidate against the fastest float baseline at the gate's batch size; "
              "accuracy drop: points of the task's metric below FP16. Reports: each row's "
              "`report` in summary.json."]
    return "\n".join(lines) + "\n"


def terminal(s: dict) -> str:
    lines = [f"{'#':>3} {'verdict':<7} {'drop':>6} {'speedup':>8} {'MB':>6}  point"]
    for r in s["rows"]:
        lines.append(f"{r['num']:>3} {r['verdict']:<7} {_fmt(r['accuracy_drop']):>6} "
                     f"{_fmt(r['speedup']):>8} {_fmt(r['size_mb']):>6}  {r['point']}"
                     + (f"  ({r['error']})" if r["verdict"] == "ERROR" else ""))
    lines.append(f"pareto: {', '.join(f'#{n}' for n in s['pareto']) or 'none'}; best per model: "
                 + (", ".join(f"{m} #{b['num']}" for m, b in s["best_per_model"].items())
                    or "none passed"))
    lines.append(f"wall {s['wall_s']:.0f} s (timed stages {s['timed_s']:.0f} s, compile phase "
                 f"{s['compile_wall_s']:.0f} s); overlapping timed stages: "
                 f"{len(s['overlapping_timed_stages'])}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if _measured(r)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in pts:
        color = "tab:green" if r["verdict"] == "PASS" else "tab:red"
        ax.scatter(r["speedup"], r["accuracy_drop"], s=40 + 60 * r["size_mb"], color=color,
                   alpha=0.6, edgecolors="black" if r["pareto"] else "none", linewidths=1.5)
        if r["speedup_ci95"]:
            ax.plot(r["speedup_ci95"], [r["accuracy_drop"]] * 2, color=color, lw=1)
        ax.annotate(f"#{r['num']} {r['model']} {r['quant']}", (r["speedup"], r["accuracy_drop"]),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("speedup vs fastest float (95 % CI)")
    ax.set_ylabel("accuracy drop vs FP16, points")
    ax.set_title("Sweep: green passed, red failed; ringed = Pareto front; area = size")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
