"""``quant=auto``'s table: one typed row per (candidate, target), the choice and why.

In: each (candidate, target)'s evaluation, its view of the side-by-side benchmark and the gate's
verdict on it as if it shipped. Out: ``Row`` (read by field here; ``to_json`` is the JSON the
report renders and every earlier run wrote), ``choose`` (the fastest that passes every gate)
and ``why`` (a few sentences on the choice).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from pipeline.core.json_record import from_json, to_json
from pipeline.measure.results import Role, Speedup

# Checks of the benchmark rather than of a candidate: failed by one, failed by all.
TIMING_CHECKS = {"aa_check", "benchmark_sane", "same_environment"}
# Checks of speed: a candidate failing only these is accurate but not worth shipping.
SPEED_CHECKS = {"speedup_ci_low", "slo_p99_ms", "served_p99_ms", *TIMING_CHECKS}


@dataclass(frozen=True)
class BatchLatency:
    """A row's latency at one batch size, in ms."""
    p50: float | None = None
    p99: float | None = None


@dataclass(frozen=True)
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
    latency_ms: dict[str, BatchLatency] = field(default_factory=dict)  # by batch size (str)
    # over the fastest float baseline, at the gate's batch
    speedup_vs_fastest_float: Speedup | None = None
    fastest_float: str | None = None
    metric: str | None = None       # the primary metric's name, and its value here
    accuracy: float | None = None
    accuracy_drop: float | None = None
    agreement_with_fp16: float | None = None
    output_sha256: str | None = None
    p50: float | None = None        # at the gate's batch; None: not timed
    timed: bool = True

    def to_json(self) -> dict:
        """The JSON the report renders and every earlier run wrote: the metric's value under
        its own name, ``timed`` only for a row that was not."""
        out = {"candidate": self.candidate, "role": str(self.role), "target": self.target,
               "label": self.label, "runtime": self.runtime, "precision": self.precision,
               "passed": self.passed, "failed": self.failed, "failed_detail": self.failed_detail,
               "latency_ms": to_json(self.latency_ms),
               "speedup_vs_fastest_float": to_json(self.speedup_vs_fastest_float),
               "fastest_float": self.fastest_float}
        if self.metric is not None:
            out.update({self.metric: self.accuracy, "accuracy_drop": self.accuracy_drop,
                        "agreement_with_fp16": self.agreement_with_fp16,
                        "output_sha256": self.output_sha256})
        out["p50"] = self.p50
        if not self.timed:
            out["timed"] = False
        return out

    @classmethod
    def from_json(cls, data: dict) -> Row:
        """A row from its JSON: every field by its name, and the metric, which the JSON names
        by the one key that is no field."""
        names = {f.name for f in fields(cls)}
        metric = next((k for k in data if k not in names), None)
        row = from_json(cls, {k: v for k, v in data.items() if k != metric})
        return row if metric is None else replace(row, metric=metric, accuracy=data[metric])


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
    sp = r.speedup_vs_fastest_float
    if sp is None:
        return "no speedup measured"
    return f"{sp.median:.2f}x (95 % CI {sp.low:.2f}-{sp.high:.2f})"


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
    quantized = [r for r in table if r.role != Role.fp32]
    if quantized and all(not r.passed for r in quantized):
        best = max(quantized, key=lambda r: r.speedup_vs_fastest_float.median
                   if r.speedup_vs_fastest_float else 0)
        ships = winner.passed and winner.role == Role.fp32
        # a faster candidate that lost accuracy is not one that "does not pay": say which
        lost = [c for c in best.failed if c not in SPEED_CHECKS]
        lines.append((f"INT8 does not pass here: the fastest quantized candidate, "
                      f"{best.candidate} on {best.target}, ran {_sp(best)} the fastest float "
                      f"baseline but failed {', '.join(lost)}" if lost else
                      f"INT8 does not pay on this machine: the best quantized candidate, "
                      f"{best.candidate} on {best.target}, ran {_sp(best)} the fastest float "
                      "baseline") + (", so a float artifact ships." if ships else "."))
    return lines
