"""The quantization record (``pipeline.quant.int8_info``) and its report section
(``pipeline.report.quant``): report.json's section read into the typed record and written back
is the same JSON, key for key; the Markdown from the record is the Markdown the renderer wrote
from the JSON before the record was typed (the expected lines below were rendered by it, from
this very section); a renamed key is an error that names it, not a silently empty line."""
from __future__ import annotations

import json

import pytest

from pipeline.core.json_record import to_json
from pipeline.quant.explanation import Explanation
from pipeline.quant.int8_info import NodeTrial, QuantInfo
from pipeline.quant.search_record import NodeSensitivity, SearchRecord
from pipeline.report import quant


def node(name, module, op, kernel, precision, fp32_ms, int8_ms, **extra):
    return {"node": name, "module": module, "fp32_op": op, "int8_op": kernel,
            "precision": precision, "fp32_ms": fp32_ms, "int8_ms": int8_ms,
            "gain_ms": fp32_ms - int8_ms, "slower_in_int8": int8_ms > fp32_ms, **extra}


def section() -> dict:
    sp = {"median": 1.19, "ci95": [1.05, 1.3]}
    return {
        "settings": {"activation_type": "uint8", "weight_type": "int8", "reduce_range": False,
                     "format": "QDQ", "vnni": True, "reason": "avx512_vnni: exact u8 x s8 products"},
        "calibration": "entropy", "calibration_ranking": {"minmax": 91.5, "entropy": 92.25},
        "smoothing": {"scores": {"off": 0.9712, "0.5": 0.9801}, "chosen": 0.5, "metric": "cosine",
                      "activations": 12, "largest_outlier_ratio": 23.4},
        "explain": {"batch_size": 8, "runs": 20, "fp32_total_ms": 3.5, "int8_total_ms": 2.25,
                    "qdq_overhead_ms": 0.125, "slower_in_int8": ["enc.1/MatMul"],
                    "nodes": [node("enc.0/MatMul", "enc.0", "MatMul", "QLinearMatMul", "int8-static", 2.0, 1.0),
                              node("enc.1/MatMul", "enc.1", "MatMul", "QLinearMatMul", "int8-static", 1.0, 1.125,
                                   fusion_group={"host": "enc.1/MatMul", "fp32_ms": 1.0, "int8_ms": 1.125}),
                              node("head/Add", None, "Add", "Add", "float", 0.5, 0.125)],
                    "unfused_quantize": 2, "unfused_dequantize": 3, "int8_kernels": ["QLinearMatMul"],
                    "float_compute": ["head/Add (Add)"], "ran_alone": {"waited_s": 0.0}},
        "latency_exclusions": ["enc.1/MatMul"],
        "latency_trial": {"float_nodes": ["enc.1/MatMul"], "stayed_int8": ["pool"],
                          "speedup_over_all_int8": sp},
        "regions": None, "float_outputs": ["head/Add"],
        "sensitivity": [{"node": "enc.0/MatMul", "op": "MatMul", "group": "enc.0", "sqnr_db": 31.5,
                         "latency_gain_ms": 1.0, "metric_effect": 0.25, "score": 0.25,
                         "signal": "trial", "can_float": True}],
        "search": {"verdict": {"budget_points": 0.1, "met": True, "chosen_float_nodes": ["enc.0/MatMul"],
                               "drop": 0.05, "full_evaluations": 2, "evaluation_limit": 5,
                               "within_limit": True, "quantizable_nodes": 2, "units": 2,
                               "ranked_by": "blocks",
                               "trials": {"ranking_trials": 2, "hand_back_trials": 0, "edited": 2,
                                          "requantized": 2, "full_evaluations": 2},
                               "seconds": 12.5, "time_budget_s": 1800.0, "stopped_by_budget": None,
                               "summary": "kept 1 of 2 nodes float"},
                   "trace": [{"float_nodes": [], "accuracy": 91.0, "drop": 1.25, "within_budget": False,
                              "estimated_ms": 2.25, "step": "all INT8"},
                             {"float_nodes": ["enc.0/MatMul"], "accuracy": 92.2, "drop": 0.05,
                              "within_budget": True, "estimated_ms": 3.25, "step": "top 1 of 2 blocks float"}],
                   "order": ["enc.0", "enc.1"],
                   "groups": [{"name": "enc.0", "nodes": 1, "gain_ms": 1.0, "sqnr_db": 31.5,
                               "signal": "trial", "effect": 0.25, "can_float": True}],
                   "hand_back": [{"node": "enc.0/MatMul", "gain_ms": 1.0, "harm": 0.5, "handed_back": False}]},
        "versus_fp32": {"speedup": {"1": {"median": 0.9, "ci95": [0.85, 0.95]}, "8": sp},
                        "slower_at_batch": ["1"], "candidate": "fp32"},
        "dynamic_source": {"chosen": "export", "forced": None, "batch_size": 8,
                           "ms": {"export": 4.2, "fused": 5.0}, "export_over_fused_speedup": sp,
                           "noisy": False, "candidates": {"fused": "aa", "export": "bb"}},
    }


