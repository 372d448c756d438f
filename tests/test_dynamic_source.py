"""Which graph dynamic INT8 of a fused transformer quantizes (``pipeline.recipes.int8``): the
sources offered, and the choice from a head-to-head timing, here with injected per-round times
(no verdict on the real clock). The real run on the tiny model is in tests/test_hf.py."""
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.config import DynamicSource, QuantConfig, QuantMode
from pipeline.measure.results import Speedup
from pipeline.measure.timing import ratio_ci
from pipeline.recipes import int8 as recipe


def _art(stage: str, model: str, digest: str = ""):
    return SimpleNamespace(stage=stage, files={"model.onnx": model}, digest=digest or model)


def _cfg(mode=QuantMode.dynamic, source=DynamicSource.auto, exclude=()):
    return SimpleNamespace(quant=QuantConfig(mode=mode, dynamic_source=source,
                                             exclude=list(exclude)))


FUSED, EXPORT = _art("fuse", "aa"), _art("export", "bb")


def test_both_sources_only_for_dynamic_int8_of_a_changed_fused_graph():
    assert recipe.dynamic_sources(_cfg(), FUSED, EXPORT) == {"fused": FUSED, "export": EXPORT}
    # static INT8 (model=ocr quant=int8 among them) and mixed keep the one graph they had
    for mode in (QuantMode.int8, QuantMode.mixed):
        assert recipe.dynamic_sources(_cfg(mode), FUSED, EXPORT) == {"fused": FUSED}
    optimized = _art("optimize", "aa")  # no transformer fusions: the OCR models' dynamic INT8
    assert recipe.dynamic_sources(_cfg(), optimized, EXPORT) == {"fused": optimized}
    unchanged = _art("fuse", "bb")      # fusions found nothing: one graph, nothing to time
    assert recipe.dynamic_sources(_cfg(), unchanged, EXPORT) == {"fused": unchanged}
    assert recipe.dynamic_sources(_cfg(), FUSED, None) == {"fused": FUSED}
    # exclusions name the fused graph's nodes: auto keeps to it
    assert recipe.dynamic_sources(_cfg(exclude=["n"]), FUSED, EXPORT) == {"fused": FUSED}


def test_a_forced_source_is_the_only_one_built():
    assert recipe.dynamic_sources(_cfg(source=DynamicSource.fused), FUSED, EXPORT) == {
        "fused": FUSED}
    assert recipe.dynamic_sources(_cfg(source=DynamicSource.export), FUSED, EXPORT) == {
        "export": EXPORT}


class _Runner:
    """Runs the head-to-head ``compare`` stage on injected per-round times."""

    def __init__(self, export_ms, fused_ms):
        self.times, self.calls = (np.asarray(export_ms), np.asarray(fused_ms)), []

    def run(self, stage, parent, label, other):
        self.calls.append((stage, parent, other))
        a, b = self.times
        return SimpleNamespace(meta={"a_over_b_speedup": ratio_ci(b, a), "ms_a": float(np.median(a)),
                                     "ms_b": float(np.median(b)), "noisy": False})


def _race(export_ms, fused_ms):
    rng = np.random.default_rng(0)
    runner = _Runner(np.asarray(export_ms) * rng.uniform(0.99, 1.01, len(export_ms)), fused_ms)
    cfg = SimpleNamespace(bench=SimpleNamespace(min_rounds=20, max_seconds=1.0),
                          gate=SimpleNamespace(speedup_batch_size=8))
    qz = SimpleNamespace(runner=runner, evaluation=None, hw=None)
    built = {DynamicSource.fused: (qz, _art("quantize", "f"), None),
             DynamicSource.export: (qz, _art("quantize", "e"), None)}
    chosen, record = recipe.race(cfg, built)
    stage, parent, other = runner.calls[0]
    assert (parent.digest, other.digest, stage.batch_size) == ("e", "f", 8)
    return chosen, record


@pytest.mark.parametrize("export_ms, chosen", [
    (84.0, "export"),   # mpnet's measured 1/0.84: the export's INT8 is faster, kept
    (100.0, "fused"),   # equal within the interval: the fused graph, as before
    (120.0, "fused"),   # slower: the fused graph
])
def test_the_faster_candidate_is_kept_and_ties_keep_the_fused_one(export_ms, chosen):
    fused = np.full(60, 100.0) * np.random.default_rng(1).uniform(0.99, 1.01, 60)
    got, record = _race(np.full(60, export_ms), fused)
    assert got == record.chosen == chosen
    assert record.ms.fused == pytest.approx(100.0, rel=0.02)
    assert record.ms.export == pytest.approx(export_ms, rel=0.02)
    assert record.candidates == {"fused": "f", "export": "e"} and record.batch_size == 8
    assert (record.export_over_fused_speedup.low > 1.0) == (chosen == "export")


def test_pick_source_needs_the_whole_interval_above_one():
    assert recipe.pick_source(Speedup(1.19, 1.01, 1.30)) == "export"
    assert recipe.pick_source(Speedup(1.05, 0.99, 1.10)) == "fused"
    assert recipe.pick_source(Speedup(0.80, 0.75, 0.85)) == "fused"
