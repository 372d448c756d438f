"""loadtest: requests at a fixed rate through the dynamic batcher for ``soak_seconds`` (the soak
mode), resident memory sampled every second. No timing verdict: a tiny model at 40 requests a
second answers every request, on any machine, and what is asserted is what the record holds.
The evaluation set holds 16 samples, fewer than the 20 single requests that measure the service
time (which read past its end before they cycled through it)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.stages.support import artifact, linear_graph, run, split


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_a_soak_serves_the_fixed_rate_and_samples_memory_each_second(tmp_path):
    from pipeline.config import HardwareConfig, LoadConfig
    from pipeline.stages.loadtest import LoadTest

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    src.mkdir()
    model = linear_graph(src / "model.onnx", {"W": rng.standard_normal((16, 4))},
                         [("MatMul", "W")], width=16)
    load = LoadConfig(max_batch=4, soak_seconds=2.0, soak_qps=40.0)
    meta = run(LoadTest(split(tmp_path, model, rng.standard_normal((32, 16))), "soak", load,
                        1000.0, HardwareConfig().target()),
               artifact(src), tmp_path / "load", fp32=artifact(src))
    assert list(meta["models"]) == ["candidate"]  # a soak runs the candidate alone
    soak = meta["models"]["candidate"]["soak"]
    assert (soak["qps"], soak["seconds"]) == (40.0, 2.0)
    summary = soak["summary"]
    assert summary["offered_qps"] == 40.0 and summary["completed"] == summary["requests"] > 0
    assert not summary["saturated"] and summary["backlog"] == 0
    seconds = [t for t, _ in soak["rss_mb"]]  # a sample after each whole second served
    assert 1 <= len(seconds) <= 2 and seconds[0] >= 1.0 and np.all(np.diff(seconds) >= 1.0)
    assert all(mb > 0 for _, mb in soak["rss_mb"])
    assert json.loads((tmp_path / "load" / "load.json").read_text()) == json.loads(json.dumps(meta))
