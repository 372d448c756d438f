"""The sweep's summary: a row per point, the Pareto front, the best gated point per model.

In: the sweep folder (one Hydra job folder per point with ``point.json``, written by
``pipeline.cli.sweep.launch.run_point``), the points' overrides and composed configs. Out: a
``SweepSummary`` of ``PointRow`` records, written as ``summary.json`` (by field, through
``pipeline.core.json_record``), ``summary.md`` and ``pareto.png`` in the sweep folder. A row holds
the point's verdict (PASS, FAIL for a failed gate, ERROR with the error line when it did not
finish), the accuracy drop against FP16, the speedup against the fastest float baseline with its
95 % CI and the p99 at the gate's batch size, the shipped size, and the published ref. The Pareto
front is over accuracy drop (lower), speedup (higher) and size (smaller), among points that were
measured; the best point per model is the fastest that passed its gate (the gate's limits are
applied by each run). Timed stages' windows (start, end, host) are collected from the reports, so
overlaps show.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.cli.sweep import point as point_file
from pipeline.core.json_record import from_json, omitted, to_json
from pipeline.core.locks import TIMED
from pipeline.report.body import Row


@dataclass(frozen=True)
class TimedWindow:
    """When a timed stage of a point held the machine (its report's stage slot)."""
    label: str
    host: str
    start: float
    end: float
    waited_s: float | None = None


@dataclass
class PointRow:
    """One point of the sweep as summary.json writes it, key for key."""
    num: int
    point: str                           # its overrides; in the table, those that vary
    model: str
    quant: str
    calibration: str
    verdict: str = "ERROR"               # PASS, FAIL (its gate) or ERROR (it did not finish)
    error: str | None = None             # ERROR: the error line; FAIL: the checks that failed
    accuracy_drop: float | None = None   # points of the task's metric below FP16
    speedup: float | None = None         # against the fastest float, at the gate's batch size
    speedup_ci95: tuple[float, float] | None = None
    p99_ms: float | None = None
    size_mb: float | None = None
    published: str | None = None
    report: str | None = None
    exit_code: int | None = None
    seconds: float | None = None
    timed: list[TimedWindow] = field(default_factory=list)
    started: float | None = omitted()
    ended: float | None = omitted()
    batch: int | None = omitted()        # the gate's batch size, once its report was read
    stages_built: int | None = omitted()
    stages: int | None = omitted()
    overrides: list[str] = field(default_factory=list)
    pareto: bool = False

    @property
    def measured(self) -> bool:
        return None not in (self.accuracy_drop, self.speedup, self.size_mb)


@dataclass(frozen=True)
class Best:
    """A model's fastest point that passed its gate."""
    num: int
    point: str
    speedup: float
    accuracy_drop: float
    size_mb: float
    published: str | None


@dataclass(frozen=True)
class Overlap:
    a: str   # "#num label" of each timed stage
    b: str


@dataclass
class SweepSummary:
    sweep_dir: str
    points: int
    rows: list[PointRow]
    pareto: list[int]
    best_per_model: dict[str, Best]
    overlapping_timed_stages: list[Overlap]
    wall_s: float
    timed_s: float
    compile_wall_s: float
    exit_code: int
    figure: str | None = omitted()       # pareto.png, or why it could not be drawn


# What a row reads of its point's report.json: views of the records the report writes.
@dataclass(frozen=True)
class _CheckView:
    check: str
    value: float | None


@dataclass(frozen=True)
class _VerdictView:
    passed: bool
    summary: str
    checks: tuple[_CheckView, ...]


@dataclass(frozen=True)
class _StageView:
    stage: str
    label: str
    reused: bool
    slot: TimedWindow | None = None


@dataclass(frozen=True)
class _ReportView:
    verdict: _VerdictView
    rows: tuple[Row, ...]
    stages: tuple[_StageView, ...]


def _row(num: int, point: list[str], cfg, job: Path) -> PointRow:
    option = next((o.split("=", 1)[1] for o in point if o.startswith("model=")), cfg.model.name)
    row = PointRow(num=num, point=" ".join(point), model=option, quant=cfg.quant.mode.value,
                   calibration=cfg.quant.calibration.value)
    res = point_file.read(job)
    if res is None:
        row.error = "no result: the point's process died before writing it"
        return row
    row.exit_code, row.error, row.published = res.exit_code, res.error, res.published
    row.seconds, row.started, row.ended = res.seconds, res.started, res.ended
    if not res.report:
        return row
    report_md = Path(res.report)
    row.report = str(report_md)
    try:
        rep = from_json(_ReportView, json.loads(report_md.with_name("report.json").read_text()),
                        known_only=True)
    except (OSError, ValueError, TypeError) as e:
        row.error = row.error or f"report unreadable: {e}"
        return row
    row.verdict = "PASS" if rep.verdict.passed else "FAIL"
    if res.exit_code not in (0, 1):  # reported, then failed (publishing): still an error
        row.verdict = "ERROR"
    if not rep.verdict.passed:
        row.error = rep.verdict.summary  # the checks that failed, not "gate failed"
    row.accuracy_drop = next((c.value for c in rep.verdict.checks if c.check == "accuracy_drop"),
                             None)
    batch = str(cfg.gate.speedup_batch_size)
    cand = next(r for r in rep.rows if r.role.value == "candidate")
    cell = cand.latency.get(batch)
    if cell is not None:
        row.speedup, row.speedup_ci95, row.p99_ms = (cell.speedup_vs_fastest_float,
                                                     cell.speedup_ci95, cell.p99)
    row.size_mb, row.batch = cand.size_mb, int(batch)
    row.timed = [s.slot for s in rep.stages if s.stage in TIMED and s.slot]
    row.stages_built = sum(not s.reused for s in rep.stages)
    row.stages = len(rep.stages)
    return row


def dominates(a: PointRow, b: PointRow) -> bool:
    ge = (a.accuracy_drop <= b.accuracy_drop and a.speedup >= b.speedup
          and a.size_mb <= b.size_mb)
    gt = a.accuracy_drop < b.accuracy_drop or a.speedup > b.speedup or a.size_mb < b.size_mb
    return ge and gt


def pareto(rows: list[PointRow]) -> list[int]:
    pts = [r for r in rows if r.measured]
    return [r.num for r in pts if not any(dominates(o, r) for o in pts if o is not r)]


def best_per_model(rows: list[PointRow]) -> dict[str, Best]:
    best: dict[str, PointRow] = {}
    for r in rows:
        if r.verdict != "PASS" or not r.measured:
            continue
        cur = best.get(r.model)
        rank = (r.speedup, -r.accuracy_drop, -r.size_mb)
        if cur is None or rank > (cur.speedup, -cur.accuracy_drop, -cur.size_mb):
            best[r.model] = r
    return {m: Best(r.num, r.point, r.speedup, r.accuracy_drop, r.size_mb, r.published)
            for m, r in best.items()}


def overlaps(rows: list[PointRow]) -> list[Overlap]:
    """Pairs of timed stages that ran at the same time on one host (there should be none)."""
    windows = [(r.num, t) for r in rows for t in r.timed]
    out = []
    for i, (na, a) in enumerate(windows):
        for nb, b in windows[i + 1:]:
            if a.host == b.host and a.start < b.end and b.start < a.end:
                out.append(Overlap(f"#{na} {a.label}", f"#{nb} {b.label}"))
    return out


def write(sweep_dir: Path, points: list[list[str]], cfgs: list, wall_s: float) -> SweepSummary:
    rows = [_row(i, p, c, sweep_dir / str(i)) for i, (p, c) in enumerate(zip(points, cfgs))]
    varying = [k for k in dict.fromkeys(o.split("=", 1)[0] for p in points for o in p)
               if len({tuple(o for o in p if o.split("=", 1)[0] == k) for p in points}) > 1]
    for r, p in zip(rows, points):  # shown: what differs between the points
        r.point = " ".join(o for o in p if o.split("=", 1)[0] in varying) or r.point
        r.overrides = p
    front = pareto(rows)
    for r in rows:
        r.pareto = r.num in front
    timed_s = sum(t.end - t.start for r in rows for t in r.timed)
    exit_code = (3 if any(r.verdict == "ERROR" for r in rows)
                 else 1 if any(r.verdict == "FAIL" for r in rows) else 0)
    summary = SweepSummary(
        sweep_dir=str(sweep_dir), points=len(rows), rows=rows, pareto=front,
        best_per_model=best_per_model(rows), overlapping_timed_stages=overlaps(rows),
        # Timed stages run alone, so the rest of the wall time is the compile phase.
        wall_s=round(wall_s, 1), timed_s=round(timed_s, 1),
        compile_wall_s=round(wall_s - timed_s, 1), exit_code=exit_code)
    try:
        plot(rows, sweep_dir / "pareto.png")
        summary.figure = "pareto.png"
    except Exception as e:  # noqa: BLE001 - a picture must not cost the summary
        summary.figure = f"failed: {type(e).__name__}: {e}"
    (sweep_dir / "summary.json").write_text(json.dumps(to_json(summary), indent=2))
    (sweep_dir / "summary.md").write_text(markdown(summary))
    return summary


def _fmt(v, spec=".2f", none="–"):
    return none if v is None else format(v, spec)


def markdown(s: SweepSummary) -> str:
    lines = [f"# Sweep: {s.points} points", "",
             f"Wall time {s.wall_s:.0f} s: timed stages {s.timed_s:.0f} s (alone on the "
             f"machine), compile phase {s.compile_wall_s:.0f} s. Overlapping timed stages: "
             f"{len(s.overlapping_timed_stages) or 'none'}.", "",
             "| # | point | verdict | acc drop | speedup (95 % CI) | p99 ms | MB | Pareto | "
             "published / error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in s.rows:
        ci = r.speedup_ci95
        sp = "–" if r.speedup is None else (
            f"{r.speedup:.2f}x" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else ""))
        tail = (r.published or "").split(" ")[0] if r.verdict == "PASS" else (r.error or "")
        lines.append(f"| {r.num} | `{r.point}` | {r.verdict} | {_fmt(r.accuracy_drop)} "
                     f"| {sp} | {_fmt(r.p99_ms)} | {_fmt(r.size_mb)} | "
                     f"{'yes' if r.pareto else ''} | {tail} |")
    lines += ["", "## Best gated point per model", ""]
    if not s.best_per_model:
        lines.append("No point passed its gate.")
    for m, b in s.best_per_model.items():
        lines.append(f"- {m}: #{b.num} `{b.point}`, {b.speedup:.2f}x, drop "
                     f"{b.accuracy_drop:.2f} points, {b.size_mb:.2f} MB"
                     + (f", published {b.published.split(' ')[0]}" if b.published else ""))
    if s.figure == "pareto.png":
        lines += ["", "![Pareto front](pareto.png)"]
    lines += ["", "Speedup: candidate against the fastest float baseline at the gate's batch size; "
              "accuracy drop: points of the task's metric below FP16. Reports: each row's "
              "`report` in summary.json."]
    return "\n".join(lines) + "\n"


def terminal(s: SweepSummary) -> str:
    lines = [f"{'#':>3} {'verdict':<7} {'drop':>6} {'speedup':>8} {'MB':>6}  point"]
    for r in s.rows:
        lines.append(f"{r.num:>3} {r.verdict:<7} {_fmt(r.accuracy_drop):>6} "
                     f"{_fmt(r.speedup):>8} {_fmt(r.size_mb):>6}  {r.point}"
                     + (f"  ({r.error})" if r.verdict == "ERROR" else ""))
    lines.append(f"pareto: {', '.join(f'#{n}' for n in s.pareto) or 'none'}; best per model: "
                 + (", ".join(f"{m} #{b.num}" for m, b in s.best_per_model.items())
                    or "none passed"))
    lines.append(f"wall {s.wall_s:.0f} s (timed stages {s.timed_s:.0f} s, compile phase "
                 f"{s.compile_wall_s:.0f} s); overlapping timed stages: "
                 f"{len(s.overlapping_timed_stages)}")
    return "\n".join(lines)


def plot(rows: list[PointRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if r.measured]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in pts:
        color = "tab:green" if r.verdict == "PASS" else "tab:red"
        ax.scatter(r.speedup, r.accuracy_drop, s=40 + 60 * r.size_mb, color=color,
                   alpha=0.6, edgecolors="black" if r.pareto else "none", linewidths=1.5)
        if r.speedup_ci95:
            ax.plot(r.speedup_ci95, [r.accuracy_drop] * 2, color=color, lw=1)
        ax.annotate(f"#{r.num} {r.model} {r.quant}", (r.speedup, r.accuracy_drop),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("speedup vs fastest float (95 % CI)")
    ax.set_ylabel("accuracy drop vs FP16, points")
    ax.set_title("Sweep: green passed, red failed; ringed = Pareto front; area = size")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
