"""Decode timing on a tiny decoder built with onnxruntime-genai's model builder: what is timed
and counted, never how fast (no timing verdicts)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.measure import decode
from tests.decoder_tiny import build, llama

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [3, 4, 5, 6, 7], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]]


@pytest.fixture(scope="module")
def int4(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoder")
    return build(llama(root / "hf"), root / "int4", "int4")


def test_batches_cut_to_the_shortest_keeping_the_ends():
    groups = decode.batches(PROMPTS, 2)
    assert len(groups) == 1 and groups[0].shape == (2, 5) and groups[0].dtype == np.int32
    assert groups[0][0].tolist() == [8, 9, 10, 11, 12] and groups[0][1].tolist() == [3, 4, 5, 6, 7]
    assert [g.shape for g in decode.batches(PROMPTS, 1)] == [(1, 8), (1, 5), (1, 10)]
    with pytest.raises(ValueError, match="at least one token"):
        decode.batches([[1], []], 1)


def test_a_summary_writes_only_what_was_timed_in_the_order_reports_have_it():
    """No decode step timed: no step percentiles (absent, not null); the rest as always."""
    t = decode.DecodeTiming(ttft_ms=(10.0, 30.0, 40.0), token_ms=(), tokens_per_s=0.0, streams=1,
                            new_tokens=1, prompt_tokens=(8, 8, 5))
    s = t.summary()
    assert list(s) == ["streams", "new_tokens", "tokens_per_s", "generations", "steps",
                       "ttft_ms_p50", "ttft_ms_p99", "ttft_ms_by_prompt_tokens"]
    assert (s["generations"], s["steps"], s["ttft_ms_p50"]) == (3, 0, 30.0)
    assert s["ttft_ms_by_prompt_tokens"] == {"5": 40.0, "8": 20.0}
    bare = decode.DecodeTiming((), (), 0.0, 2, 4).summary()
    assert bare == {"streams": 2, "new_tokens": 4, "tokens_per_s": 0.0, "generations": 0,
                    "steps": 0}


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_time_generation_counts_every_generation_and_step(int4):
    t = decode.time_generation(int4, PROMPTS, new_tokens=6, repeats=2, threads=1)
    assert len(t.ttft_ms) == 2 * len(PROMPTS) and t.prompt_tokens == (8, 5, 10) * 2
    assert len(t.token_ms) == 2 * len(PROMPTS) * 5            # new_tokens - 1 steps each
    assert all(ms > 0 for ms in t.ttft_ms + t.token_ms)
    assert math.isclose(t.tokens_per_s, 1000.0 / np.mean(t.token_ms))
    s = t.summary()
    assert set(s["ttft_ms_by_prompt_tokens"]) == {"5", "8", "10"}
    assert s["token_ms_p50"] <= s["token_ms_p99"]
    b = decode.time_generation(int4, PROMPTS, new_tokens=4, streams=3, repeats=1, threads=1)
    assert b.streams == 3 and len(b.ttft_ms) == 1 and b.prompt_tokens == (5,)
    assert math.isclose(b.tokens_per_s, 3 * 1000.0 / np.mean(b.token_ms))


def test_generation_is_greedy_and_full_length(int4):
    """min_length keeps a random model from stopping at its end token; greedy repeats itself."""
    import onnxruntime_genai as og

    model = decode.load_model(int4, threads=1)
    seqs = []
    for _ in range(2):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=40, min_length=40, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray([PROMPTS[0]], dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        seqs.append(gen.get_sequence(0).tolist())
    assert len(seqs[0]) == 40 and seqs[0] == seqs[1]


def test_compare_generation_interleaves_models(int4):
    times, info = decode.compare_generation({"a": int4, "b": int4}, PROMPTS[:2], new_tokens=4,
                                            threads=1, min_rounds=4, max_seconds=1.0)
    assert set(times) == {"a", "b"} and info["rounds"] >= 4
    assert len(times["a"].ttft_ms) == len(times["b"].ttft_ms) == info["rounds"]
    assert set(info["speedup_vs_a"]) == {"b"}


def test_counted_bytes_of_the_builders_int4_graph(int4):
    """The count agrees with the file the builder wrote, and its INT4 weights carry an FP32
    scale per 32 weights: a quarter more than params x bits / 8."""
    from pipeline.bill.token_bytes import count

    tb = count(int4 / "model.onnx")
    assert tb.stored == (int4 / "model.onnx.data").stat().st_size
    assert tb.by_kind["scales"] * 4 == tb.by_kind["codes"]
    assert (tb.layers, tb.kv_heads, tb.head_dim) == (2, 2, 16)   # from genai_config.json
    assert tb.output_layer == 512 * 64 // 2 + 512 * 2 * 4        # lm_head: codes and scales


def test_concurrent_streams_judge_p99_against_the_targets(int4):
    from pipeline.measure.decode_load import concurrent_streams

    kw = dict(new_tokens=4, streams=[1, 3], generations=1, threads=1)
    loose = concurrent_streams(int4, PROMPTS, ttft_p99_ms=1e9, token_p99_ms=1e9, **kw)
    assert [s["streams"] for s in loose["steps"]] == [1, 3]
    assert [s["generations"] for s in loose["steps"]] == [1, 3]
    assert all(s["meets_slo"] for s in loose["steps"]) and loose["max_streams_within_slo"] == 3
    tight = concurrent_streams(int4, PROMPTS, ttft_p99_ms=1e-9, token_p99_ms=1e9, **kw)
    assert tight["max_streams_within_slo"] == 0


def test_memory_curve_sets_measured_memory_beside_the_bill(int4):
    from pipeline.bill.token_bytes import count
    from pipeline.measure.decode_load import memory_curve

    curve = memory_curve(int4, [(2, 64)], threads=1)
    tb = count(int4 / "model.onnx")
    (row,) = curve["points"]
    assert row["bill_kv_mb"] * 2 ** 20 == tb.kv_per_position * 64 * 2
    assert row["bill_mb"] * 2 ** 20 == tb.stored + tb.kv_per_position * 64 * 2
    assert row["prefill_logits_mb"] * 2 ** 20 == 2 * 63 * 512 * 4
    assert row["model_mb"] > 0 and row["total_mb"] >= row["model_mb"]
