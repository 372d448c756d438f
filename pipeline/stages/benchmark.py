"""benchmark: latency of the candidate and the float baselines, timed side by side.

In: the candidate artifact and the baselines by role (``fp32``, ``fp16``, ``export``). Out:
``latency.json`` with, per batch size: p50/p90/p99/p999, mean and throughput per model; the
candidate's speedup over each baseline and over the fastest float baseline (median of per-round
ratios, bootstrap 95 % interval); the A/A check; per-shape latencies with outliers flagged; the
input contract (the shapes that were measured); and cold-start times per model.

How it is timed, and why: all sessions live in one child process pinned to ``hardware.affinity``
and share one global thread pool (per-session pools make identical models read 0.67x on 2 cores).
Each model warms up until its timings stabilise. Rounds then run every model on the same real
batch in a rotated order (``pipeline.measure.timing``), cycling through batches drawn from each size
bucket of the evaluation set, so the numbers describe the input distribution, not one shape.
The ``fp32`` model is loaded twice: the ratio between the copies (the A/A check) must read
1.00 +- ``aa_tolerance`` or the timing is not trusted. Rounds continue while the intervals are
wider than ``rel_ci``, for at least ``min_seconds`` and up to ``max_seconds``; a result still
wide then is flagged noisy.

Core state (``pipeline.measure.corestate``): every quarter second the child reads how far apart its two
CPUs are (a core-to-core round trip). On these VMs the host moves the vCPUs between near and far
placements for seconds to minutes, and a 2-thread model at batch 1 is a different machine in
each. ``core_state`` gives each state's speedups on its own rounds; a run that saw the speedup
differ between states is flagged noisy, and the gate judges the state the candidate fared worst in.

Runtimes (``pipeline.runtimes``): each model runs on its target (the candidate at the target's
precision, baselines in fp32; ``runtime=auto`` times every artifact on every target, each under
its own label, see ``runtimes.plan``). A target that cannot load a model is recorded in
``failures`` and the others are timed. When the timed set mixes runtimes, per-run alternation is
spoiled by the other engine's spinning workers, so models alternate in blocks of ``MIXED_BLOCK``
runs, or of ``bench.block`` where it is set above 1 (``pipeline.measure.latency``): ratios
compare block medians, percentiles use every single run.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.data import real_batches
from pipeline.core.errors import StageError
from pipeline.measure import timing
from pipeline.measure.latency import blocking, contract, shape_outliers, speedups
from pipeline.task.contract import size_of

FLOAT_ROLES = ("fp32", "fp16")
AA_ROLE = "fp32 (A/A copy)"


@dataclass(frozen=True)
class Benchmark:
    data: object           # DataSplit: the evaluation samples the batches are cut from
    bench: object          # TimingConfig: what shapes the numbers, no load-test knobs
    hardware: object       # the target (runtime=auto: see ``options``)
    # runtime=auto: every (runtime, precision) each artifact is also timed on; () otherwise
    options: tuple = field(default=(), metadata={"key_omit_default": True})
    # quant=auto: the other roles that compete with the candidate (each gets its speedup over the
    # fastest float and its core states, like the candidate); () otherwise
    contenders: tuple = field(default=(), metadata={"key_omit_default": True})
    # quant=auto: labels not timed (a candidate on a runtime where it misses the accuracy
    # budget, the FP16 model where it is no float baseline): nothing is decided by their times
    untimed: tuple = field(default=(), metadata={"key_omit_default": True})
    name = "benchmark"
    version = 6  # 6: the order of models turns once per pass over the inputs (timing.interleaved)
    hardware_dependent = True

    def run(self, parent, out_dir: Path, **baselines) -> dict:
        from pipeline.measure import corestate

        if self.hardware.affinity:
            os.sched_setaffinity(0, self.hardware.affinity)
        with corestate.Probe(os.sched_getaffinity(0)) as probe:
            return self._run(parent, out_dir, probe, baselines)

    def _run(self, parent, out_dir: Path, probe, baselines: dict) -> dict:
        from pipeline import runtimes
        from pipeline.measure import coldstart
        from pipeline.core.env import environment
        from pipeline.models import task
        from pipeline.runtimes import plan

        cfg, hw = self.bench, self.hardware
        t = task(self.data.task)
        ds = t.dataset(self.data)
        name, axis = t.size_axis
        meaning = next(i for i in t.inputs if i.name == name).dynamic[axis]
        paths = {"candidate": parent.model, **{r: a.model for r, a in baselines.items()}}
        entries = {lab: e for lab, e in plan.timed(hw, self.options, list(paths), AA_ROLE).items()
                   if lab not in self.untimed}
        models, failures = {}, {}
        for lab, (role, target) in entries.items():
            try:
                models[lab] = runtimes.load(paths[role], runtimes.settings_for(hw, target))
            except runtimes.RuntimeFailure as e:  # recorded per runtime; the others still run
                failures[lab] = str(e)
        missing = [r for r in ("candidate", "fp32", AA_ROLE) if r not in models]
        if missing:
            raise StageError(f"cannot time {', '.join(missing)}: "
                             + "; ".join(failures[m] for m in missing))
        fns = {lab: m.run for lab, m in models.items()}
        block, min_rounds, check_every = blocking(cfg, {entries[lab][1].runtime for lab in models})
        rng = np.random.default_rng(0)
        result: dict = {"batches": {}, "affinity": sorted(os.sched_getaffinity(0)),
                        "targets": {lab: {"role": entries[lab][0], "runtime": entries[lab][1].runtime,
                                          "precision": entries[lab][1].precision}
                                    for lab in models},
                        "failures": failures,
                        "size_axis": {"input": name, "axis": axis, "meaning": meaning}}
        floats = [lab for lab in models if lab != AA_ROLE and plan.is_float_baseline(*entries[lab])]
        candidates = [lab for lab in models
                      if entries[lab][0] == "candidate" or entries[lab][0] in self.contenders]
        shapes, raw = [], {}
        for b in cfg.batch_sizes:
            inputs, bucket_of = real_batches.bucketed(t, ds, b, cfg.size_buckets,
                                                      cfg.batches_per_bucket, rng)
            shapes += inputs
            warm = {lab: timing.warm_up(fn, inputs, cfg.warmup_window, cfg.warmup_tolerance,
                                        cfg.warmup_max_runs) for lab, fn in fns.items()}
            pairs = [(f, c) for f in floats for c in candidates] + [("fp32", AA_ROLE)]
            single: dict = {}
            times, run_info = timing.interleaved(fns, inputs, pairs, min_rounds, cfg.max_seconds,
                                                 cfg.rel_ci, block, check_every, runs=single,
                                                 probe=probe.measure, min_seconds=cfg.min_seconds)
            stats = {lab: timing.percentiles(single[lab], b) for lab in times}
            raw[str(b)] = {lab: [round(float(ms), 4) for ms in v] for lab, v in times.items()}
            used = np.arange(run_info["rounds"]) % len(inputs)
            per_size = {lab: sorted(({"size": size_of(t, x), "bucket": bucket_of[i],
                                      "p50": float(np.median(v[used == i]))}
                                     for i, x in enumerate(inputs) if np.any(used == i)),
                                    key=lambda r: r["size"])
                        for lab, v in times.items()}
            speed = speedups(times, stats, floats, candidates, run_info.pop("probes"), cfg,
                             AA_ROLE, by_label=bool(self.contenders))
            if speed["core_state"]["changed"]:
                run_info["noisy"] = True  # one number would average two machines; see core_state
            result["batches"][str(b)] = {
                "latency_ms": stats, **speed,
                "warmup_runs": warm, **run_info, "block": block,
                "per_size": per_size, "shape_outliers": shape_outliers(per_size),
            }
        result["input_contract"] = contract(t, shapes)
        result["environment"] = environment(hw)
        if cfg.cold_start_repeats:  # per runtime: what a fresh replica pays on each target
            result["cold_start_ms"] = {
                lab: coldstart.measure(paths[role], runtimes.settings_for(hw, target),
                                       cfg.cold_start_repeats, t.example(1))
                for lab, (role, target) in entries.items()
                if lab in models and lab != AA_ROLE and (lab == role or role == "candidate")}
        (out_dir / "latency.json").write_text(json.dumps(result, indent=2))
        (out_dir / "times.json").write_text(json.dumps(raw))  # per-round ms, for the CDF plot
        return result
