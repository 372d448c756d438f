"""The decoder's report body, typed (pipeline.report.decoder_body): report.json's body read back
gives the same JSON, and report.md comes out the same from the typed report and from the body
the publish flow updates. No stage runs: the body is one a quant=auto run writes, by hand."""
from __future__ import annotations

import copy
import json

from pipeline.core.json_record import to_json
from pipeline.measure.results import Role
from pipeline.report.decoder import evidence, markdown
from pipeline.report.decoder_body import DecoderReport

SPEED = {"median": 1.8, "ci95": [1.7, 1.9]}
DECODE = {"streams": 1, "new_tokens": 4, "tokens_per_s": 120.5, "generations": 6, "steps": 18,
          "token_ms_p50": 8.1, "token_ms_p99": 9.9, "ttft_ms_p50": 12.0, "ttft_ms_p99": 14.0,
          "ttft_ms_by_prompt_tokens": {"8": 12.0}}
SCORES = {"perplexity": 301.2, "perplexity_rise_pct": 0.7, "top1_agreement": 0.96,
          "kl_mean": 0.004, "sequences": 12, "sequences_total": 12, "stopped": None}


def _row(role: str, bits, speedup, decode=DECODE, **scores) -> dict:
    return {"role": role, "digest": role * 4, "weights_mb": 1.25, "matmul_bits": bits,
            "matmul_float": 0 if bits else None, **SCORES, **scores, "decode": decode,
            "speedup_vs_fp32": speedup}


BODY = {
    "status": "complete", "kind": "decoder", "model": "tiny", "quant": "auto",
    "config": {"quant": {"mode": "auto"}}, "environment": {"cpu": "x"},
    "decoder": {"folder": "/m"},
    "settings": {"accuracy_level": 4, "accuracy_level_reason": "avx2", "block_size": 128,
                 "symmetric": True, "algorithm": "rtn", "matmuls": 11,
                 "groups": ["layers.0", "lm_head"],
                 "memory": {"params": 10, "checkpoint_dtype": "fp32", "checkpoint_bytes": 40,
                            "fp32_bytes": 40, "fp32_peak_estimate": 56,
                            "stream_peak_estimate": 20, "stream_fits": True,
                            "machine_bytes": 100, "budget": 0.5, "budget_bytes": 50,
                            "streaming": False, "reference": "FP32", "architecture": "L"},
                 "reference": "FP32", "int4_faster_than_int8": False, "block_size_8_mixed": 128},
    "verdict": {"passed": True, "summary": "PASS; hint: h", "reference": "FP32", "hint": "h",
                "checks": [{"check": "speedup_ci_low", "value": 1.7, "limit": 0.0,
                            "passed": True, "detail": "d"}]},
    "rows": [_row("fp32", None, None, perplexity_rise_pct=0.0),
             _row("int8_wide", {"4": 0, "8": 11}, SPEED, sequences=8, stopped="clear pass"),
             _row("candidate", {"4": 0, "8": 11}, SPEED), _row("int4", {"4": 11, "8": 0}, None,
                                                            decode={})],
    "evaluation": {"sequences": 12, "tokens_scored": 130},
    "export": {"nodes": {"MatMul": 11}, "parity_vs_transformers": {"max_abs_diff": 0.001}},
    "timing": {"rounds": 6, "seconds": 1.2, "noisy": False, "one_at_a_time": False},
    "search": [
        {"trial": "all at 4 bits", "widths": {"4": 11, "8": 0, "float": 0}, "ranking": False,
         **SCORES, "sequences": 8, "stopped": "clear fail", "tokens_scored": 80, "passed": False},
        {"trial": "sensitivity proxy on 4 calibration sequences (most sensitive: layers.0)",
         "widths": None, "ranking": True, "sequences": 4, "passed": None,
         "sensitivity": {"layers.0": 0.5, "lm_head": 0.9}},
        {"trial": "stopped: cannot win", "widths": None, "ranking": True, "search_stopped": True,
         "passed": None}],
    "auto": {"winner": "int8_wide", "mixed": None, "scored_in_full": ["int8_wide"],
             "why": "int8_wide: the fastest of int8_wide (all pass every gate)",
             "candidates": {"int8_wide": {"passed": True, "speedup": 1.8, "summary": "PASS",
                                          "sequences": 12, "stopped": None},
                            "fp32": {"passed": True, "speedup": 1.0, "summary": "PASS",
                                     "sequences": 12, "stopped": None}}},
    "scoring": {"reference": {"sequences": 12, "tokens": 130, "top_k": 16,
                              "tail_mass_mean": 0.01},
                "candidate_scorings": 3, "stopped_early": 1, "sequences": 32, "tokens": 300,
                "full_passes": 2.31, "peak_rss": {"stage_mb": 400.0, "stage": "score_text[x]",
                                                  "pipeline_mb": 300.0}},
    "stages": [{"stage": "decoder_export", "reused": True}],
    "lineage": {"fp32": {"digest": "d", "stage": "decoder_export", "parent": None,
                         "path": "/c/d"}},
}


