"""``quant=auto``'s table: one typed row per (candidate, target), the choice and why.

In: each (candidate, target)'s evaluation, its view of the side-by-side benchmark and the gate's
verdict on it as if it shipped. Out: ``Row`` (read by field here; ``as_dict`` is the JSON the
report renders and every earlier run wrote), ``choose`` (the fastest that passes every gate)
and ``why`` (a few sentences on the choice).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.measure.results import Speedup

# Checks of the benchmark rather than of a candidate: failed by one, failed by all.
TIMING_CHECKS = {"aa_check", "benchmark_sane", "same_environment"}


@dataclass
class Row:
    candidate: str                  # the candidate's name: fp32, int8, dynamic, mixed
    role: str                       # its Role in the run
    target: str                     # "<runtime> <precision>"
    label: str                      # its label in the benchmark
    runtime: str
    precision: str
    passed: bool
    failed: list                    # the names of the checks it failed
    failed_detail: list
    latency_ms: dict = field(default_factory=dict)  # batch (str) -> {p50, p99}
    speedup: Speedup | None = None  # over the fastest float baseline, at the gate's batch
    fastest_float: str | None = None
    metric: str | None = None       # the primary metric's name, and its value here
    accuracy: float | None = None
    accuracy_drop: float | None = None
    agreement: float | None = None  # with FP16's outputs
    output_sha256: str | None = None
    p50: float | None = None        # at the gate's batch; None: not timed
    timed: bool = True

    def as_dict(self) -> dict:
        sp = self.speedup
        out = {"candidate": self.candidate, "role": str(self.role), "target": self.target,
               "label": self.label, "runtime": self.runtime, "precision": self.precision,
               "passed": self.passed, "failed": self.failed, "failed_detail": self.failed_detail,
               "latency_ms": self.latency_ms,
               "speedup_vs_fastest_float": None if sp is None else
               {"median": sp.median, "ci95": [sp.low, sp.high]},
               "fastest_float": self.fastest_float}
        if self.metric is not None:
            out.update({self.metric: self.accuracy, "accuracy_drop": self.accuracy_drop,
                        "agreement_with_fp16": self.agreement,
                        "output_sha256": self.output_sha256})
        out["p50"] = self.p50
        if not self.timed:
            out["timed"] = False
        return out


def choose(table: list[Row]) -> Row:
    """The fastest row that passes every gate; with none, the fastest that passes accuracy, else
    the most accurate (the gate then fails it, visibly)."""
    timed = [r for r in table if r.p50 is not None]
    passing = [r for r in timed if r.passed]
    if passing:
        return min(passing, key=lambda r: r.p50)
    accurate = [r for r in timed if not {"accuracy_drop", "output_agreement"} & set(r.failed)]
    if accurate:
        return min(accurate, key=lambda r: r.p50)
    return min(timed, key=lambda r: (math.inf if r.accuracy_drop is None else r.accuracy_drop,
                                     r.p50))


def _sp(r: Row) -> str:
    if r.speedup is None:
        return "no speedup measured"
    return f"{r.speedup.median:.2f}x (95 % CI {r.speedup.low:.2f}-{r.speedup.high:.2f})"


def why(winner: Row, table: list[Row]) -> list[str]:
    """Why the winner won, in a few sentences: what passed, what was faster and why it lost."""
    lines = []
    passing = [r for r in table if r.passed]
    name = f"{winner.candidate} on {winner.target}"
    if winner.passed:
        ident = (" (it is the fastest float baseline itself)"
                 if winner.label == winner.fastest_float else "")
        drop = math.nan if winner.accuracy_drop is None else winner.accuracy_drop
        lines.append(f"{name} is the fastest of the {len(passing)} of {len(table)} candidates "
                     f"that pass every gate: p50 {winner.p50:.2f} ms, {_sp(winner)} the fastest "
                     f"float baseline{ident}, drop {drop:.2f} points against FP16.")
    else:
        lines.append(f"no candidate passes every gate; {name} goes to the gate and fails it.")
    for r in sorted(table, key=lambda r: r.p50 if r.p50 is not None else math.inf):
        if r is not winner and not r.passed:
            lines.append(f"{r.candidate} on {r.target}: p50 "
                         + (f"{r.p50:.2f} ms" if r.p50 is not None else "–")
                         + f", {_sp(r)}; failed {', '.join(r.failed)}")
    timed = [r for r in table if r.p50 is not None]
    bad_timing = sorted(set.intersection(*(set(r.failed) & TIMING_CHECKS for r in timed))
                        if timed else set())
    if bad_timing:  # nothing can be ranked, let alone shipped: say so rather than blame INT8
        lines.append(f"the timing itself failed its check ({', '.join(bad_timing)}) for every "
                     "candidate, so no speed here can be trusted: run again on a quieter machine, "
                     "or give the benchmark more time (bench.max_seconds).")
        return lines
    quantized = [r for r in table if r.role != "fp32"]
    if quantized and all(not r.passed for r in quantized):
        best = max(quantized, key=lambda r: r.speedup.median if r.speedup else 0)
        ships = winner.passed and winner.role == "fp32"
        lines.append(f"INT8 does not pay on this machine: the best quantized candidate, "
                     f"{best.candidate} on {best.target}, ran {_sp(best)} the fastest float "
                     "baseline" + (", so a float artifact ships." if ships else "."))
    return lines
