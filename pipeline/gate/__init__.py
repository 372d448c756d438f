"""The gate: may this candidate ship? Each check has a value, a limit and a verdict.

One judge for every recipe: ``judge`` takes ``Measures`` (what one candidate measured, typed,
read once from its stages: ``measures`` builds them for an encoder from its evaluate and
benchmark artifacts, ``decode_measures`` for a decoder from its text scores and decode timing),
``GateConfig`` and ``SloConfig``. Out: a ``Verdict`` (``pipeline.gate.verdict``; written as
``verdict.json`` by the report) and a short table for the terminal. Checks: accuracy drop against the FP16 baseline, each
judged metric in its own scale (``accuracy_drop`` for the primary, ``<metric>_drop`` for the
others it is gated with or the user named: ``pipeline.metrics.limits``), agreement of outputs
with it (decisions identical, or continuous rows within ``gate.output_rtol``), the lower bound of
the speedup's 95 % interval against the fastest float baseline (``quant=none``, whose candidate
is that baseline: the upper bound against the file as given, which it must not be slower than),
the A/A self-check of the
timing (past ``bench.aa_tolerance`` and up to ``AA_BROKEN``, passed only while the speedup's
lower bound divided by 1 + the deviation still clears ``min_speedup``), that the timings were
taken in this environment (a baseline measured elsewhere is refused), the candidate's p99
against the SLO at the batch a request is answered in (``slo.batch_size``, 1 by default), and
the model's size. It fails closed: a missing
or non-finite measurement fails its check, naming it (a measurement the stage did not record is
absent; a key renamed inside one is a bug and raises, exit 4), and a benchmark holding numbers no measurement can
produce (``pipeline.measure.sanity``) fails its timing checks. Cheap and
uncached, so changing a threshold re-judges cached measurements without re-running them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.core.env import differences
from pipeline.gate.verdict import Check, Verdict
from pipeline.measure.results import (ONE, BenchResult, DecodeResult, Evaluation, Role, Speedup,
                                      Timing)
from pipeline.metrics import detection, limits as metric_limits
from pipeline.metrics.outputs import Rule, agreement, agreement_limit, kind, own_agreement

NAN = float("nan")
# An A/A deviation past which no timing is trusted, whatever the speedup: one model 10 % off
# its own twin. Below it and past bench.aa_tolerance the speedup is judged discounted by the
# deviation. Measured on an AMX Xeon VM (quiet, 2 vCPUs): two sessions of one FP32 encoder in
# one process read 1.00-1.06 apart from run to run, with the machine otherwise idle.
AA_BROKEN = 0.10


@dataclass(frozen=True)
class SpeedClaim:
    """What the speed check judges: a speedup's interval against a limit."""
    name: str                 # speedup_ci_low | no_slower_than_given
    speedup: Speedup | None   # None: not measured (fails closed)
    limit: float
    upper: bool               # judged on the interval's upper bound ("no slower than")
    what: str                 # what the ratio is over, e.g. "vs fp32 at batch 8"
    limit_name: str           # how the A/A discount names the limit
    prefix: str = ""          # said before the numbers
    noisy: bool = False


@dataclass(frozen=True)
class Measures:
    """Everything one candidate is judged on, encoder or decoder, read from its stages once."""
    reference: str            # what the candidate is judged against, as the details say it
    reference_metrics: dict
    candidate_metrics: dict
    speed: SpeedClaim
    primary_check: str | None = "accuracy_drop"  # the primary's check name (None: <metric>_drop)
    agreement: float | None = None  # share of identical (or close) outputs; None: not judged
    agreement_kind: str = "identical"  # "within" rtol (continuous outputs), or "detections"
    float_agreement: float | None = None  # the same share of FP32's own (None: not evaluated)
    timing: Timing | None = None    # the batch the speed gate is judged at: the A/A check
    served: Timing | None = None    # the batch a request is answered in (slo.batch_size)
    served_batch: int | None = None
    environment: dict | None = None  # where the timings were taken; None: not recorded
    model_mb: float | None = None
    problems: tuple = ()            # numbers no measurement produces: none of them is judged
    decimals: int | None = None     # a fixed number of decimals in the accuracy details
    sized: bool = True              # a file whose size gate.max_model_mb judges (a decoder's is a folder)
    # evaluation samples whose outputs held NaN or inf: (candidate's, reference's, samples);
    # None: not counted
    non_finite: tuple[int, int, int] | None = None


