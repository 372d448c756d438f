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


def test_fp32_and_a_candidate_are_timed_round_by_round(tiny_decoder, tmp_path):
    from types import SimpleNamespace as NS

    fp32 = tiny_decoder.fp32
    int4 = tmp_path / "int4"
    run(WeightOnly(tuple((n, 4) for n in matmuls(fp32.path)), 32, True, "rtn", 0), fp32, int4)
    hardware = HardwareConfig(intra_op_threads=1).target()
    stage = DecodeSpeed(tiny_decoder.text, prompts=2, prompt_tokens=8, new_tokens=4, streams=1,
                        threads=1, max_seconds=30.0, rel_ci=10.0, min_rounds=3,
                        hardware=hardware)
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
