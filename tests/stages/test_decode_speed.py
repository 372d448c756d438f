"""decode_speed: FP32 and a candidate generating side by side on prompts cut from the evaluation
text. What is timed and counted, never how fast (no timing verdicts): every round one whole
generation per model, each of ``new_tokens`` (a first token and its steps) from a prompt of
``prompt_tokens``, the candidate's speedup over FP32 with its interval, and the environment the
numbers belong to."""
from __future__ import annotations

import pytest

from pipeline.config import HardwareConfig
from pipeline.stages.decode_speed import DecodeSpeed
from pipeline.stages.weight_only import WeightOnly, matmuls
from tests.stages.support import run

# Every test here stands on the tiny Llama's export by the model builder (tiny_decoder: about
# ten seconds, once per worker): out of make test-fast's edit loop.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_fp32_and_a_candidate_are_timed_round_by_round(tiny_decoder, tmp_path, one_at_a_time):
    """Interleaved (both models loaded), or one model at a time (the streaming path's models
    do not fit together): the same counts either way, and the result says which it was."""
    from types import SimpleNamespace as NS

    fp32 = tiny_decoder.fp32
    int4 = tmp_path / "int4"
    run(WeightOnly(tuple((n, 4) for n in matmuls(fp32.path)), 32, True, "rtn", 0), fp32, int4)
    hardware = HardwareConfig(intra_op_threads=1).target()
    stage = DecodeSpeed(tiny_decoder.text, prompts=2, prompt_tokens=8, new_tokens=4, streams=1,
                        threads=1, max_seconds=30.0, rel_ci=10.0, min_rounds=3,
                        hardware=hardware, one_at_a_time=one_at_a_time)
    meta = run(stage, fp32, tmp_path / "speed", int4=NS(path=int4))

    rounds = meta["rounds"]
    assert rounds >= 3 and set(meta["timings"]) == {"fp32", "int4"}
    for t in meta["timings"].values():
        assert t["generations"] == rounds and t["steps"] == rounds * (4 - 1)
        assert t["new_tokens"] == 4 and t["streams"] == 1
        assert set(t["ttft_ms_by_prompt_tokens"]) == {"8"}  # every prompt cut to 8 tokens
        assert 0 < t["token_ms_p50"] <= t["token_ms_p99"] and t["tokens_per_s"] > 0
    speedup = meta["speedup_vs_fp32"]["int4"]  # FP32's time over the candidate's, per round
    low, high = speedup["ci95"]
    assert set(meta["speedup_vs_fp32"]) == {"int4"} and 0 < low <= speedup["median"] <= high
    assert meta["environment"]["threads"]["intra_op"] == 1 and meta["peak_rss_mb"] > 0
    assert meta["one_at_a_time"] is one_at_a_time
    if one_at_a_time:
        assert rounds == 3  # min_rounds passes each, not "until the interval is narrow"
    # what the gate and the decoder's report read: the same numbers, by field
    from pipeline.core.json_record import to_json
    from pipeline.measure.results import DecodeResult

    typed = DecodeResult.of(NS(meta=meta))
    assert typed.rounds == rounds and typed.one_at_a_time is one_at_a_time
    assert typed.speedups["int4"].low == low and typed.speedups["int4"].high == high
    assert {r: to_json(t) for r, t in typed.timings.items()} == meta["timings"]


def test_one_at_a_time_releases_each_model_before_the_next_loads(monkeypatch):
    """The order of loads and releases, with a stand-in for onnxruntime-genai's model: a model
    is gone before the next one is loaded (what keeps a 7 B reference and its candidate from
    being resident together), and every round runs the same prompts on every model."""
    from pipeline.measure import decode

    events = []

    class Model:
        def __init__(self, folder):
            self.folder = folder
            events.append(("load", folder))

        def __del__(self):
            events.append(("free", self.folder))

    def generate(model, batch, new_tokens):
        events.append(("run", model.folder, tuple(batch[0])))
        return 1.0, [1.0] * (new_tokens - 1)

    monkeypatch.setattr(decode, "load_model", lambda folder, threads=None: Model(folder))
    monkeypatch.setattr(decode, "generate", generate)
    timings, info = decode.compare_generation({"fp32": "a", "int4": "b"}, [[1, 2, 3], [4, 5, 6]],
                                              new_tokens=3, min_rounds=4, one_at_a_time=True)
    loads_and_frees = [e for e in events if e[0] != "run"]
    assert loads_and_frees == [("load", "a"), ("free", "a"), ("load", "b"), ("free", "b")]
    runs = {m: [e[2] for e in events if e[0] == "run" and e[1] == m][2:] for m in "ab"}
    assert runs["a"] == runs["b"] == [(1, 2, 3), (4, 5, 6)] * 2  # after two warm-ups each
    assert info["one_at_a_time"] and info["rounds"] == 4 and set(info["speedup_vs_fp32"]) == {
        "int4"}
    assert timings["int4"].streams == 1 and len(timings["int4"].ttft_ms) == 4