def test_the_body_read_back_writes_the_same_json():
    report = DecoderReport.read(copy.deepcopy(BODY))
    assert report.row(Role.candidate).speedup_vs_fp32.low == 1.7
    assert report.search[1].scores is None and report.search[1].proxy_sequences == 4
    assert report.rows[3].decode.tokens_per_s is None  # not timed: {} in, {} out
    assert json.dumps(to_json(report), sort_keys=True) == json.dumps(BODY, sort_keys=True)


def test_report_md_is_the_same_from_the_typed_report_and_from_the_updated_body():
    body = copy.deepcopy(BODY)
    md = markdown(DecoderReport.read(body))
    assert md == markdown(body)
    lines = md.splitlines()
    assert "| candidate | 1.25 | 0/11/0 | 301.200 | 0.70 | 96.00 | 0.0040 | 12 | 120.5 " \
           "| 8.10 / 9.90 | 12.00 | 1.80x (1.70-1.90) |" in lines
    assert "| int4 | 1.25 | 11/0/0 | 301.200 | 0.70 | 96.00 | 0.0040 | 12 | - | - / - | - " \
           "| 1.00x |" in lines
    assert "| int8_wide | 1.25 | 0/11/0 | 301.200 | 0.70 | 96.00 | 0.0040 | 8/12 (clear pass) " \
           "| 120.5 | 8.10 / 9.90 | 12.00 | 1.80x (1.70-1.90) |" in lines
    assert "| all at 4 bits | 11/0/0 | 0.70 | 96.00 | 0.0040 | 8/12 (clear fail) | False |" in lines
    assert lines[-2:] == [
        "| sensitivity proxy on 4 calibration sequences (most sensitive: layers.0) | - | - | - "
        "| - | 4 | ranking only |", "| stopped: cannot win | - | - | - | - | - | stopped |"]
    assert "| int8_wide | True | 1.80x | 12 (reference) |" in lines
    assert any(ln.startswith("Scoring: FP32 once on 12 sequences (130 tokens, top 16") for ln in lines)
    body.update(published="m/auto@1", status="interrupted",
                interrupted={"signal": "SIGTERM", "where": "while publishing", "exit_code": 143})
    md = markdown(body)
    assert md.rstrip().endswith("Published: m/auto@1")
    assert "**Interrupted while publishing (SIGTERM): published as m/auto@1 before it." in md


def test_the_evidence_reads_the_candidates_row():
    from types import SimpleNamespace as NS

    from pipeline.gate.verdict import Verdict

    report = DecoderReport.read(copy.deepcopy(BODY))
    out = NS(verdict=Verdict([]), evals={Role.candidate: NS(config={"data": "text"})})
    ev = evidence(out, report)
    assert ev["metrics"]["top1_agreement"] == 0.96 and ev["latency"] == DECODE
    assert ev["quantization"]["matmul_bits"] == {"4": 0, "8": 11}
    assert ev["evaluation_set"] == {"data": "text", "sequences": 12, "tokens_scored": 130}
    assert ev["lineage"] == BODY["lineage"] and ev["quantization"]["settings"] == BODY["settings"]
