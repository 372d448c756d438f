"""The formatter every table cell goes through: each kind of number reads with its unit and a
precision that keeps what the measurement can tell; an undeclared value reads by its shape and
the words around it, never as JSON."""
from __future__ import annotations

import math

import pytest

from pipeline.core import numbers as n


def test_a_ratio_reads_with_its_interval():
    assert n.ratio(1.6689, [1.5630, 1.7189]) == "1.67x (CI 1.56-1.72)"
    assert n.ratio(0.5) == "0.50x"
    assert n.ratio(None) == n.NONE and n.ratio(2.0, [None, 3.0]) == "2.00x"


@pytest.mark.parametrize("fn,value,text", [
    (n.ms, 0.48627, "0.486 ms"), (n.ms, 3.3249, "3.32 ms"), (n.ms, 128.56, "128.6 ms"),
    (n.ms, 12345.6, "12,346 ms"), (n.seconds, 227.6, "227.6 s"),
    (n.percent, 99.5, "99.50 %"), (n.points, 0.04999999999999716, "0.05 points"),
    (n.cosine, 0.9998443, "0.9998"), (n.count, 1234567, "1,234,567"), (n.rate, 325.68, "325.7/s"),
    (n.size, 6_270_000, "6.27 MB"), (n.size, 999, "999 B"), (n.size, 2.5e9, "2.50 GB"),
    (n.megabytes, 1.5, "1.50 MB"),
])
def test_each_kind_carries_its_unit(fn, value, text):
    assert fn(value) == text


def test_a_share_of_one_reads_as_a_percentage():
    assert n.percent(0.9995, fraction=True) == "99.95 %"


def test_plain_numbers_keep_the_digits_that_tell_values_apart():
    # 1.0026 is an A/A ratio: "1" would hide that it is not exactly one
    assert n.number(1.0026) == "1.00" and n.number(99.5) == "99.50"
    assert n.number(0.0123) == "0.0123" and n.number(0.555) == "0.555"
    assert n.number(258) == "258" and n.number(15000.4) == "15,000" and n.number(0.0) == "0"
    assert n.number(True) == "yes" and n.number(None) == n.NONE
    assert n.number(math.nan) == n.NONE and n.number(math.inf) == "∞"
    assert n.number(2.0, decimals=3) == "2.000"


@pytest.mark.parametrize("label,kind", [
    ("int8 >= 1.8x faster than fp32 at batch 8", "ratio"),
    ("ocr batch 1: A/A of the winner within 3 %", "ratio"),
    ("mean cosine vs FP16 >= 0.99", "cosine"),  # a cosine, though "vs" compares
    ("int8 drop <= 0.3 points", "points"),
    ("FP32 parity with its own code, batch 1 (% of lines)", "percent"),
    ("second run < 30 s, all reused", "seconds"),
    ("back-to-back speedups within 5 % at batch 1", None),  # a spread, not a ratio
    ("quantized nodes >= 250", None),
])
def test_a_label_names_the_kind_only_when_it_is_unambiguous(label, kind):
    assert n.kind_of(label) == kind


def test_a_value_of_any_shape_reads_as_text():
    assert n.readable({"ci95": [1.563, 1.719], "median": 1.669}) == "1.67x (CI 1.56-1.72)"
    # the label names the list's items
    assert n.readable([591, 62], "fusions cut the node count (before, after)") == \
        "before 591, after 62"
    assert n.readable([[56.6, 9.79], [56.4, 9.82]], "accuracy / CER of fp32, fp16") == \
        "fp32 56.60 / 9.79, fp16 56.40 / 9.82"
    # keys name their units; a group's name decides for its members
    assert n.readable({"ort_default_vs_fp32": 0.5777, "pipeline_drop_points": 0.0,
                       "rss_mb": 120.5, "p50_ms": 2.0, "peer_cosine": {"mean": 0.8667, "p1": 0.7776}}
                      ) == ("ort default vs fp32 0.58x; pipeline drop points 0.00 points; "
                            "rss mb 120.50 MB; p50 ms 2.00 ms; peer cosine (mean 0.8667, p1 0.7776)")
    assert n.readable([1.732, 1.44], "faster than the default") == "1.73x, 1.44x"
    assert n.readable("PASS") == "PASS" and n.readable(None) == n.NONE
    assert n.readable([]) == n.NONE and n.readable({}) == n.NONE


def test_no_shape_prints_json():
    weird = {"a": [{"b": {"c": [1, {"d": None}]}}], "e": [[[]]], "f": {"median": 1.0}}
    text = n.readable(weird, "anything")
    assert not set(text) & set("{}[]\""), text