def _fmt(v, f: str) -> str:
    return format(v, f) if isinstance(v, (int, float)) else "?"


def _accuracy(m: Measures, g, metrics) -> list[Check]:
    """One check per judged metric, the primary's named ``m.primary_check`` when given."""
    checks = []
    for i, r in enumerate(metric_limits.judged(m.reference_metrics, m.candidate_metrics,
                                               g.max_accuracy_drop, metrics)):
        f = f".{m.decimals}f" if m.decimals is not None else (".2f" if r.unit == "%" else ".4f")
        scale = "points" if r.unit == "%" and m.decimals is None else r.scale
        name = m.primary_check if i == 0 and m.primary_check else f"{r.metric}_drop"
        absent = [who for who, v in (("the candidate", r.candidate), (m.reference, r.reference))
                  if not isinstance(v, (int, float)) or not math.isfinite(v)]
        checks.append(Check.of(name, r.drop, r.limit, lambda v, lim=r.limit: v <= lim + 1e-9,
                               f"{r.metric} {_fmt(r.candidate, f)} vs {m.reference} "
                               f"{_fmt(r.reference, f)}: drop {_fmt(r.drop, f)} "
                               f"{scale}".rstrip()
                               + detection.resolution(r.metric, m.reference_metrics, r.limit),
                               missing=f"no {r.metric} measured for {' and '.join(absent)}"
                               if absent else ""))
    return checks


def _speed(s: SpeedClaim, batch_note: str = ""):
    """The speed check, and how the A/A discount moves its bound:
    ``dev -> (bound / (1 + dev), the limit, its name)``."""
    sp = s.speedup
    bound = NAN if sp is None else (sp.high if s.upper else sp.low)
    numbers = sp.text() if sp is not None else "no speedup measured"
    check = Check.of(s.name, bound, round(s.limit, 4) if s.upper else s.limit,
                     lambda v: v >= s.limit,
                     f"{s.prefix}{numbers} {s.what}{batch_note}" + (" [noisy]" if s.noisy else ""),
                     missing=f"no {s.prefix}speedup {s.what} was recorded" if sp is None else "")
    if s.upper and not math.isfinite(s.limit):
        check = Check(check.name, check.value, check.limit, False,
                      f"{s.name}: the A/A record has no tolerance (fails closed)")
    return check, lambda dev: (bound / (1.0 + dev), s.limit, s.limit_name)


def _aa(t: Timing, discounted) -> Check:
    """The A/A self-check of the timing. Past the tolerance, the deviation is how far one model's
    timing can sit from its own twin's here: the speed check may be that far off too. It is
    judged with its bound moved against the candidate by it (a 3x candidate is not refused over
    a 4 % A/A); past AA_BROKEN the timing is not trusted at all."""
    median = NAN if t.aa_median is None else t.aa_median
    tol = NAN if t.aa_tolerance is None else t.aa_tolerance
    dev = abs(median - 1.0)
    bound, need, name = discounted(dev)
    bounded = (math.isfinite(tol) and dev <= AA_BROKEN
               and bound >= need)  # a record without its tolerance fails closed
    detail = f"FP32 vs itself read {median:.3f} (must be 1.00 +- {tol}"
    detail += (")" if dev <= tol else
               f", or up to +- {AA_BROKEN} with the speed check's bound divided by 1 + the "
               f"deviation: {bound:.2f}x against {name} {round(need, 4)})")
    return Check.of("aa_check", dev, tol, lambda v: v <= tol or bounded, detail,
                    missing="no A/A check was recorded" if t.aa_median is None else "")


def _non_finite(m: Measures) -> Check:
    """A candidate that answers NaN or inf where numbers were expected is not shippable, and its
    accuracy check alone would not say why (NaN's argmax is class 0, its cosine with anything
    0): this check names it. Present only when it fails."""
    cand, ref, samples = m.non_finite
    return Check(
        "finite_outputs", float(cand), 0, False,
        f"{cand} of {samples} evaluation samples gave NaN or inf outputs ({m.reference}: {ref}): "
        "the candidate's arithmetic made them (a value rounded to zero before a division or a "
        "log, or a kernel that overflowed); keep the nodes behind them float (quant.exclude) "
        "or try another runtime (hardware.runtime=)")


