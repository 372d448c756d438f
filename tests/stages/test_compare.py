"""compare: model A against model B end to end, in one short interleaved timing on the real
batches of the evaluation set. No timing verdict: only that both models are timed in the same
rounds and the ratio comes with its interval."""
from __future__ import annotations

import shutil

import numpy as np

from tests.stages.support import artifact, linear_graph, run, split


def test_both_models_are_timed_in_the_same_rounds_with_an_interval(tmp_path):
    from pipeline.config import HardwareConfig
    from pipeline.stages.compare import Compare

    rng = np.random.default_rng(0)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    model = linear_graph(a / "model.onnx", {"W": rng.standard_normal((16, 4))},
                         [("MatMul", "W")], width=16)
    shutil.copytree(a, b)  # an A/A comparison: the ratio must still come with its interval
    ev = split(tmp_path, model, rng.standard_normal((16, 16)))
    meta = run(Compare(ev, 4, HardwareConfig().target(), min_rounds=20, max_seconds=0.5),
               artifact(a), tmp_path / "compare", other=artifact(b))
    assert meta["rounds"] >= 20  # both models in each round
    ratio = meta["a_over_b_speedup"]
    lo, hi = ratio["ci95"]
    assert 0 < lo <= ratio["median"] <= hi
    assert meta["ms_a"] > 0 and meta["ms_b"] > 0
