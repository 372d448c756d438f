"""The LLM bill reproduces a worked 7B example (weights, KV cache, fit on a 24 GB card) from the formulas.

Every expected value is computed here from the formula it checks, then pinned to the rounded
number the issue quotes, so a wrong formula and a wrong rounding both fail.
"""
from __future__ import annotations

import math

import pytest

from pipeline.bill.llm import kv_bytes, llm_bill, max_batch
from pipeline.engine.compose import compose
from pipeline.config import Precision
from pipeline.core.errors import ConfigError

GB = 1e9


def cfg(*overrides):
    return compose(["model=llm_7b", *overrides], config_name="bill")


def bill(*overrides, precision=None):
    c = cfg(*overrides)
    return llm_bill(c.model.llm, c.bill, c.hardware, precision)


def test_7b_fp16_weights_kv_and_total_do_not_fit_a_24gb_card():
    c = cfg("hardware=l4")
    assert c.hardware.memory_gb == 24
    assert (c.bill.batch, c.bill.seq, c.model.llm.layers, c.model.llm.kv_heads,
            c.model.llm.head_dim) == (8, 2048, 32, 32, 128)
    b = llm_bill(c.model.llm, c.bill, c.hardware).memory
    weights = 7e9 * 16 / 8
    kv = 8 * 2048 * 32 * 32 * 128 * 2 * 2
    assert b.weights_gb == pytest.approx(weights / GB) and round(b.weights_gb, 1) == 14.0
    assert b.kv_cache_gb == pytest.approx(kv / GB) and round(b.kv_cache_gb, 2) == 8.59
    assert b.kv_cache_gib == pytest.approx(kv / 2 ** 30) and b.kv_cache_gib == 8.0
    assert b.total_gb == pytest.approx((weights + kv) / GB + 1.5)
    assert round(b.total_gb, 1) == 24.1
    fit = llm_bill(c.model.llm, c.bill, c.hardware).fit
    assert fit.fits is False and fit.headroom_gb == pytest.approx(24 - b.total_gb)


def test_flops_per_token_and_compute_for_100_tokens_per_second():
    c = bill().compute
    assert c.flops_per_token == pytest.approx(2 * 7e9) and c.flops_per_token / 1e9 == 14.0
    assert c.target_tokens_per_s == 100
    assert c.tflops_for_target == pytest.approx(2 * 7e9 * 100 / 1e12)
    assert round(c.tflops_for_target, 2) == 1.4


@pytest.mark.parametrize("precision, bytes_per_param, pinned, block", [
    (Precision.fp16, 2, 142.9, 32), (Precision.int8, 1, 285.7, 0),
    (Precision.int8, 1 + 4 / 32, 254.0, 32)])  # the article's, then with a scale per 32 weights
def test_decode_ceiling_at_2_tb_per_s(precision, bytes_per_param, pinned, block):
    d = bill("hardware.memory_bandwidth_gbs=2000", f"bill.weight_block={block}",
             precision=precision).decode
    expected = 2000e9 / (7e9 * bytes_per_param)
    assert d.tokens_per_s_single_stream == pytest.approx(expected)
    assert round(d.tokens_per_s_single_stream, 1) == pinned


def test_half_the_bandwidth_half_the_ceiling():
    full = bill("hardware.memory_bandwidth_gbs=2000").decode.tokens_per_s_single_stream
    half = bill("hardware.memory_bandwidth_gbs=1000").decode.tokens_per_s_single_stream
    assert half == pytest.approx(full / 2)


def test_grouped_query_attention_shows_its_kv_saving():
    mha, gqa = bill().memory, bill("model=llm_7b_gqa")
    kv = 8 * 2048 * 32 * 8 * 128 * 2 * 2
    assert gqa.memory.kv_cache_gb == pytest.approx(kv / GB)
    assert round(gqa.memory.kv_cache_gb, 2) == 2.15
    assert gqa.gqa.kv_saving_factor == 32 / 8
    assert gqa.gqa.kv_cache_if_mha_gb == pytest.approx(mha.kv_cache_gb)
    assert gqa.gqa.kv_saving_gb == pytest.approx(mha.kv_cache_gb - kv / GB)
    assert gqa.memory.weights_gb == mha.weights_gb  # only the KV cache changes