def _agreement(m: Measures, g) -> Check:
    """The share of samples whose decision (or output, within rtol) is FP16's, at least
    ``gate.min_output_agreement`` or, where that is less, what FP32 itself reaches
    (``pipeline.metrics.outputs.agreement_limit`` says why)."""
    rule = Rule.of(g)
    detail = {"within": f"{m.agreement:.2%} of outputs within {rule.rtol:g} relative error of "
                        f"{m.reference}'s",
              "detections": f"{m.agreement:.2%} of samples with {m.reference}'s detections "
                            f"(detection F1 {rule.sample_f1:g} or more on each)"}.get(
        m.agreement_kind, f"{m.agreement:.2%} of outputs identical to {m.reference}'s")
    limit = agreement_limit(g.min_output_agreement, m.float_agreement)
    if limit < g.min_output_agreement:
        detail += (f"; the limit is FP32's own agreement with {m.reference} ({limit:.2%}), "
                   f"under gate.min_output_agreement ({g.min_output_agreement:.2%})")
    return Check.of("output_agreement", m.agreement, limit, lambda v: v >= limit, detail)


def judge(m: Measures, gate, metrics, slo=None, environment: dict | None = None) -> Verdict:
    """The one judge. ``metrics``: the task's ``MetricsSpec`` (or its primary ``MetricSpec``
    alone); each judged metric's direction turns the two values into a drop (positive: the
    candidate is worse). ``environment``: this machine's, which the timings must match."""
    g = gate
    checks = _accuracy(m, g, metrics)
    if m.agreement is not None:
        checks.append(_agreement(m, g))
    if m.non_finite is not None and m.non_finite[0]:
        checks.append(_non_finite(m))
    timing, speed = m.timing, m.speed
    if m.problems:  # an edited or damaged entry: none of its numbers is judged (fails closed)
        checks.append(Check.of("benchmark_sane", float(len(m.problems)), 0, lambda v: v == 0,
                               "benchmark entry is corrupt: " + "; ".join(m.problems[:3])))
        timing, speed = Timing(None, None), SpeedClaim(
            speed.name, None, speed.limit, speed.upper, speed.what, speed.limit_name, speed.prefix)
    where = ""
    if timing is not None and timing.worst_state_ns is not None:
        where = (f" in the core state it fared worst in ({timing.worst_state_ns:.0f} ns core "
                 "round trip)")
    speed_check, discounted = _speed(speed, where)
    checks.append(speed_check)
    if g.require_aa_check and timing is not None:
        checks.append(_aa(timing, discounted))
    if environment is not None:
        diffs = (differences(m.environment, environment) if m.environment is not None
                 else ["unrecorded"])
        checks.append(Check.of("same_environment", float(len(diffs)), 0, lambda v: v == 0,
                               "timings taken in this environment" if not diffs else
                               "timings taken elsewhere: " + "; ".join(diffs[:3])))
    if g.check_slo_p99 and slo is not None and m.served_batch is not None:
        checks.append(_slo(m, slo))
    if g.max_model_mb is not None and m.sized:
        mb = NAN if m.model_mb is None else m.model_mb
        checks.append(Check.of("model_mb", mb, g.max_model_mb, lambda v: v <= g.max_model_mb,
                               f"{mb:.2f} MB"))
    return Verdict(checks, reference=m.reference)


def _slo(m: Measures, slo) -> Check:
    """A request's latency is judged at the batch a request is answered in (slo.batch_size, 1:
    alone), not at the speed gate's batch: 8 sentences through a large encoder may take a second
    while each request alone meets the target."""
    b, served = m.served_batch, m.served
    p99 = NAN if served is None or served.p99_ms is None else served.p99_ms
    check = Check.of("slo_p99_ms", p99, slo.p99_ms, lambda v: v <= slo.p99_ms,
                     f"p99 {p99:.2f} ms at batch {b} (slo.batch_size)",
                     missing=f"no candidate p99 was recorded at batch {b}")
    if served is None:
        check = Check(check.name, None, check.limit, False,
                      f"slo_p99_ms: batch {b} (slo.batch_size) was not timed: add it to "
                      "bench.batch_sizes (fails closed)")
    return check


