"""The results page is rendered from bench.json: every target row, its section's time and CPU."""
import json

from benchmarks import results as bench_results


def _bench():
    return {
        "spine": {"measured_at": "2026-11-30 23:10 UTC",
                  "cpu": {"model": "AMD EPYC", "flags": ["avx2", "fma"], "logical_cores": 2},
                  "targets": {"int8 drop <= 0.3 points": [0.05, True],
                              "int8 >= 1.8x faster than fp32 at batch 8": [1.7012345, False],
                              "a | pipe in a name": [{"a": 0.123456, "b": [1, 2]}, True]}},
        "load": {"measured_at": "2026-11-30 23:20 UTC", "cpu": {"model": "Intel Xeon"},
                 "error": "RuntimeError: the pipeline wrote no report (exit 3)", "trace": "..."},
    }


def test_every_target_is_a_row_with_its_value_and_verdict():
    page = bench_results.render(_bench())
    assert "| int8 drop <= 0.3 points | 0.05 | yes |" in page
    assert "| int8 >= 1.8x faster than fp32 at batch 8 | 1.7 | **no** |" in page
    assert "a \\| pipe in a name" in page  # table cells stay one cell
    assert '{"a": 0.1235, "b": [1, 2]}' in page


def test_each_section_names_its_time_and_cpu_and_a_failed_one_says_so():
    page = bench_results.render(_bench())
    spine, load = page.split("## spine")[1].split("## load")
    assert "2026-11-30 23:10 UTC" in spine and "AMD EPYC" in spine and "avx2, fma" in spine
    assert "Intel Xeon" in load and "the pipeline wrote no report" in load
    assert "do not edit by hand" in page


def test_cli_writes_the_page_and_refuses_a_missing_file(tmp_path, capsys):
    src, dst = tmp_path / "bench.json", tmp_path / "docs" / "results.md"
    assert bench_results.main([str(src), str(dst)]) == 3
    assert "no such file" in capsys.readouterr().err and not dst.exists()
    src.write_text(json.dumps(_bench()))
    assert bench_results.main([str(src), str(dst)]) == 0
    assert dst.read_text() == bench_results.render(_bench(), "bench.json")
    assert [p.name for p in dst.parent.iterdir()] == ["results.md"]  # no temp file left


def test_the_byo_section_gets_its_side_by_side_table():
    sp = {"median": 1.5, "ci95": [1.4, 1.6]}
    acc = {"sequence_accuracy": 90.0, "cer": 2.0}
    run = {"verdict": "FAIL: 0.98x vs fp32", "accuracy": {"fp32": acc, "fp16": acc, "candidate": acc}}
    roles = ["fp32", "file as given", "ort_default_int8", "int8", "mixed", "int8 (A/A copy)"]
    speedup = {f"{r} vs fp32": sp for r in roles[1:5]}
    speedup |= {"int8 vs ort_default_int8": sp, "mixed vs ort_default_int8": sp}
    byo = {"measured_at": "2026-12-01 04:44 UTC", "cpu": {"model": "AMD EPYC"},
           "runs": {"int8": run, "mixed": run}, "ort_default": {"accuracy": acc},
           "timing": {b: {"p50_ms": {r: 2.0 for r in roles}, "speedup": speedup} for b in ("1", "8")},
           "targets": {"int8 batch 8: not slower than FP32 (speedup, CI)": [sp, True]}}
    page = bench_results.render({"byo": byo})
    assert "| pipeline quant=int8 (gate FAIL) | 90.00 | 2.00 | 2.00 | 2.00 | 1.50 [1.40, 1.60]" in page
    assert "| onnxruntime default quantize_static | 90.00 | 2.00 |" in page
    assert page.index("| model | sequence accuracy %") < page.index("| target | measured | met |")


def test_the_zoo_section_gets_one_row_per_model_from_each_entry():
    sp = {"median": 1.25, "ci95": [1.1, 1.4]}
    row = {"model": "ddddocr common.onnx", "metric": "sequence accuracy %", "parity_percent": 99.5,
           "verdict": {"int8": "FAIL: accuracy", "auto": "PASS | fp32"},
           "accuracy": {"fp32": 88.0, "int8": 80.5, "auto": 88.0},
           "speedup": {"int8 vs FP32 b8": sp}}
    enc = {"model": "mpnet", "metric": "cosine", "parity_percent": None,
           "verdict": {"int8": "PASS"},
           "accuracy": {"fp32": 1.0, "int8": 0.99263, "ORT quantize_dynamic": 0.8668},
           "speedup": {"int8 vs ORT quantize_dynamic b8": sp}}
    zoo = {"measured_at": "2026-12-01 13:00 UTC", "cpu": {"model": "Intel Xeon"},
           "entries": {"ddddocr": {"summary": [row]}, "mpnet": {"summary": [enc]},
                       "broken": {"error": "RuntimeError: x"}},
           "targets": {"ddddocr: x": [1.0, True]}}
    page = bench_results.render({"zoo": zoo})
    # one line per model and quant mode; an accuracy in points with 2 decimals, a cosine with 4
    assert ("| ddddocr common.onnx | sequence accuracy % | 99.50 | int8 | FAIL: accuracy | 88.00 "
            "| 80.50 | — | 1.25x [1.10, 1.40] at b8 | — |") in page
    assert "| ddddocr common.onnx | sequence accuracy % | 99.50 | auto | PASS \\| fp32 | 88.00 | 88.00 |" in page
    assert ("| mpnet | cosine | — | int8 | PASS | 1.0000 | 0.9926 | ORT quantize_dynamic: 0.8668 | "
            "— | ORT quantize_dynamic b8: 1.25x [1.10, 1.40] |") in page
    assert page.index("| model | metric |") < page.index("| target | measured | met |")
