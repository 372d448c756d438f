"""The last lines of a run on the terminal, the same for every recipe (encoders, decoders)."""
from __future__ import annotations

import time

from pipeline.core.errors import GateFailed


def finish(runner, t0: float, verdict: dict, body: dict, report_path, candidate_path) -> int:
    """Print the stage reuse, the gate's table, what was published and where the report is;
    exit 0 when the gate passed, else raise ``GateFailed`` (exit 1) naming the kept candidate."""
    from pipeline.gate import table as gate_table

    reused = sum(s["reused"] for s in runner.record)
    print(f"stages: {reused} of {len(runner.record)} reused; {time.time() - t0:.1f} s")
    print(gate_table(verdict))
    print(f"gate: {verdict['summary']}")
    if body.get("published"):
        print(f"published: {body['published']}")
    print(f"report: {report_path}")
    if not verdict["passed"]:
        raise GateFailed(f"gate failed, candidate kept at {candidate_path}; report {report_path}")
    return 0