def measures(evals: dict, bench, gate, slo=None, candidate=None,
             against_given: bool = False, role: Role = Role.candidate,
             float_eval=None) -> Measures:
    """An encoder candidate's measures: its evaluation and FP16's (``evals`` by role; ``role``:
    the one judged, which quant=auto names by what it is), the benchmark (an artifact, or a
    ``BenchResult`` seen from the candidate's seat) at the speed gate's batch and at the SLO's,
    the candidate's file size.
    ``against_given`` (``quant=none``): the speed check is "no slower than the file as given"
    instead of a speedup over the fastest float baseline, which is the candidate itself.
    ``float_eval``: the FP32 evaluation whose agreement with FP16 is the least the candidate
    must keep where it is under the limit (default: ``evals``' FP32, unless FP32 is judged)."""
    g = gate
    ref, cand = Evaluation.of(evals[Role.fp16]), Evaluation.of(evals[role])
    rule = Rule.of(g)
    try:
        agree, how = agreement(cand.artifact, ref.artifact, rule), kind(ref.artifact)
    except FileNotFoundError:  # an evaluation without its predictions: absent, fails closed
        agree, how = NAN, "identical"
    if float_eval is None and role != Role.fp32:
        float_eval = evals.get(Role.fp32)
    own = own_agreement(None if float_eval is None else Evaluation.of(float_eval).artifact,
                        ref.artifact, rule)  # the least a float model keeps
    result = bench if isinstance(bench, BenchResult) else BenchResult.of(bench)
    t = result.at(g.speedup_batch_size) or Timing(None, None)
    b = getattr(slo, "batch_size", 1) if slo is not None else None
    served = result.at(b) if b is not None else None
    if served is not None and b != g.speedup_batch_size and served.problems:
        served = Timing(None, None)  # a damaged entry is not judged (fails closed), as above
    at = f"at batch {g.speedup_batch_size}"
    if against_given:
        tol = NAN if t.aa_tolerance is None else t.aa_tolerance
        claim = SpeedClaim(
            "no_slower_than_given", t.over.get(Role.export.value), 1.0 - tol, True,
            f"vs export {at}", "1 - bench.aa_tolerance",
            prefix="quant=none ships the optimized copy of the model, so it is judged on being no "
                   "slower than the file as given, not on a speedup over itself: ", noisy=t.noisy)
    else:
        claim = SpeedClaim("speedup_ci_low", t.speedup, g.min_speedup, False,
                           f"vs {t.fastest_float or 'the fastest float baseline'} {at}", "min_speedup", noisy=t.noisy)
    mb = None
    if candidate is not None and g.max_model_mb is not None:
        mb = candidate.model.stat().st_size / 1e6
    non_finite = None
    if cand.non_finite is not None:
        non_finite = (cand.non_finite, ref.non_finite or 0, cand.samples or 0)
    return Measures("FP16", ref.metrics, cand.metrics, claim, agreement=agree,
                    agreement_kind=how, float_agreement=own, timing=t, served=served,
                    served_batch=b, environment=result.environment, model_mb=mb,
                    problems=t.problems, non_finite=non_finite)


def decode_measures(scored: dict, decode: DecodeResult, role: str, gate,
                    reference: str = "FP32") -> Measures:
    """A decoder candidate's measures: its text scores (``scored``: the gated metrics, against
    the reference the text was scored with), its decode speedup over that reference. ``role``
    fp32 (or the reference itself): no rise, full agreement, a speedup of 1 by identity.
    ``reference``: what the scores and timings were taken against, named in every detail (FP32,
    or the INT8 reference where FP32 is streamed, or the checkpoint's own dtype)."""
    from pipeline.metrics import generation

    is_ref = role == Role.fp32
    sp = ONE if is_ref else decode.speedups.get(role)
    return Measures(reference, generation.REFERENCE,
                    generation.REFERENCE if is_ref else scored,
                    SpeedClaim("speedup_ci_low", sp, gate.min_speedup, False,
                               f"vs {reference}", "min_speedup", prefix="decode ",
                               noisy=decode.noisy),
                    primary_check=None, environment=decode.environment, decimals=3,
                    sized=False)


def table(verdict: Verdict) -> str:
    """The verdict as a few aligned lines for the terminal."""
    w = max([18, *(len(c.name) for c in verdict.checks)])  # no_slower_than_given is 20
    lines = [f"{'check':<{w}} {'value':>10} {'limit':>8}  verdict  detail"]
    for c in verdict.checks:
        value = "-" if c.value is None else f"{c.value:.3f}"
        lines.append(f"{c.name:<{w}} {value:>10} {c.limit!s:>8}  "
                     f"{'pass' if c.passed else 'FAIL':<7}  {c.detail}")
    return "\n".join(lines)