EXPECTED = [
    "",
    "## Quantization",
    "",
    "- settings: activations uint8, weights int8, reduce_range False, format QDQ (avx512_vnni: "
    "exact u8 x s8 products)",
    "- calibration: entropy; ranked on the hardest lines: minmax 91.50, entropy 92.25",
    "- outlier smoothing: 12 MatMul inputs, largest channel up to 23x the median one; cosine on "
    "the hardest samples, all INT8: no smoothing 0.9712, alpha 0.5 0.9801; kept: alpha 0.5",
    "- dynamic INT8 of the fused graph 5.00 ms, of the unfused export 4.20 ms at batch 8 (the "
    "export ran 1.19x (CI 1.05-1.30) the fused one): kept the export one",
    "- on this target: 2 QuantizeLinear and 3 DequantizeLinear left unfused; INT8 kernels "
    "QLinearMatMul; still float: head/Add (Add)",
    "- profile at batch 8: FP32 3.50 ms, INT8 2.25 ms (Q/DQ 0.12 ms)",
    "- profiled slower in INT8: enc.1/MatMul; keeping them float ran 1.19x (CI 1.05-1.30) the "
    "all-INT8 model end to end: kept float",
    "- profiled slower in INT8 but left INT8: pool (between INT8 neighbours onnxruntime keeps the "
    "Q/DQ pair and the INT8 kernel)",
    "- INT8 cannot pay here: the final INT8 model ran 0.90x (CI 0.85-0.95) at batch 1, 1.19x "
    "(CI 1.05-1.30) at batch 8 against FP32 end to end; the candidate is the FP32 model "
    "(`quant=auto` picks the fastest artifact that passes every gate)",
    "- model outputs kept float: head/Add (no weights: INT8 there gains microseconds and rounds "
    "the model's output to 8 bits)",
    "",
    "| module | op | precision | SQNR dB | accuracy effect | FP32 ms | INT8 ms | gain ms |",
    "|---|---|---|---|---|---|---|---|",
    "| enc.0 | MatMul → QLinearMatMul | int8-static | 31.5 | +0.25 | 2.000 | 1.000 | +1.000 |",
    "| enc.1 | MatMul → QLinearMatMul | int8-static | – | – | 1.000 | 1.125 | -0.125 |",
    "",
    "**Mixed precision: kept 1 of 2 nodes float** (2 full evaluations, limit 5.0 for 2 nodes)",
    "",
    "- ranked by blocks: 2 units, 2 ranking trials and 0 hand-back trials on the hardest lines "
    "(2 models made by editing the INT8 graph, 2 quantized), 12 s of a 1800 s budget",
    "",
    "| step | float nodes | accuracy | drop | within budget | est. ms |",
    "|---|---|---|---|---|---|",
    "| all INT8 | (none) | 91.00 | 1.25 | no | 2.25 |",
    "| top 1 of 2 blocks float | enc.0/MatMul | 92.20 | 0.05 | yes | 3.25 |",
]


def test_the_section_reads_into_typed_records_and_writes_back_the_same_json():
    d = section()
    q = QuantInfo.from_json(d)
    assert isinstance(q.explain, Explanation) and isinstance(q.node_trial, NodeTrial)
    assert isinstance(q.search, SearchRecord) and isinstance(q.sensitivity[0], NodeSensitivity)
    assert q.explain.nodes[1].fusion_group.int8_ms == 1.125 and q.explain.nodes[0].fusion_group is None
    assert q.versus.speedup["1"].high == 0.95 and q.source.ms.export == 4.2
    assert json.dumps(quant.as_dict(q), sort_keys=True) == json.dumps(d, sort_keys=True)
    # what quant=auto's record and the manifest's version name still read: the JSON forms
    assert q.latency_trial == d["latency_trial"] and q.versus_fp32 == d["versus_fp32"]
    assert q.dynamic_source == d["dynamic_source"]


def test_the_markdown_is_the_one_rendered_from_the_json_before_it_was_typed():
    d = section()
    assert quant.markdown(QuantInfo.from_json(d)) == EXPECTED
    assert quant.markdown(d) == EXPECTED  # the report.json form, still taken


def test_one_graph_and_no_smoothing_read_as_before():
    d = section()
    d["dynamic_source"] = {"chosen": "fused", "forced": "fused", "why": "quant.dynamic_source=fused"}
    d["smoothing"]["chosen"] = "off"
    lines = quant.markdown(d)
    assert "- dynamic INT8 of the fused graph (quant.dynamic_source=fused)" in lines
    assert lines[5].endswith("; kept: none")
    assert to_json(QuantInfo.from_json(d).source) == d["dynamic_source"]  # no timing keys added


def test_a_renamed_key_is_an_error_that_names_it():
    d = section()
    d["explain"]["nodes"][0]["gain"] = d["explain"]["nodes"][0].pop("gain_ms")
    with pytest.raises(TypeError, match=r"NodeProfile: no field for \['gain'\]"):
        QuantInfo.from_json(d)
