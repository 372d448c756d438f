"""benchmark: the candidate and the float baselines timed side by side, per batch size, with the
A/A copy of FP32 that tells whether the timing can be trusted. Cheap settings and no timing
verdict: what is asserted is which models and batch sizes were timed and how the record reads."""
from __future__ import annotations

import json

import numpy as np

from tests.stages.support import INT8, artifact, mlp_graph, run, split

def test_every_model_and_batch_size_is_timed_with_percentiles_and_ratios(tmp_path):
    from pipeline.config import HardwareConfig, TimingConfig
    from pipeline.stages.benchmark import AA_ROLE, Benchmark
    from pipeline.stages.quantize import Quantize

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    model = mlp_graph(src, rng, 16, 16, 4)
    qmeta = run(Quantize(INT8, True, "minmax", (), ("MatMul",)), artifact(src),
                tmp_path / "int8")
    # cheap: 10 rounds a batch size (rel_ci wide enough to stop there), a short warm-up, no cold
    # starts (tested on the tiny pipeline run)
    timing = TimingConfig(batch_sizes=[1, 4], min_rounds=10, min_seconds=0, max_seconds=0.5,
                          rel_ci=0.9, size_buckets=1, batches_per_bucket=1, warmup_max_runs=20,
                          aa_tolerance=0.5, cold_start_repeats=0)
    ev = split(tmp_path, model, rng.standard_normal((16, 16)))
    meta = run(Benchmark(ev, timing, HardwareConfig().target()),
               artifact(tmp_path / "int8", "quantize", **qmeta), tmp_path / "bench",
               fp32=artifact(src))

    models = {"candidate", "fp32", AA_ROLE}
    assert set(meta["batches"]) == {"1", "4"} and set(meta["targets"]) == models
    for b, batch in meta["batches"].items():
        assert set(batch["latency_ms"]) == models and batch["rounds"] >= 10
        for stats in batch["latency_ms"].values():
            assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"]
        assert set(batch["speedup"]) == {"fp32", AA_ROLE} and batch["fastest_float"] == "fp32"
        for ratio in (batch["speedup"]["fp32"], batch["aa_check"]):
            lo, hi = ratio["ci95"]
            assert 0 < lo <= ratio["median"] <= hi
    assert json.loads((tmp_path / "bench" / "latency.json").read_text()) == meta
