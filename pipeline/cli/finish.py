"""What every recipe's command line shares (encoders, decoders): running the recipe so that an
interrupted run still leaves a report, and its end: the one publish flow
(``pipeline.report.publish``) and the last lines of a run on the terminal."""
from __future__ import annotations

import time

from pipeline.core import interrupt
from pipeline.core.errors import GateFailed


def run_recipe(cfg, recipe, *args):
    """``recipe(cfg, runner, *args)`` on a new runner: (runner, outcome, start time). Ctrl-C or
    SIGTERM writes the report of how far it got (cached stages are kept) and is raised again."""
    from pipeline.engine.runner import Runner
    from pipeline.report import run as run_report

    t0 = time.time()
    runner = Runner(cfg.workdir, cfg.hardware.target())
    try:
        return runner, recipe(cfg, runner, *args), t0
    except interrupt.Interrupted as e:
        e.report = run_report.write_interrupted(cfg, runner.record, e)
        raise


def finish(cfg, runner, t0: float, out, shipment) -> int:
    """The end of every run, encoder or decoder: the one publish flow
    (``pipeline.report.publish``: the report, then the registry when the gate passed), then the
    stage reuse, the gate's table, what was published and where the report is on the terminal;
    exit 0 when the gate passed, else raise ``GateFailed`` (exit 1) naming the kept candidate."""
    from pipeline.gate import table as gate_table
    from pipeline.report.publish import publish_run

    report_path = publish_run(cfg, out, shipment)
    verdict, end = out.verdict, shipment.end
    reused = sum(s["reused"] for s in runner.record)
    print(f"stages: {reused} of {len(runner.record)} reused; {time.time() - t0:.1f} s")
    print(gate_table(verdict))
    print(f"gate: {verdict.summary}")
    if end.published:
        print(f"published: {end.published}")
    print(f"report: {report_path}")
    if not verdict.passed:
        raise GateFailed(f"gate failed, candidate kept at {out.models['candidate'].path}; "
                         f"report {report_path}")
    return 0
