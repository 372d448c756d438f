"""regions: every trial model is timed in one interleaved run with the INT8 model it starts from
and FP32, so each trial gets both ratios (over all-INT8, over FP32) with intervals, from the same
rounds. No timing verdict is asserted: only that every number comes from that one run."""
from __future__ import annotations

import numpy as np

from tests.stages.support import INT8, artifact, mlp_graph, run, split

def test_each_trial_gets_both_ratios_from_one_interleaved_run(tmp_path):
    from pipeline.config import HardwareConfig
    from pipeline.stages.quantize import Quantize
    from pipeline.stages.regions import BASE, FP32, RegionTrials

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    model = mlp_graph(src, rng, 16, 16, 4)
    int8 = {}
    for name, exclude in (("all", ()), ("keep matmul2 float", ("matmul2",))):
        meta = run(Quantize(INT8, False, "minmax", (), ("MatMul",), exclude), artifact(src),
                   tmp_path / name)
        int8[name] = artifact(tmp_path / name, "quantize", **meta)
    assert int8["keep matmul2 float"].meta["precision"]["matmul2"] == "float"

    trials = ("keep matmul2 float",)
    ev = split(tmp_path, model, rng.standard_normal((16, 16)))
    meta = run(RegionTrials(ev, 2, HardwareConfig(), trials, min_rounds=20, max_seconds=0.5),
               int8["all"], tmp_path / "regions", fp32=artifact(src), t0=int8[trials[0]])

    assert set(meta["p50_ms"]) == {BASE, FP32, *trials} and meta["batch_size"] == 2
    assert meta["rounds"] >= 20  # one run: every model timed in each of these rounds
    row = meta["trials"]["keep matmul2 float"]
    for ratio in (row["speedup_over_all_int8"], row["speedup_over_fp32"], meta["all_int8_over_fp32"]):
        lo, hi = ratio["ci95"]
        assert 0 < lo <= ratio["median"] <= hi
    assert row["p50_ms"] == meta["p50_ms"]["keep matmul2 float"]
    assert np.isclose(row["ms_saved_vs_all_int8"], meta["p50_ms"][BASE] - row["p50_ms"])