def test_largest_batch_that_fits_is_the_edge_of_fitting():
    c = cfg("hardware=l4")
    per_seq = kv_bytes(c.model.llm, 1, 2048, Precision.fp16)
    expected = math.floor((24 * GB - 14 * GB - 1.5 * GB) / per_seq)
    assert max_batch(c.model.llm, c.bill, c.hardware) == expected == 7
    assert bill("hardware=l4", "bill.batch=7").fit.fits is True
    assert bill("hardware=l4", "bill.batch=8").fit.fits is False
    # INT8 weights free 7 GB: more sequences fit, and a GQA cache 4x more again.
    assert bill("hardware=l4", precision=Precision.int8).fit.max_batch > expected
    assert bill("hardware=l4", "model=llm_7b_gqa").fit.max_batch == math.floor(
        (24 * GB - 14 * GB - 1.5 * GB) / (per_seq / 4))


def test_memory_kept_free_and_weights_alone_too_big():
    kept = bill("hardware=l4", "bill.batch=1", "bill.keep_free=0.5").fit
    assert kept.usable_gb == 12 and kept.fits is False and kept.max_batch == 0
    big = compose(["model=llm_70b", "hardware=h200"], config_name="bill")
    fp16 = llm_bill(big.model.llm, big.bill, big.hardware)
    int8 = llm_bill(big.model.llm, big.bill, big.hardware, Precision.int8)
    assert fp16.memory.weights_gb == pytest.approx(140) and not fp16.fit.fits
    assert int8.fit.fits and int8.fit.max_batch > 8


def test_precisions_scale_weights_and_prefill_is_compute_bound():
    weights = {p: bill("bill.weight_block=0", precision=p).memory.weights_gb for p in Precision}
    assert weights == pytest.approx({Precision.fp32: 28.0, Precision.fp16: 14.0,
                                     Precision.int8: 7.0, Precision.int4: 3.5})
    # The kernels also read a scale per block: at 32 weights and FP32 scales INT4 is 25 % more
    # than params x bits / 8, INT8 12.5 %; FP16 scales (GPTQ, AWQ) half that; floats unchanged.
    blocked = {p: bill(precision=p).memory.weights_gb for p in Precision}
    assert blocked == pytest.approx({Precision.fp32: 28.0, Precision.fp16: 14.0,
                                     Precision.int8: 7.875, Precision.int4: 4.375})
    assert bill("bill.scale_bytes=2", precision=Precision.int4).memory.weights_gb == \
        pytest.approx(3.5 * (1 + 2 / 32 / 0.5))
    c = cfg("hardware=h100")
    p = llm_bill(c.model.llm, c.bill, c.hardware).prefill
    flops = 2 * 7e9 * 8 * 2048 + 2 * 32 * 8 * 2048 ** 2 * 32 * 128
    assert p.flops == pytest.approx(flops)
    assert p.seconds_bound == pytest.approx(flops / (989.5e12))
    assert p.peak_precision == "fp16"


@pytest.mark.parametrize("override, message", [
    ("model.llm.kv_heads=5", "must divide attention_heads=32"),
    ("bill.seq=8192", "longer than model.llm.max_context=4096"),
    ("bill.precision=int3", "expected one of [fp32, fp16, int8, int4]"),
    ("bill.keep_free=1", "must be in [0, 1)"),
    ("quant=int8", "not a config group of this command"),
])
def test_bad_bill_values_are_one_line(override, message):
    with pytest.raises(ConfigError) as e:
        cfg(override)
    assert message in str(e.value) and "\n" not in str(e.value)
