"""Timing primitives for comparing models on a noisy shared machine.

In: callables (one per model) that run one inference on a given input. Out: per-model arrays of
milliseconds, measured in interleaved rounds, and ratio statistics (median of per-round ratios
with a bootstrap 95 % interval). Pure numpy and a clock (``pipeline.measure.clock``: the real
``time.perf_counter`` unless a test passes a virtual one); runtimes are the caller's business.

Why it is built this way (all measured on these 2-core machines):
- A fixed warm-up count is either too short (first runs allocate and pick kernels) or wasteful;
  warm-up here ends when the median of a window of runs stops moving.
- Timing models one after another lets the machine's drift land on one of them; each round runs
  every model on the same input, in a rotated order.
- Across different runtimes, spinning worker threads of the one just run slow the next; ``block``
  runs each model several times in a row and keeps the block's median.
- One short run can be 30 % off; rounds continue until the interval of every ratio that matters is
  narrower than ``rel_ci`` or the time limit is reached, and then the result is flagged noisy.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from pipeline.measure.clock import REAL, Clock


def clock_ms(fn: Callable, x, clock: Clock = REAL) -> float:
    now = clock.now
    t0 = now()
    fn(x)
    return (now() - t0) * 1e3


def warm_up(fn: Callable, inputs: Sequence, window: int = 10, tolerance: float = 0.05,
            max_runs: int = 300, clock: Clock = REAL) -> int:
    """Run until two consecutive windows' medians agree within ``tolerance``; returns runs done."""
    previous, runs = None, 0
    while runs < max_runs:
        med = float(np.median([clock_ms(fn, inputs[(runs + k) % len(inputs)], clock)
                               for k in range(window)]))
        runs += window
        if previous is not None and abs(med - previous) <= tolerance * previous:
            break
        previous = med
    return runs


def ratio_ci(num: np.ndarray, den: np.ndarray, seed: int = 0, resamples: int = 2000) -> dict:
    """Median of per-round ratios num/den with a bootstrap 95 % confidence interval."""
    ratios = np.asarray(num) / np.asarray(den)
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(ratios, size=(resamples, ratios.size)), axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return {"median": float(np.median(ratios)), "ci95": [float(lo), float(hi)]}


def rel_width(ci: dict) -> float:
    """Half-width of the interval relative to the median."""
    return (ci["ci95"][1] - ci["ci95"][0]) / 2 / ci["median"]


def percentiles(ms: np.ndarray, batch: int) -> dict:
    ms = np.asarray(ms)
    return {"p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)), "p999": float(np.percentile(ms, 99.9)),
            "mean": float(ms.mean()), "throughput": float(batch * 1000.0 / ms.mean()),
            "runs": int(ms.size)}


def interleaved(fns: dict[str, Callable], inputs: Sequence, pairs: Sequence[tuple[str, str]],
                min_rounds: int, max_seconds: float, rel_ci: float, block: int = 1,
                check_every: int = 50, runs: dict | None = None,
                probe: Callable[[], float | None] | None = None, probe_every_s: float = 0.25,
                min_seconds: float = 0.0, clock: Clock = REAL) -> tuple[dict[str, np.ndarray], dict]:
    """Time every model once per round (``block`` runs each, median kept), rotating the order.

    Stops after ``min_rounds`` and ``min_seconds`` (capped at ``max_seconds``) once every
    (num, den) ratio in ``pairs`` has a 95 % interval narrower than ``rel_ci`` (relative
    half-width), or when ``max_seconds`` have passed. ``min_seconds`` spreads the rounds over
    time: the host's bursts of load last a fraction of a second, and 200 rounds at batch 1 take
    under 2 s, so a run could land inside one.
    Returns the per-round times by model and {"rounds", "seconds", "noisy", "widest"}.
    ``runs``, when given, receives every single run's time by model (a block's tail latencies
    would be hidden by its median). ``probe``, when given, is called before the first round, then
    before any round that starts ``probe_every_s`` after the last call, and after the last round;
    its readings come back as "probes": [[round index, value], ...] (``pipeline.measure.corestate``).
    """
    roles = list(fns)
    times: dict[str, list[float]] = {r: [] for r in roles}
    t_start, rounds = clock.now(), 0
    widest = float("inf")
    probes: list[list] = []
    last_probe = -float("inf")
    while True:
        if probe is not None and clock.now() - last_probe >= probe_every_s:
            probes.append([rounds, probe()])
            last_probe = clock.now()
        x = inputs[rounds % len(inputs)]
        # The order turns once per pass over the inputs: turning it every round would tie each
        # input to one order whenever the counts share a factor (4 models, 8 batches: batch 0
        # always first after the same model), and a model's cold-cache start would land on the
        # same inputs every time, biasing their ratios.
        shift = (rounds // len(inputs)) % len(roles)
        for role in roles[shift:] + roles[:shift]:
            ms = [clock_ms(fns[role], x, clock) for _ in range(block)]
            times[role].append(float(np.median(ms)))
            if runs is not None:
                runs.setdefault(role, []).extend(ms)
        rounds += 1
        # first at min_rounds, then every check_every rounds: checking only at multiples of
        # check_every ran 50 rounds where 20 were asked for, past max_seconds
        if rounds >= min_rounds and (rounds - min_rounds) % check_every == 0:
            arrays = {r: np.asarray(v) for r, v in times.items()}
            widest = max(rel_width(ratio_ci(arrays[a], arrays[b])) for a, b in pairs)
            elapsed = clock.now() - t_start
            if widest <= rel_ci and elapsed >= min(min_seconds, max_seconds):
                break
            if elapsed > max_seconds:
                break
    seconds = clock.now() - t_start
    info = {"rounds": rounds, "seconds": round(seconds, 2), "noisy": bool(widest > rel_ci),
            "widest_rel_ci": widest}
    if probe is not None:
        probes.append([rounds, probe()])
        info["probes"] = probes
    return {r: np.asarray(v) for r, v in times.items()}, info


def head_to_head(fns: dict[str, Callable], inputs: Sequence, pairs: Sequence[tuple[str, str]],
                 min_rounds: int, max_seconds: float, rel_ci: float, clock: Clock = REAL
                 ) -> tuple[dict[str, np.ndarray], dict]:
    """Warm every model up, then ``interleaved`` one run per model per round: the short A/B
    timings outside the benchmark stage (the recipe's ``compare``, ``make bench`` sections).
    The info gains "warmup_runs" by model."""
    warm = {role: warm_up(fn, inputs, clock=clock) for role, fn in fns.items()}
    times, info = interleaved(fns, inputs, pairs, min_rounds, max_seconds, rel_ci, clock=clock)
    return times, {**info, "warmup_runs": warm}
