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
    assert "| int8 drop <= 0.3 points | 0.05 points | yes |" in page
    assert "| int8 >= 1.8x faster than fp32 at batch 8 | 1.70x | **no** |" in page
    assert "a \\| pipe in a name" in page  # table cells stay one cell
    assert "| a \\| pipe in a name | a 0.123; b (1, 2) | yes |" in page  # never JSON


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
    assert ("| pipeline quant=int8 (gate FAIL) | 90.00 % | 2.00 % | 2.00 ms | 2.00 ms "
            "| 1.50x (CI 1.40-1.60)") in page
    assert "| onnxruntime default quantize_static | 90.00 % | 2.00 % |" in page
    assert page.index("| model | sequence accuracy") < page.index("| target | measured | met |")


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
    assert ("| ddddocr common.onnx | sequence accuracy % | 99.50 % | int8 | FAIL: accuracy | 88.00 "
            "| 80.50 | — | 1.25x (CI 1.10-1.40) at b8 | — |") in page
    assert "| ddddocr common.onnx | sequence accuracy % | 99.50 % | auto | PASS \\| fp32 | 88.00 | 88.00 |" in page
    assert ("| mpnet | cosine | — | int8 | PASS | 1.0000 | 0.9926 | ORT quantize_dynamic: 0.8668 | "
            "— | ORT quantize_dynamic b8: 1.25x (CI 1.10-1.40) |") in page
    assert page.index("| model | metric |") < page.index("| target | measured | met |")


def _cells(page: str) -> list[str]:
    return [c for line in page.splitlines() if line.startswith("|") for c in line.split(" | ")]


def test_the_page_of_the_committed_bench_json_prints_no_json():
    """Every value of every section, whatever its shape, reads as text: no braces or brackets
    of a JSON structure in any table cell."""
    from tests.conftest import ROOT

    page = bench_results.render(json.loads((ROOT / "bench.json").read_text()))
    cells = _cells(page)
    assert len(cells) > 100
    assert not [c for c in cells if "{" in c or "}" in c or "[" in c], page


def test_a_section_of_a_shape_never_seen_reads_as_named_values():
    """A section added tomorrow (say, an LLM's generation numbers) with nested dicts and lists
    renders without braces: keys as words, units from their names."""
    llm = {"measured_at": "2026-12-01 16:00 UTC", "cpu": {"model": "Intel Xeon"},
           "targets": {
               "decode tokens per second, int4 vs fp32": [{"int4": {"tokens_per_s": 41.5,
                                                                    "ttft_ms": 812.25},
                                                           "fp32": {"tokens_per_s": 12.0}}, True],
               "int4 faster than fp32 at decode": [{"median": 3.4567, "ci95": [3.2, 3.61]}, True],
               "rss per layer": [[[1, 2.5], [3, None]], None], "nothing": [{}, None]}}
    page = bench_results.render({"llm": llm})
    assert ("| decode tokens per second, int4 vs fp32 | int4 (tokens per s 41.50/s, ttft ms "
            "812.2 ms); fp32 (tokens per s 12.00/s) | yes |") in page
    assert "| int4 faster than fp32 at decode | 3.46x (CI 3.20-3.61) | yes |" in page
    assert "| rss per layer | 1 / 2.50, 3 / — | — |" in page
    assert "| nothing | — | — |" in page
    assert not [c for c in _cells(page) if "{" in c or "[" in c]


def test_the_decoder_side_by_side_and_real_rows_name_their_code_and_cpu():
    """The llm section's side-by-side run (benchmarks.decoder_side_by_side) renders both commits
    with their times, verdicts and picks; its targets follow the ratio and the picks; a real
    decoder's row names the CPU's class."""
    from benchmarks import decoder_side_by_side as sbs
    from benchmarks.llm import real_table

    def side(commit, seconds, winner):
        return {"commit": commit, "seconds": seconds, "returncode": 0, "verdict": "PASS",
                "winner": winner, "load_average_1min": [0.1, 1.5]}

    rec = {"model": "SmolLM2", "now": side("abc1234", 160.0, "int8_wide"),
           "base": side("9f62cd7", 560.0, "int8_wide"), "ratio": round(160 / 560, 3),
           "same_pick": True, "same_verdict": True}
    page = bench_results.render({"llm": {"side_by_side": rec, "targets": sbs.targets(rec)}})
    assert "| 9f62cd7 | 560.0 s | 0.1, 1.5 | PASS | int8_wide |" in page
    assert "| abc1234 | 160.0 s |" in page and "Ratio of the wall times: 0.286." in page
    assert all(met for _, met in sbs.targets(rec).values())
    slower = {**rec, "ratio": 0.5, "same_pick": False}
    assert not any(met for _, met in sbs.targets(slower).values())
    row = real_table({"real_decoder_x": {"params_b": 0.6, "seconds": 800.0, "cpu": {
        "model": "AMD EPYC", "flags": ["avx2"], "logical_cores": 2}}})
    assert "AMD EPYC (AVX2, 2 cores)" in "".join(row)
