"""One side-by-side benchmark seen from one model's seat: its timings as the gate reads a candidate's.

In: a benchmark artifact that timed several contenders (``stages/benchmark.py`` with
``contenders``: each label's speedup over the fastest float baseline and its core states are
recorded under ``..._by_label``) and the label of one of them. Out: a ``BenchResult`` whose
``Timing`` per batch size is that label's: its latency, its speedup (in the core state it fared
worst in), the run's A/A check and environment, and the impossible numbers the label's entry
holds. Nothing is copied or renamed in the benchmark's record: ``quant=auto`` judges each
(candidate, target) and the winner from the same artifact. A batch size the label was not timed
at is absent (the gate fails it closed). Not read here: the ratios over every other model
(``Timing.over``), which only ``quant=none``'s "no slower than the file as given" judges.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.measure import sanity
from pipeline.measure.results import BenchResult, Latency, Speedup, Timing


@dataclass(frozen=True)
class Seat:
    """What one benchmark label is: the role of its model and the target it ran on."""
    role: str
    runtime: str
    precision: str


@dataclass(frozen=True)
class Seats:
    """Every label a benchmark timed, and the ones that failed to load or run (label -> why)."""
    timed: dict                      # label -> Seat
    failures: dict

    @classmethod
    def of(cls, bench) -> Seats:
        meta = bench.meta
        return cls({lab: Seat(s["role"], s["runtime"], s["precision"])
                    for lab, s in (meta.get("targets") or {}).items()},
                   dict(meta.get("failures") or {}))


def _timing(at: dict, lab: str) -> Timing:
    overall = at["speedup_vs_fastest_float_by_label"][lab]
    states = (at.get("core_state_by_label") or {}).get(lab)
    core = states if states is not None else at.get("core_state")
    worst = (core or {}).get("worst")
    aa = at.get("aa_check") or {}
    lat = Latency.of(at["latency_ms"][lab])
    seen = {**at, "speedup_vs_fastest_float": overall, "core_state": core}  # what sanity reads
    return Timing(speedup=Speedup.of(worst["speedup_vs_fastest_float"] if worst else overall),
                  fastest_float=at.get("fastest_float"),
                  noisy=bool(at.get("noisy") or (states is not None and states["changed"])),
                  worst_state_ns=worst["round_trip_ns"] if worst else None,
                  aa_median=aa.get("median"), aa_tolerance=aa.get("tolerance"),
                  p50_ms=lat.p50, p99_ms=lat.p99, problems=tuple(sanity.problems(seen)),
                  label=lab, overall=Speedup.of(overall),
                  latencies={k: Latency.of(v) for k, v in at["latency_ms"].items()
                             if isinstance(v, dict)})


def seen_from(bench, lab: str) -> BenchResult:
    """``bench`` (a benchmark artifact) as the gate sees it with ``lab`` as the candidate."""
    meta = bench.meta
    return BenchResult({int(b): _timing(at, lab) for b, at in meta["batches"].items()
                        if lab in at["latency_ms"]}, meta.get("environment"))
