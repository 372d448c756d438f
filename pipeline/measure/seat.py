"""One side-by-side benchmark seen from one model's seat: its timings as the gate reads a candidate's.

In: a benchmark artifact that timed several contenders (``stages/benchmark.py`` with
``contenders``: each label's speedup over the fastest float baseline and its core states are
recorded under ``..._by_label``) and the label of one of them. Out: a ``BenchResult`` whose
``Timing`` per batch size is that label's: its latency, its speedup (in the core state it fared
worst in), the run's A/A check and environment, and the impossible numbers the label's entry
holds, and its ratio over every other model (recomputed from the per-round times for a label
that is not the benchmark's parent). Nothing is copied or renamed in the benchmark's record:
``quant=auto`` judges each (candidate, target) from the same artifact, and a run's outcome names
the seat its shipped candidate was timed in (``runtime=auto``: per batch size). A batch size the
label was not timed at is absent (the gate fails it closed).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.measure import sanity
from pipeline.measure.results import BenchResult, Latency, Role, Speedup, Timing
from pipeline.measure.timing import ratio_ci


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


def _timing(at: dict, lab: str, times: dict | None) -> Timing:
    """``lab``'s timing in one batch size's entry. The benchmark's parent (``candidate``) is
    the entry's own subject: its numbers are the entry's top-level ones. Another label's come
    from ``..._by_label``, and its ratio over every other model from the per-round ``times``."""
    own = lab == Role.candidate
    overall = at["speedup_vs_fastest_float"] if own else \
        at["speedup_vs_fastest_float_by_label"][lab]
    states = None if own else (at.get("core_state_by_label") or {}).get(lab)
    core = states if states is not None else at.get("core_state")
    worst = (core or {}).get("worst")
    aa = at.get("aa_check") or {}
    lat = Latency.of(at["latency_ms"][lab])
    if own:
        over = at.get("speedup") or {}
    else:  # the stage took its ratios over the candidate; this label's, from the same rounds
        over = {o: ratio_ci(t, times[lab]) for o, t in times.items() if o != lab} if times else {}
    seen = {**at, "speedup_vs_fastest_float": overall, "core_state": core}  # what sanity reads
    return Timing(speedup=Speedup.of(worst["speedup_vs_fastest_float"] if worst else overall),
                  fastest_float=at.get("fastest_float"),
                  noisy=bool(at.get("noisy") or (states is not None and states["changed"])),
                  worst_state_ns=worst["round_trip_ns"] if worst else None,
                  aa_median=aa.get("median"), aa_tolerance=aa.get("tolerance"),
                  p50_ms=lat.p50, p99_ms=lat.p99,
                  over={k: Speedup.of(v) for k, v in over.items()},
                  problems=tuple(sanity.problems(seen)), label=lab, overall=Speedup.of(overall),
                  latencies={k: Latency.of(v) for k, v in at["latency_ms"].items()
                             if isinstance(v, dict)})


def seen_from(bench, seat) -> BenchResult:
    """``bench`` (a benchmark artifact) as the gate sees it with ``seat`` as the candidate:
    a label, or per batch size (str) a label."""
    meta = bench.meta
    labels = {b: seat if isinstance(seat, str) else seat.get(b) for b in meta["batches"]}
    times = None
    if any(lab != Role.candidate for lab in labels.values()):
        times = json.loads((bench.path / "times.json").read_text())
    return BenchResult({int(b): _timing(at, labels[b], times and times[b])
                        for b, at in meta["batches"].items()
                        if labels[b] is not None and labels[b] in at["latency_ms"]},
                       meta.get("environment"))
